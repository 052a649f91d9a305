"""Decode throughput of the rollout engines: the torch engine's KV cache against a no-cache baseline,
and the vLLM engine where vLLM is installed, same run.

    .venv/bin/python scripts/bench_engine.py [--batches 1 8 32 64] [--tokens 64] [--repeats 3] [--seed 0]
    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python scripts/bench_engine.py   # adds vLLM

Workload: the shipped base model, prompts of the toy task rendered with its template, sampling at
temperature 1 with a fixed seed and no stop tokens, so every request decodes exactly `--tokens`
tokens. Figures are generated tokens per second (median over repeats, whole generate() call, prefill
included); the bound each engine is compared with is the no-cache engine of the same run (the ratio
column). With vLLM (`make setup-vllm`): its tokens/s per batch, and the time of an in-place weight
update (the shipped model's BF16 bytes through `collective_rpc`, median of `--repeats`). Writes
bench_results/bench_engine.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.errors import UserError
from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes
from rlsched.rl.task import AdditionTask


def tokens_per_second(engine: Any, requests: list[GenerationRequest]) -> float:
    start = time.perf_counter()
    produced = sum(s.num_tokens for s in engine.generate(requests))
    return produced / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/bench_engine.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)

    ckpt = load_checkpoint()
    task = AdditionTask()
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=args.seed)
    engines: dict[str, Any] = {
        "kv_cache": TorchRolloutEngine(ckpt.model, ckpt.tokenizer, max_batch=max(args.batches)),
        "no_cache": TorchRolloutEngine(
            ckpt.model, ckpt.tokenizer, max_batch=max(args.batches), use_cache=False
        ),
    }
    update: dict[str, float] = {}
    try:
        from rlsched.engine.vllm import VllmRolloutEngine, require_vllm

        require_vllm()
        engines["vllm"] = VllmRolloutEngine(ckpt.path, max_batch=max(args.batches), seed=args.seed)
        blob = to_bf16_bytes(ckpt.model)
        times = []
        for v in range(args.repeats):
            start = time.perf_counter()
            engines["vllm"].load_weights(blob, WeightVersion(v + 1))
            times.append(time.perf_counter() - start)
        update = {"bytes": float(len(blob)), "seconds": statistics.median(times)}
    except UserError as err:
        print(f"vllm: skipped ({str(err).split(' (')[0]}); see `make setup-vllm`")
    rows = []
    for batch in args.batches:
        requests = [
            GenerationRequest(
                RequestId(str(i)), tuple(ckpt.template.encode(ckpt.tokenizer, p.messages())), params
            )
            for i, p in enumerate(task.eval_problems[:batch])
        ]
        for e in engines.values():
            tokens_per_second(e, requests[:1])  # warm-up
        figures = {
            name: statistics.median(tokens_per_second(e, requests) for _ in range(args.repeats))
            for name, e in engines.items()
        }
        rows.append(
            {
                "batch": batch,
                **{f"{k}_tok_s": round(v, 1) for k, v in figures.items()},
                "speedup_vs_no_cache": round(figures["kv_cache"] / figures["no_cache"], 2),
            }
            | (
                {"vllm_vs_kv_cache": round(figures["vllm"] / figures["kv_cache"], 2)}
                if "vllm" in figures
                else {}
            )
        )
        print(f"batch {batch}: {rows[-1]}", flush=True)

    table = Table(
        title=f"torch engine decode throughput ({args.tokens} tokens/request, median of {args.repeats})"
    )
    vllm = "vllm" in engines
    cols = ["batch", "KV cache tok/s", "no cache tok/s", "KV cache / no cache"]
    for col in cols + (["vLLM tok/s", "vLLM / KV cache"] if vllm else []):
        table.add_column(col, justify="right")
    for r in rows:
        cells = [str(r["batch"]), f"{r['kv_cache_tok_s']:.0f}", f"{r['no_cache_tok_s']:.0f}"]
        cells.append(f"{r['speedup_vs_no_cache']:.2f}x")
        if vllm:
            cells += [f"{r['vllm_tok_s']:.0f}", f"{r['vllm_vs_kv_cache']:.2f}x"]
        table.add_row(*cells)
    Console().print(table)
    if update:
        print(f"vLLM in-place update: {update['bytes'] / 1e6:.2f} MB in {update['seconds']:.3f} s (median)")
        engines["vllm"].shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "bench_engine",
                "workload": {
                    "model": str(ckpt.path),
                    "params": sum(p.numel() for p in ckpt.model.parameters()),
                    "prompt_tokens": 26,
                    "tokens_per_request": args.tokens,
                    "sampling": "temperature 1",
                },
                "seed": args.seed,
                "repeats": args.repeats,
                "statistic": "median",
                "machine": {"cpu_threads": torch.get_num_threads(), "platform": platform.platform()},
                "bound": "no_cache engine of the same run (ratio = kv_cache / no_cache)",
                "results": rows,
                "vllm_update": update or None,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
