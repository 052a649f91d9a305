"""What a training rank holds, replicated against FSDP2-sharded, and what sharding costs per step.

    .venv/bin/python scripts/bench_fsdp.py [--checkpoint models/smollm2-135m-instruct]
        [--ranks 1 2 4] [--steps 20] [--rows 8] [--prompt 32] [--completion 32]

For each strategy (replicate, fsdp) and each rank count N, N processes join a gloo group on this
machine and run rlsched's own rank (`rlsched.rl.rank.RankTrainer`: the sharding, the GRPO update,
the pass agreement) on one fixed batch of `rows` random sequences, each rank its share. Figures:

- held: rank 0's parameters, gradients and AdamW state, counted by tensor (its local shards under
  fsdp), and its ratio to the replica at the same N. The bound is 1/N of the replica (a perfect
  shard); the goal is fsdp at N = 2 at most 0.55x.
- peak RSS: the largest of the ranks' process peaks (`ru_maxrss`), loading included. Activations,
  the 49,152-way logits and the library's own memory do not shard, so it falls less than held.
- step s: the median step time after the first (warm-up) step, all ranks on this machine's cores
  (`--threads` in all, split between the ranks).
- the loss curve: at N = 2, `--steps` steps of both strategies on the same batch (summed over
  ranks), and the largest difference between them.

Writes bench_results/bench_fsdp.json.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _bench import parser, table, write

from rlsched.config import GRPOConfig, TrainerConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.rl.rank import RankTrainer
from rlsched.rl.sharding import RANK_ENV, join_group
from rlsched.rl.update import TrainItem


def random_batch(rows: int, prompt: int, completion: int, vocab: int, seed: int) -> list[TrainItem]:
    """`rows` random sequences with random advantages and old log-probs near a fresh model's."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        p = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        t = torch.randint(0, vocab, (completion,), generator=gen).tolist()
        old = (-torch.rand(completion, generator=gen) * 3 - 8).tolist()
        out.append(TrainItem(tuple(p), tuple(t), tuple(old), float(torch.randn(1, generator=gen))))
    return out


def _rank(rank: int, world: int, address: str, job: dict[str, Any], queue: Any) -> None:
    torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    cfg = TrainerConfig(ranks=world, strategy=job["strategy"], micro_batch_tokens=job["micro_batch_tokens"])
    join_group(address, rank, world, cfg.collective_timeout_s, torch.device("cpu"))
    ckpt = load_checkpoint(Path(job["checkpoint"]))
    grpo = GRPOConfig(lr=job["lr"], warmup_steps=0)
    trainer = RankTrainer(rank, world, ckpt.model, ckpt.tokenizer.pad_token_id or 0, grpo, cfg)
    del ckpt
    items = random_batch(job["rows"], job["prompt"], job["completion"], job["vocab"], job["seed"])
    total = float(sum(len(i.token_ids) for i in items))
    losses, times = [], []
    for _ in range(job["steps"]):
        dist.barrier()
        start = time.perf_counter()
        losses.append(trainer.step(items[rank::world], total).loss)
        dist.barrier()
        times.append(time.perf_counter() - start)
    held = trainer.held()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put((rank, losses, times, held.params, held.grads, held.optimizer, peak))
    dist.destroy_process_group()


