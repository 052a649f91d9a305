"""`rlsched calc NAME ...`: the analytic models of rlsched.policy on numbers you give.

Each calculation prints the inputs it used, the result and the formula's name (or one JSON object
with `--json`). Lists are comma-separated and `value*count` repeats a value: `--arrivals 0*80`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rlsched.errors import UserError
from rlsched.policy import iteration as iteration_model
from rlsched.policy import queueing


def parse_list(text: str, name: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        value, _, count = part.strip().partition("*")
        try:
            values.extend([float(value)] * (int(count) if count else 1))
        except ValueError:
            raise UserError(
                f"--{name} {text!r}: expected numbers separated by commas, e.g. 0,6,12 or 0*80"
            ) from None
    return values


def _speedups(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        phase, sep, factor = item.partition("=")
        try:
            out[phase] = float(factor)
        except ValueError:
            sep = ""
        if not sep:
            raise UserError(f"--speedup {item!r}: expected PHASE=FACTOR, e.g. generate=2")
    return out


def calc_iteration(args: argparse.Namespace) -> dict[str, Any]:
    phases = {p: getattr(args, p) for p in iteration_model.PHASES}
    return asdict(iteration_model.iteration(phases, _speedups(args.speedup)))


def calc_queue(args: argparse.Namespace) -> dict[str, Any]:
    arrivals = parse_list(args.arrivals, "arrivals")
    services = parse_list(args.service, "service")
    if len(services) == 1:
        services = services * len(arrivals)
    result = queueing.fcfs(arrivals, services, args.workers)
    return {"inputs": {"arrivals": arrivals, "service": services, "workers": args.workers}, **asdict(result)}


def calc_batch(args: argparse.Namespace) -> dict[str, Any]:
    arrivals = parse_list(args.arrivals, "arrivals")
    cpu = parse_list(args.cpu, "cpu")
    gpu = parse_list(args.gpu, "gpu") if args.gpu else None
    result = queueing.batch(arrivals, cpu, gpu, args.workers)
    return {
        "inputs": {"arrivals": arrivals, "cpu": cpu, "gpu": gpu, "workers": args.workers},
        "completion": result.completion,
        "lower_bound": result.lower_bound,
        "starts": result.queue.starts,
        "ends": result.queue.ends,
        "formula": result.formula,
    }


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list | tuple):
        shown = ", ".join(_fmt(v) for v in x[:12])
        return f"[{shown}{', ...' if len(x) > 12 else ''}] ({len(x)})" if len(x) > 12 else f"[{shown}]"
    if isinstance(x, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in x.items())
    return str(x)


def render(name: str, result: dict[str, Any]) -> str:
    lines = [f"calc {name}"]
    for key, value in result.items():
        if key != "formula":
            lines.append(f"  {key}: {_fmt(value)}")
    lines.append(f"  formula: {result['formula']}")
    return "\n".join(lines)


CALCS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "iteration": calc_iteration,
    "queue": calc_queue,
    "batch": calc_batch,
}


def add_parsers(sub: Any) -> None:
    it = sub.add_parser("iteration", help="sequential T_iter, Amdahl speed-up and its cap")
    for phase in iteration_model.PHASES:
        it.add_argument(f"--{phase}", type=float, required=True, metavar="S", help=f"seconds of {phase}")
    it.add_argument("--speedup", action="append", default=[], metavar="PHASE=X", help="e.g. generate=2")
    q = sub.add_parser("queue", help="FCFS waits and completion on W workers")
    q.add_argument("--arrivals", required=True, help="arrival times, e.g. 0*10 or 0,1,2")
    q.add_argument("--service", required=True, help="service time(s): one for all, or one per job")
    q.add_argument("--workers", type=int, required=True)
    b = sub.add_parser("batch", help="a verification batch's completion and its lower bound")
    b.add_argument("--arrivals", required=True)
    b.add_argument("--cpu", required=True, help="CPU (compile) seconds per sample")
    b.add_argument("--gpu", help="GPU (execution) seconds per sample (default 0)")
    b.add_argument("--workers", type=int, required=True)
    for p in (it, q, b):
        p.add_argument("--json", action="store_true", help="print one JSON object")


def run(name: str, args: argparse.Namespace) -> str:
    try:
        result = CALCS[name](args)
    except ValueError as err:
        raise UserError(f"calc {name}: {err}") from None
    return json.dumps({"calc": name, **result}) if args.json else render(name, result)
