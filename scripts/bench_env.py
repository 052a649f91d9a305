"""Agent environments on Ray, under each placement policy: real sandboxed environments that hold
memory while idle and take about a model turn to prepare, scheduled by the environment core
(`rlsched/bench/envs.py`, `rlsched/core/envs.py`).

    .venv/bin/python scripts/bench_env.py [--episodes 12] [--concurrency 4] [--turn-s 1.5]

Workload: `--episodes` episodes, `--concurrency` at a time (the model slots), of three rounds: a
model turn of `--turn-s` (+-20%, a timed stand-in), then a tool call in an environment of one of two
kinds. `search` holds 256 MiB of data and fetches its image in 0.8 s; `shell` holds 128 MiB and
fetches in 0.5 s; both then allocate and touch their data and write a workspace (8 and 4 MiB) in a
real sandbox, and a call reads the data and takes 0.2 s. An episode's first tool kind is drawn
evenly and each next one is the same kind with probability `--stay` (0.8); `prewarm` predicts the
kind the episode used last (the first from the task), so its hit rate is measured, not set, and it
starts preparing that kind its own measured preparation time (L = P) before the turn's estimated end
(the mean turn so far). An episode may call either kind, so `resident` prepares both at admission.

Reported per policy (medians over episodes): episode time from admission to end, exposed
preparation wait per tool call, memory-seconds per episode as the core reserves them and as the
environments' cgroups measured them, peak environments at once, and episodes per second. The bound
each is compared with is the chapter's: a resident episode's time is its turns and tool calls (the
first preparation overlaps the first turn); prewarm's wait per call is `P - h min(P, L)`. The goal:
prewarm within 10% of resident's episode time at less than half its memory-seconds. After the runs,
the host holds no environment and no sandbox directory is left. Writes bench_results/bench_env.json.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from statistics import fmean
from typing import Any

import ray
from _bench import parser, table, write

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlsched.bench.envs import EnvDriver, EnvHost, EnvKind, plan_episodes
from rlsched.core.envs import EnvParams, EnvType
from rlsched.policy.environments import Capacity, EnvPolicy, prewarm_wait

KINDS = {
    "search": EnvKind(memory_mb=256, fetch_s=0.8, workspace_mb=8, tool_s=0.2),
    "shell": EnvKind(memory_mb=128, fetch_s=0.5, workspace_mb=4, tool_s=0.2),
}


def measure_preparations(host: Any, repeats: int = 3) -> dict[str, float]:
    """Each kind's preparation, measured on the host (median of `repeats`)."""
    out = {}
    for kind in KINDS:
        times: list[float] = []
        for k in range(repeats):
            name = f"probe-{kind}-{k}"
            seconds: float = ray.get(host.prepare.remote(name, kind, "probe"))
            times.append(seconds)
            ray.get(host.release.remote(name, False))
        out[kind] = statistics.median(times)
    return out


