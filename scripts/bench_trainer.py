"""Trainer throughput: one GRPO step (forward, backward, AdamW) on a checkpoint, in training tokens per
second and model FLOPs utilisation against this machine's matmul peak measured in the same run.

    .venv/bin/python scripts/bench_trainer.py [--checkpoint models/smollm2-135m-instruct]
        [--rows 32] [--prompt 48] [--completion 48] [--threads 2] [--repeats 3]

Workload: `rows` sequences of `prompt` + `completion` random tokens (32 x 96 by default), random
advantages and old log-probs, the update rlsched's trainer runs (`rlsched.rl.update.grpo_update`:
micro-batches of `--micro-batch-tokens`, the token-level clipped loss, gradient clipping, AdamW).
Variants: fp32, BF16 autocast (fp32 masters), and each with gradient checkpointing. Figures: the
median step time over `--repeats` steps after one warm-up step, tokens/s (all tokens of the batch),
and MFU = 6 x parameters x tokens / time / peak, where the peak is the best of a 2048^3 matmul in
fp32 and in BF16 on the same threads (the bound). Writes bench_results/bench_trainer.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.config import GRPOConfig, Precision, TrainerConfig
from rlsched.model.checkpoint import BASE_CHECKPOINT, load_checkpoint
from rlsched.rl.update import TrainItem, TrainOptions, grpo_update, prepare_policy


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 8) -> float:
    """FLOP/s of an n^3 matmul (best of `repeats`)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def batch(args: argparse.Namespace, vocab: int, gen: torch.Generator) -> list[TrainItem]:
    items = []
    for _ in range(args.rows):
        prompt = torch.randint(0, vocab, (args.prompt,), generator=gen).tolist()
        tokens = torch.randint(0, vocab, (args.completion,), generator=gen).tolist()
        old = (-torch.rand(args.completion, generator=gen) * 3 - 8).tolist()  # ratios near 1 after a step
        items.append(
            TrainItem(tuple(prompt), tuple(tokens), tuple(old), float(torch.randn(1, generator=gen)))
        )
    return items


def step_times(args: argparse.Namespace, precision: Precision, checkpointing: bool) -> list[float]:
    trainer = TrainerConfig(
        precision=precision, gradient_checkpointing=checkpointing, micro_batch_tokens=args.micro_batch_tokens
    )
    ck = load_checkpoint(args.checkpoint)
    policy = prepare_policy(ck.model, trainer)
    opts = TrainOptions.of(trainer, ck.tokenizer.pad_token_id or 0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
    items = batch(args, ck.info.vocab_size, torch.Generator().manual_seed(args.seed))
    cfg = GRPOConfig()
    times = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        grpo_update(policy, optimizer, items, cfg, options=opts)
        if i:  # the first step warms up
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = parser(__doc__, "bench_trainer")
    ap.add_argument("--checkpoint", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["fp32", "bf16", "bf16+ckpt"])
    args = ap.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        print(
            f"{args.checkpoint} not found: run `make model-smollm2`, or pass --checkpoint {BASE_CHECKPOINT}"
        )
        raise SystemExit(2)
    torch.set_num_threads(args.threads)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    params = sum(p.numel() for p in load_checkpoint(args.checkpoint).model.parameters())
    tokens = args.rows * (args.prompt + args.completion)
    rows: list[dict[str, Any]] = []
    for variant in args.variants:
        precision = Precision.BF16 if variant.startswith("bf16") else Precision.FP32
        times = step_times(args, precision, variant.endswith("+ckpt"))
        median = statistics.median(times)
        flops = 6 * params * tokens / median
        peak = peaks[str(precision)]
        rows.append(
            {
                "variant": variant,
                "step_s": round(median, 3),
                "tokens_per_s": round(tokens / median, 1),
                "tflops": round(flops / 1e12, 3),
                "mfu_vs_own_peak": round(flops / peak, 3),
                "mfu_vs_bf16_peak": round(flops / peaks["bf16"], 3),
            }
        )
        print(rows[-1], flush=True)
    table = Table(
        title=f"one GRPO step on {args.checkpoint.name}: {args.rows} x {args.prompt + args.completion} tokens"
    )
    for col in ("variant", "step s", "tokens/s", "TFLOP/s", "MFU (own dtype's peak)", "MFU (BF16 peak)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["variant"], f"{r['step_s']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['tflops']:.3f}",
            f"{100 * r['mfu_vs_own_peak']:.1f}%", f"{100 * r['mfu_vs_bf16_peak']:.1f}%",
        )  # fmt: skip
    Console().print(table)
    print(
        f"matmul peak on {args.threads} threads: fp32 {peaks['fp32'] / 1e9:.0f}, "
        f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s"
    )
    write(
        args.json,
        {
            "benchmark": "bench_trainer",
            "workload": {
                "checkpoint": str(args.checkpoint),
                "params": params,
                "rows": args.rows,
                "prompt": args.prompt,
                "completion": args.completion,
                "tokens": tokens,
                "micro_batch_tokens": args.micro_batch_tokens,
            },
            "seed": args.seed,
            "repeats": args.repeats,
            "statistic": "median",
            "machine": {"threads": args.threads, "platform": platform.platform()},
            "bound": {"matmul_peak_flops": peaks, "model_flops": "6 x parameters x tokens"},
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