def run(strategy: str, world: int, job: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    spec = {**job, "strategy": strategy, "threads": max(1, job["threads"] // world)}
    os.environ.update(RANK_ENV)  # as the training group's actors run (glibc reads it at start)
    procs = [ctx.Process(target=_rank, args=(r, world, address, spec, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, *rest = queue.get(timeout=3600)
        got[rank] = rest
    for p in procs:
        p.join()
    losses = [sum(got[r][0][i] for r in range(world)) for i in range(job["steps"])]
    times = [max(got[r][1][i] for r in range(world)) for i in range(job["steps"])]
    params, grads, optim = got[0][2:5]
    return {
        "strategy": strategy,
        "ranks": world,
        "held_params": params,
        "held_grads": grads,
        "held_optimizer": optim,
        "held_total": params + grads + optim,
        "peak_rss": max(got[r][5] for r in range(world)),
        "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "losses": losses,
    }


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    ap = parser(__doc__, "bench_fsdp")
    ap.add_argument("--checkpoint", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=20, help="steps at N = 2 (the loss curve)")
    ap.add_argument("--memory-steps", type=int, default=3, help="steps at the other N")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--micro-batch-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--threads", type=int, default=2, help="threads in all, split between the ranks")
    args = ap.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        print(f"{args.checkpoint} not found: run `make model-smollm2`, or pass --checkpoint DIR")
        raise SystemExit(2)
    ckpt = load_checkpoint(args.checkpoint)
    n_params = sum(p.numel() for p in ckpt.model.parameters())
    job = {
        "checkpoint": str(args.checkpoint),
        "vocab": ckpt.info.vocab_size,
        "rows": args.rows,
        "prompt": args.prompt,
        "completion": args.completion,
        "micro_batch_tokens": args.micro_batch_tokens,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
    }
    del ckpt
    results: list[dict[str, Any]] = []
    for world in args.ranks:
        steps = args.steps if world == 2 else args.memory_steps
        for strategy in ("replicate", "fsdp"):
            start = time.monotonic()
            results.append(run(strategy, world, {**job, "steps": steps}))
            r = results[-1]
            took = time.monotonic() - start
            print(
                f"{strategy} N={world}: held {r['held_total'] / 2**20:.0f} MiB, peak RSS "
                f"{r['peak_rss'] / 2**20:.0f} MiB, step {r['step_s']:.2f} s ({took:.0f} s)",
                flush=True,
            )
    replica = {r["ranks"]: r for r in results if r["strategy"] == "replicate"}
    for r in results:
        whole = replica[r["ranks"]]
        r["held_vs_replica"] = r["held_total"] / whole["held_total"]
        r["held_bound"] = 1.0 / r["ranks"] if r["strategy"] == "fsdp" else 1.0
        r["rss_vs_replica"] = r["peak_rss"] / whole["peak_rss"]
        r["step_vs_replica"] = r["step_s"] / whole["step_s"]
    mib = 2**20
    table(
        width=170,
        title=f"per-rank memory and step time on {args.checkpoint.name} ({n_params / 1e6:.1f}M parameters), "
        f"{args.rows} x {args.prompt + args.completion} tokens a step",
        columns=["strategy", "N", "params MiB", "grads MiB", "AdamW MiB", "held MiB", "held / replica",
         "bound", "peak RSS MiB", "RSS / replica", "step s", "step / replica"],
        rows=[
            [r["strategy"], r["ranks"], f"{r['held_params'] / mib:.0f}", f"{r['held_grads'] / mib:.0f}",
             f"{r['held_optimizer'] / mib:.0f}", f"{r['held_total'] / mib:.0f}",
             f"{r['held_vs_replica']:.3f}", f"{r['held_bound']:.3f}", f"{r['peak_rss'] / mib:.0f}",
             f"{r['rss_vs_replica']:.2f}",
             f"{r['step_s']:.2f}", f"{r['step_vs_replica']:.2f}"]
            for r in results
        ],
    )  # fmt: skip
    curve = {r["strategy"]: r["losses"] for r in results if r["ranks"] == 2}
    gap = None
    if len(curve) == 2:
        pairs = list(zip(curve["replicate"], curve["fsdp"], strict=True))
        gap = max(abs(a - b) for a, b in pairs)
        scale = max(abs(a) for a, _ in pairs)
        print(
            f"loss at N = 2 over {len(pairs)} steps: replicate {pairs[0][0]:+.5f} -> {pairs[-1][0]:+.5f}, "
            f"fsdp {pairs[0][1]:+.5f} -> {pairs[-1][1]:+.5f}; largest gap {gap:.2e} "
            f"({gap / max(scale, 1e-12):.1e} of the largest loss)"
        )
    write(
        args.json,
        {
            "benchmark": "bench_fsdp",
            "workload": {**job, "params": n_params, "steps_at_2": args.steps, "steps": args.memory_steps},
            "seed": args.seed,
            "statistic": "median step after the first; held bytes of rank 0; peak RSS: max over ranks",
            "machine": {"threads": args.threads, "platform": platform.platform(), "cpu": _cpu()},
            "bound": {"held": "1/N of the replica", "goal": "fsdp at N = 2 <= 0.55 x replica"},
            "results": results,
            "loss_gap_at_2": gap,
        },
    )


if __name__ == "__main__":
    main()