def main() -> None:
    ap = parser(__doc__, "bench_env")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turn-s", type=float, default=1.5)
    ap.add_argument("--stay", type=float, default=0.8)
    args = ap.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    host = EnvHost.remote(KINDS)
    prep = measure_preparations(host)
    types = {k: EnvType(memory_gib=v.memory_mb / 1024, prepare_s=prep[k]) for k, v in KINDS.items()}
    capacity = Capacity(cores=2, slots=args.concurrency, memory_gib=64, template_gib=0)
    plans = plan_episodes(args.episodes, list(KINDS), args.rounds, args.turn_s, args.stay, 0.2, args.seed)
    runs, measured = {}, {}
    for policy in EnvPolicy:
        before = ray.get(host.report.remote())["measured_gib_s"] or 0.0
        driver = EnvDriver(EnvParams(policy, types, capacity, lead_s=None), host, args.turn_s)
        runs[policy] = driver.run(plans)
        after = ray.get(host.report.remote())["measured_gib_s"]
        measured[policy] = None if after is None else (after - before) / args.episodes
    report = ray.get(host.report.remote())
    ray.get(host.shutdown.remote())
    ray.shutdown()

    resident = runs[EnvPolicy.RESIDENT]
    base_s = statistics.median(resident.run_s)
    base_gib_s = resident.reserved_gib_s / resident.episodes
    rows: list[list[object]] = []
    results: list[dict[str, Any]] = []
    for policy, r in runs.items():
        episode_s = statistics.median(r.run_s)
        gib_s = r.reserved_gib_s / r.episodes
        hit = r.predictions_right / max(r.predictions, 1)
        result = {
            "policy": str(policy),
            "episode_s": episode_s,
            "vs_resident_time": episode_s / base_s,
            "wait_per_call_s": statistics.fmean(r.waits),
            "reserved_gib_s_per_episode": gib_s,
            "vs_resident_memory": gib_s / base_gib_s,
            "measured_gib_s_per_episode": measured[policy],
            "peak_envs": r.peak_envs,
            "episodes_per_s": r.episodes / r.wall_s,
            "prediction_hit_rate": hit,
            "prepared": r.prepared,
            "cancelled": r.cancelled,
            "run": asdict(r),
        }
        results.append(result)
        m = measured[policy]
        rows.append(
            [str(policy), f"{episode_s:.2f}", f"{episode_s / base_s:.2f}x", f"{fmean(r.waits):.2f}",
             f"{gib_s:.2f}", f"{gib_s / base_gib_s:.2f}x", "-" if m is None else f"{m:.2f}",
             r.peak_envs, f"{result['episodes_per_s']:.2f}", f"{hit:.2f}", r.prepared, r.cancelled]
        )  # fmt: skip
    turn_total = statistics.median(sum(p.turns_s) for p in plans)
    tools_total = args.rounds * statistics.fmean(k.tool_s for k in KINDS.values())
    hit = float(results[-1]["prediction_hit_rate"])
    bound = {
        "resident_episode_s": turn_total + tools_total,
        "prewarm_wait_per_call_s": fmean(prewarm_wait(p, hit, p).expected_wait_s for p in prep.values()),
        "goal": "prewarm within 10% of resident's episode time at less than half its memory-seconds",
    }
    title = (
        f"{args.episodes} episodes x {args.rounds} rounds, {args.concurrency} at once; preparation "
        + ", ".join(f"{k} {v:.2f} s" for k, v in prep.items())
    )
    columns = ["policy", "episode s", "vs resident", "wait/call s", "GiB-s/episode (reserved)", "vs resident",
               "GiB-s (cgroup)", "peak envs", "episodes/s", "hit rate", "prepared", "cancelled"]  # fmt: skip
    table(title, columns, rows, width=190)
    prewarm = results[-1]
    met = prewarm["vs_resident_time"] <= 1.10 and prewarm["vs_resident_memory"] < 0.5
    print(
        f"bound: resident episode {bound['resident_episode_s']:.2f} s; prewarm wait per call "
        f"P - h min(P, L) = {bound['prewarm_wait_per_call_s']:.2f} s at h = {hit:.2f}. Goal "
        f"{'met' if met else 'NOT met'}: prewarm at {prewarm['vs_resident_time']:.2f}x the time and "
        f"{prewarm['vs_resident_memory']:.2f}x the memory-seconds. Left after the runs: "
        f"{len(report['live'])} environments, {len(report['sandbox_dirs'])} of the "
        f"{report['created']} sandbox directories made."
    )
    write(
        args.json,
        {
            "workload": vars(args)
            | {"kinds": {k: asdict(v) for k, v in KINDS.items()}, "json": str(args.json)},
            "seed": args.seed,
            "preparation_s": prep,
            "lead_s": "each kind's own preparation (L = P)",
            "policies": results,
            "bound": bound,
            "goal_met": met,
            "leftovers": {"environments": report["live"], "sandbox_dirs": report["sandbox_dirs"]},
        },
    )


if __name__ == "__main__":
    main()
