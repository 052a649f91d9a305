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

from rlsched.calc_env import add_parser as add_env_parser
from rlsched.calc_env import calc_env
from rlsched.errors import UserError
from rlsched.policy import bandwidth, durability, elastic, queueing, resume
from rlsched.policy import iteration as iteration_model
from rlsched.policy import verify as verify_policy
from rlsched.policy.estimate import EstimatorParams, RemainingTime


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
    if args.staleness is None:
        if args.load or args.verify_exposed is not None:
            raise UserError("--load and --verify-exposed belong to the pipelined bound: add --staleness K")
        return asdict(iteration_model.iteration(phases, _speedups(args.speedup)))
    if args.speedup:
        raise UserError("--speedup is for the sequential iteration; leave it out with --staleness")
    exposed = args.verify if args.verify_exposed is None else args.verify_exposed
    bound = iteration_model.pipelined_bound(
        args.generate, exposed, args.update, args.publish, args.load, args.staleness
    )
    return asdict(bound)


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


def calc_remaining(args: argparse.Namespace) -> dict[str, Any]:
    if (args.samples is None) == (args.dist is None):
        raise UserError("calc remaining: give --samples LIST or --dist SPEC (one of them)")
    if args.samples is not None:
        values = parse_list(args.samples, "samples")
        source = f"{len(values)} samples"
    else:
        values = _draws(args.dist)
        source = f"{len(values):,} draws of {args.dist} (seed 0)"
    if args.elapsed < 0:
        raise ValueError("--elapsed must be non-negative")
    est = RemainingTime(EstimatorParams(window=len(values), min_observations=1))
    for v in values:
        est.observe("calc", "", v)
    return {
        "inputs": {"history": source, "elapsed": args.elapsed, "quantile": args.quantile},
        "remaining": est.remaining("calc", "", args.elapsed),
        "mean": est.remaining("calc", ""),
        f"remaining_q{args.quantile:g}": est.quantile("calc", "", args.quantile, args.elapsed),
        "formula": "E[S - e | S > e] = integral of S(t) from e on / S(e), S the Kaplan-Meier survival",
    }


def _draws(spec: str, n: int = 100_000) -> list[float]:
    import numpy as np
    import yaml
    from pydantic import TypeAdapter, ValidationError

    from rlsched.sim.dists import Distribution, draw

    try:
        dist = TypeAdapter(Distribution).validate_python(yaml.safe_load(spec))
    except (ValidationError, yaml.YAMLError) as err:
        first = str(err).splitlines()[-1 if isinstance(err, yaml.YAMLError) else 1].strip()
        raise UserError(
            f"calc remaining: --dist {spec!r} is not a distribution ({first}); "
            "e.g. --dist '{kind: pareto, scale: 1, shape: 1.5}'"
        ) from None
    return [float(x) for x in draw(dist, np.random.default_rng(0), n)]


def calc_latest_start(args: argparse.Namespace) -> dict[str, Any]:
    if args.need < 0 or args.prep < 0:
        raise ValueError("--need and --prep must be non-negative")
    start, prep_start = verify_policy.latest_start(args.completion, args.need, args.prep)
    return {
        "inputs": {"completion": args.completion, "need": args.need, "prep": args.prep},
        "latest_start": start,
        "latest_prep_start": prep_start,
        "formula": "latest start = completion - need; preparation starts prep earlier",
    }


def calc_deferral(args: argparse.Namespace) -> dict[str, Any]:
    if args.saved < 0 or args.group_devices < 0 or args.delay < 0:
        raise ValueError("--saved, --group-devices and --delay must be non-negative")
    net = verify_policy.deferral_net(args.saved, args.group_devices, args.delay)
    return {
        "inputs": {"saved": args.saved, "group_devices": args.group_devices, "delay": args.delay},
        "idle_cost": args.group_devices * args.delay,
        "net": net,
        "verdict": "defer" if net > 0 else "do not defer",
        "formula": "net device-seconds = saved - group devices x delay",
    }


def _per_receiver(text: str, flag: str, receivers: int, positive: bool = True) -> list[float]:
    rates = parse_list(text, flag)
    if len(rates) == 1:
        rates = rates * receivers
    if len(rates) != receivers or min(rates) < 0 or (positive and min(rates) == 0):
        kind = "positive" if positive else "non-negative"
        raise ValueError(f"--{flag} needs one {kind} rate, or one per receiver ({receivers}); got {text!r}")
    return rates


