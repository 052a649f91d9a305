"""Agent environments at the seed chapter's scale, in the simulator (through `rlsched.core.envs`):
each placement policy's admitted throughput, task time, memory and the resource that binds.

    .venv/bin/python scripts/bench_env_sim.py [--episodes 3000] [--rate 10] [--hit-rate 1.0]

Workload (SPEC section 9): tasks of three rounds, a 9 s model call then a 1 s tool call, each tool
call in a 2 GiB environment prepared in 2 s, arriving at `--rate` a second on 48 cores, 320 model
slots and 358 GiB with one 2 GiB template kept; an admitted episode reserves 0.9 of a model slot (its
model calls' share of a 30 s task); prewarm's lead equals the preparation. The bound each policy is
compared with is the chapter's: by Little's law, resident memory admits 178 environments, 178 / 30 s
= 5.93 tasks/s; releasing after each call needs 180 GiB at 10 tasks/s, so all are admitted.
Throughput is measured over the middle half of the completions. Writes
bench_results/bench_env_sim.json.
"""

from __future__ import annotations

from dataclasses import asdict

from _bench import parser, table, write

from rlsched.core.envs import EnvParams, EnvType
from rlsched.policy.environments import Capacity, EnvPolicy, Reservation, steady_state
from rlsched.sim.envs import EpisodeSpec, simulate_envs

CLUSTER = Capacity(cores=48, slots=320, memory_gib=358, template_gib=2)


def main() -> None:
    ap = parser(__doc__, "bench_env_sim")
    ap.add_argument("--episodes", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--hit-rate", type=float, default=1.0, help="prewarm's tool-type prediction")
    args = ap.parse_args()
    types = {"tool": EnvType(memory_gib=2, prepare_s=2)}
    bound = steady_state(args.rate, 30, Reservation(memory_gib=2, slots=0.9), CLUSTER)
    runs = []
    for policy in EnvPolicy:
        params = EnvParams(policy, types, CLUSTER, lead_s=2, slots_per_episode=0.9)
        runs.append(simulate_envs(params, EpisodeSpec(), args.episodes, args.rate, args.hit_rate, args.seed))
    rows = [
        [str(r.policy), f"{r.throughput:.2f}", f"{r.throughput / args.rate:.2f}", r.binding or "-",
         f"{r.task_s:.1f}", f"{r.run_s:.1f}", f"{r.wait_per_call_s:.2f}", f"{r.gib_s_per_task:.1f}",
         f"{r.mean_gib:.0f}", f"{r.peak_gib:.0f}", f"{r.creations_per_s:.1f}"]
        for r in runs
    ]  # fmt: skip
    columns = ["policy", "tasks/s", "of offered", "binds", "task s (queued)", "run s", "wait/call s",
               "GiB-s/task", "mean GiB", "peak GiB", "creations/s"]  # fmt: skip
    table(f"environments at {args.rate:g} tasks/s on 48 cores, 320 slots, 358 GiB", columns, rows, width=160)
    write(
        args.json,
        {
            "workload": "SPEC section 9: 3 x (9 s model + 1 s tool), 2 GiB environments prepared in 2 s",
            "seed": args.seed,
            "rate": args.rate,
            "bound": {"resident_max_rate": 178 / 30, "littles_law": asdict(bound)},
            "runs": [asdict(r) | {"policy": str(r.policy)} for r in runs],
        },
    )


if __name__ == "__main__":
    main()