def calc_transfer(args: argparse.Namespace) -> dict[str, Any]:
    if args.bytes < 0 or args.receivers < 1 or args.egress_gbps <= 0:
        raise ValueError("--bytes must be non-negative, --receivers at least 1, --egress-gbps positive")
    ingress = _per_receiver(args.receiver_gbps, "receiver-gbps", args.receivers)
    egress, rates = args.egress_gbps * 1e9, [g * 1e9 for g in ingress]
    flows = [bandwidth.Flow(f"receiver-{i}", args.bytes, r) for i, r in enumerate(rates)]
    finish = bandwidth.finish_times(flows, egress)
    out: dict[str, Any] = {
        "inputs": {
            "bytes": args.bytes,
            "receivers": args.receivers,
            "egress_gbps": args.egress_gbps,
            "receiver_gbps": ingress,
        },
        "alone_s": [bandwidth.alone_s(args.bytes, r, egress) for r in rates],
        "finish_s": [finish[f.receiver] for f in flows],
        "all_s": max(finish.values()),
        "bound_s": bandwidth.all_receivers_bound(args.bytes, rates, egress),
        "shared_link_bytes": args.bytes * args.receivers,
        "formula": "max-min fair shares of the egress (progressive filling); "
        "T_all >= max(max_i S/r_i, N*S/E)",
    }
    if getattr(args, "relay", False):
        out |= _relayed(args, rates, egress)
    return out


def _relayed(args: argparse.Namespace, rates: list[float], egress: float) -> dict[str, Any]:
    """The same transfer with receivers relaying: the fastest forest of pipelined chains, against the
    peer-to-peer bound."""
    upload_text = args.upload_gbps if args.upload_gbps is not None else args.receiver_gbps
    uploads = _per_receiver(upload_text, "upload-gbps", args.receivers, positive=False)
    if max(uploads) == 0 and args.receivers > 1:
        raise ValueError(
            "--relay with every upload cap at 0: no receiver can pass anything on; give --upload-gbps "
            "a positive rate, or drop --relay"
        )
    ups = [u * 1e9 for u in uploads]
    plan = bandwidth.relay_plan(args.bytes, args.chunk_kb * 1024, rates, egress, ups)
    bound = bandwidth.p2p_bound(args.bytes, rates, egress, ups)
    return {
        "upload_gbps": uploads,
        "chunk_kb": args.chunk_kb,
        "relay_chains": [list(c) for c in plan.chains],
        "relay_finish_s": list(plan.finish_s),
        "relay_all_s": plan.all_s,
        "p2p_bound_s": bound,
        "relay_efficiency": bound / plan.all_s if plan.all_s > 0 else 1.0,
        "formula": "max-min fair shares of the egress (progressive filling); T_all >= max(max_i S/r_i, "
        "N*S/E); relayed: chains of store-and-forward chunks, T_all >= max(S/E, max_i S/r_i, "
        "N*S/(E + sum_i u_i)) (Kumar and Ross 2006)",
    }


def calc_window(args: argparse.Namespace) -> dict[str, Any]:
    lifetimes = parse_list(args.available, "available")
    out: dict[str, Any] = {
        "inputs": {"available": lifetimes, "prepare": args.prepare, "rate": args.rate},
        "usable_s": [elastic.usable_s(a, args.prepare) for a in lifetimes],
    }
    if args.rate is not None:
        out["tokens"] = [elastic.useful_tokens(a, args.prepare, args.rate) for a in lifetimes]
    return out | {"formula": "usable = max(L - T0, 0); tokens = usable x rate"}


def calc_breakeven(args: argparse.Namespace) -> dict[str, Any]:
    added = parse_list(args.added_cost, "added-cost")
    multiples = parse_list(args.throughput, "throughput")
    return {
        "inputs": {"base_cost": args.base_cost, "added_cost": added, "throughput": multiples},
        "total_cost": args.base_cost + sum(added),
        "breakeven_throughput": elastic.breakeven(args.base_cost, added),
        "relative_cost_per_work": [
            elastic.relative_cost_per_work(args.base_cost, added, x) for x in multiples
        ],
        "formula": "break-even = (C + sum C_i) / C; "
        "cost per work relative to the base = break-even / throughput",
    }


def calc_resume(args: argparse.Namespace) -> dict[str, Any]:
    lengths = [int(x) for x in parse_list(args.saved, "saved")]
    finished = {int(x) for x in parse_list(args.finished, "finished")} if args.finished else set()
    done = {f"member-{i}" for i in finished}
    saved = {f"member-{i}": n for i, n in enumerate(lengths)}
    cut = resume.truncate_group(saved, done)
    reused, regenerated = resume.reuse(saved, cut)
    out: dict[str, Any] = {
        "inputs": {"saved": lengths, "finished": sorted(done), "prompt": args.prompt},
        "continue_from": [cut.get(m, "finished") for m in saved],
        "reused_tokens": reused,
        "regenerated_tokens": regenerated,
    }
    if args.prefill_tps is not None and args.decode_tps is not None:
        cost = resume.ResumeCost(args.prefill_tps, args.decode_tps, args.setup_s)
        choices = {m: resume.resume_or_restart(args.prompt, n, cost) for m, n in cut.items()}
        out["choice"] = [str(c.choice) for c in choices.values()]
        out["resume_s"] = [c.resume_s for c in choices.values()]
        out["restart_s"] = [c.restart_s for c in choices.values()]
    return out | {
        "formula": "unfinished members continue from the shortest saved among them; resume if "
        "setup + (prompt + saved)/prefill < prompt/prefill + saved/decode"
    }


def calc_commit(args: argparse.Namespace) -> dict[str, Any]:
    rows = [
        durability.commit_cost(args.requests, args.request_s, args.commit_s, args.per_record_s, int(k))
        for k in parse_list(args.every, "every")
    ]
    return {
        "inputs": {
            "requests": args.requests,
            "request_s": args.request_s,
            "commit_s": args.commit_s,
            "per_record_s": args.per_record_s,
        },
        "every": [r.every for r in rows],
        "commits": [r.commits for r in rows],
        "overhead_s": [r.overhead_s for r in rows],
        "total_s": [r.total_s for r in rows],
        "redo_max_s": [r.redo_max_s for r in rows],
        "formula": "commits = ceil(n / k); overhead = commits * fixed + n * per_record; "
        "total = n * t + overhead; redo at most k * t (the requests since the last commit)",
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
    "remaining": calc_remaining,
    "latest-start": calc_latest_start,
    "deferral": calc_deferral,
    "transfer": calc_transfer,
    "window": calc_window,
    "breakeven": calc_breakeven,
    "resume": calc_resume,
    "commit": calc_commit,
    "env": calc_env,
}


def add_parsers(sub: Any) -> None:
    it = sub.add_parser("iteration", help="sequential T_iter, Amdahl speed-up and its cap")
    for phase in iteration_model.PHASES:
        it.add_argument(f"--{phase}", type=float, required=True, metavar="S", help=f"seconds of {phase}")
    it.add_argument("--speedup", action="append", default=[], metavar="PHASE=X", help="e.g. generate=2")
    it.add_argument(
        "--staleness",
        type=int,
        metavar="K",
        help="the pipelined bound when samples may be K versions stale (SPEC section 1's third lever)",
    )
    it.add_argument("--load", type=float, default=0.0, metavar="S", help="with --staleness: seconds to load")
    it.add_argument(
        "--verify-exposed",
        type=float,
        metavar="S",
        help="with --staleness: verification left after generation ends (default: --verify)",
    )
    q = sub.add_parser("queue", help="FCFS waits and completion on W workers")
    q.add_argument("--arrivals", required=True, help="arrival times, e.g. 0*10 or 0,1,2")
    q.add_argument("--service", required=True, help="service time(s): one for all, or one per job")
    q.add_argument("--workers", type=int, required=True)
    b = sub.add_parser("batch", help="a verification batch's completion and its lower bound")
    b.add_argument("--arrivals", required=True)
    b.add_argument("--cpu", required=True, help="CPU (compile) seconds per sample")
    b.add_argument("--gpu", help="GPU (execution) seconds per sample (default 0)")
    b.add_argument("--workers", type=int, required=True)
    r = sub.add_parser("remaining", help="a verification's expected remaining time given its elapsed time")
    r.add_argument("--samples", help="observed durations, e.g. 1*9,100")
    r.add_argument("--dist", help="or a distribution, e.g. '{kind: lognormal, mean: 2, sigma: 1.5}'")
    r.add_argument("--elapsed", type=float, default=0.0, metavar="S", help="seconds already run (default 0)")
    r.add_argument(
        "--quantile", type=float, default=0.9, metavar="P", help="also this quantile (default 0.9)"
    )
    ls = sub.add_parser("latest-start", help="when work must start (and be prepared) to end by a completion")
    ls.add_argument("--completion", type=float, required=True, metavar="T", help="when the batch ends")
    ls.add_argument("--need", type=float, required=True, metavar="S", help="seconds the work needs")
    ls.add_argument("--prep", type=float, default=0.0, metavar="S", help="seconds of preparation before it")
    d = sub.add_parser("deferral", help="is deferring verification work worth the training group's idling")
    d.add_argument("--saved", type=float, required=True, metavar="DEVICE_S", help="device-seconds saved")
    d.add_argument("--group-devices", type=float, required=True, metavar="N", help="devices of the group")
    d.add_argument("--delay", type=float, required=True, metavar="S", help="extra seconds the group waits")
    t = sub.add_parser("transfer", help="weights to N receivers over a shared egress: finish times, bound")
    t.add_argument("--bytes", type=float, required=True, metavar="B", help="weight bytes each receiver gets")
    t.add_argument("--receivers", type=int, required=True, metavar="N")
    t.add_argument("--egress-gbps", type=float, required=True, metavar="E", help="the sender's link, Gbit/s")
    t.add_argument(
        "--receiver-gbps",
        required=True,
        metavar="R",
        help="each receiver's link, Gbit/s: one, or one per receiver",
    )
    t.add_argument("--relay", action="store_true", help="receivers pass on what they hold (pipelined chains)")
    t.add_argument(
        "--upload-gbps",
        metavar="U",
        help="with --relay: each receiver's upload cap, Gbit/s: one, or one per receiver (default: R)",
    )
    t.add_argument(
        "--chunk-kb", type=int, default=4096, metavar="KB", help="with --relay: bytes a hop forwards at once"
    )
    w = sub.add_parser("window", help="a transient instance's usable seconds (and tokens) in its window")
    w.add_argument("--available", required=True, metavar="L", help="seconds available: one, or a list")
    w.add_argument("--prepare", type=float, required=True, metavar="T0", help="seconds to prepare")
    w.add_argument("--rate", type=float, metavar="R", help="useful tokens per second (optional)")
    be = sub.add_parser("breakeven", help="throughput needed before added instances lower cost per work")
    be.add_argument("--base-cost", type=float, required=True, metavar="C", help="cost per hour of the base")
    be.add_argument("--added-cost", required=True, metavar="C1,C2,...", help="each added instance's cost")
    be.add_argument(
        "--throughput", default="1.2,1.6", metavar="X,...", help="multiples to price (default 1.2,1.6)"
    )
    rs = sub.add_parser("resume", help="a reclaimed group's resume lengths; resume or restart each")
    rs.add_argument("--saved", required=True, metavar="N1,N2,...", help="tokens saved per group member")
    rs.add_argument("--finished", metavar="I,...", help="indices of members that had finished")
    rs.add_argument("--prompt", type=int, default=0, metavar="T", help="prompt tokens (default 0)")
    rs.add_argument("--prefill-tps", type=float, metavar="R", help="prefill tokens per second")
    rs.add_argument("--decode-tps", type=float, metavar="R", help="decode tokens per second")
    rs.add_argument("--setup-s", type=float, default=0.0, metavar="S", help="fixed cost of resuming")
    cm = sub.add_parser(
        "commit", help="what committing every k requests costs, and the most work a crash redoes"
    )
    cm.add_argument("--requests", type=int, required=True, metavar="N", help="sequential requests")
    cm.add_argument("--request-s", type=float, required=True, metavar="S", help="seconds per request")
    cm.add_argument("--commit-s", type=float, required=True, metavar="S", help="fixed seconds per commit")
    cm.add_argument(
        "--per-record-s", type=float, default=0.0, metavar="S", help="seconds per record committed"
    )
    cm.add_argument("--every", default="1", metavar="K1,K2,...", help="requests per commit (default 1)")
    for p in (it, q, b, r, ls, d, t, w, be, rs, cm, *add_env_parser(sub)):
        p.add_argument("--json", action="store_true", help="print one JSON object")


def run(name: str, args: argparse.Namespace) -> str:
    try:
        result = CALCS[name](args)
    except ValueError as err:
        raise UserError(f"calc {name}: {err}") from None
    if name == "env":
        name = f"env {args.env_model}"
    return json.dumps({"calc": name, **result}) if args.json else render(name, result)
