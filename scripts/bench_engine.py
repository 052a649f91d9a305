"""Decode throughput of the rollout engines: the torch engine's KV cache against a no-cache baseline,
and the vLLM engine where vLLM is installed, same run.

    .venv/bin/python scripts/bench_engine.py [--batches 1 8 32 64] [--tokens 64] [--repeats 3] [--seed 0]
    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python scripts/bench_engine.py   # adds vLLM

Workload: the shipped base model, prompts of the toy task rendered with its template, sampling at
temperature 1 with a fixed seed and no stop tokens, so every request decodes exactly `--tokens`
tokens. Figures are generated tokens per second (median over repeats, whole generate() call, prefill
included); the bound each engine is compared with is the no-cache engine of the same run (the ratio
column). With vLLM (`make setup-vllm`): its tokens/s per batch, and the time of an in-place weight
update against the size of the weights (random-weight models from 1 MB to about 0.4 GB of BF16 bytes,
each served by a fresh engine and sent its bytes through `collective_rpc`, median of `--repeats`),
beside the torch engine's load of the same bytes. Writes bench_results/bench_engine.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.errors import UserError
from rlsched.model.checkpoint import load_checkpoint, save_checkpoint, to_bf16_bytes
from rlsched.model.llama import LlamaConfig, LlamaForCausalLM
from rlsched.rl.task import AdditionTask


def tokens_per_second(engine: Any, requests: list[GenerationRequest]) -> float:
    start = time.perf_counter()
    produced = sum(s.num_tokens for s in engine.generate(requests))
    return produced / (time.perf_counter() - start)


# (hidden size, layers) of the models whose in-place update is timed: 1 MB (the shipped model's shape)
# to about 0.4 GB of BF16 weights
UPDATE_SIZES = ((128, 2), (512, 4), (1024, 8), (2048, 6))


def timed(load: Callable[[bytes, WeightVersion], str], blob: bytes, repeats: int) -> float:
    times = []
    for v in range(repeats):
        start = time.perf_counter()
        load(blob, WeightVersion(v + 1))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def update_times(sizes: list[tuple[int, int]], repeats: int, seed: int) -> list[dict[str, float]]:
    """The in-place update of a vLLM engine against the size of the weights: a random-weight model of
    each size is saved as a checkpoint, served by a fresh vLLM engine, then sent its own BF16 bytes
    `repeats` times; the torch engine's load of the same bytes is the peer."""
    from rlsched.engine.vllm import VllmRolloutEngine

    base = load_checkpoint()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, layers in sizes:
            heads = hidden // 32
            cfg = LlamaConfig(
                hidden_size=hidden,
                intermediate_size=3 * hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2),
            )
            model = LlamaForCausalLM(cfg)
            model.init_weights(seed=seed)
            path = save_checkpoint(model, base.tokenizer, base.template, Path(tmp) / f"h{hidden}")
            blob = to_bf16_bytes(model)
            print(
                f"update: hidden {hidden}, {layers} layers, {len(blob) / 1e6:.1f} MB: starting vLLM",
                flush=True,
            )
            engine = VllmRolloutEngine(path, max_batch=8, seed=seed)
            try:
                vllm_s = timed(engine.load_weights, blob, repeats)
            finally:
                engine.shutdown()
            torch_s = timed(TorchRolloutEngine(model, base.tokenizer).load_weights, blob, repeats)
            rows.append(
                {
                    "hidden": hidden,
                    "layers": layers,
                    "params": sum(p.numel() for p in model.parameters()),
                    "bytes": len(blob),
                    "vllm_s": round(vllm_s, 4),
                    "torch_s": round(torch_s, 4),
                    "vllm_gb_per_s": round(len(blob) / vllm_s / 1e9, 3),
                    "vllm_vs_torch": round(vllm_s / torch_s, 2),
                }
            )
            print(f"  {rows[-1]}", flush=True)
    return rows


def update_table(rows: list[dict[str, float]], repeats: int) -> Table:
    table = Table(title=f"in-place weight update against weight size (BF16 bytes, median of {repeats})")
    for col in ("model", "params", "MB", "vLLM s", "vLLM GB/s", "torch engine s", "vLLM / torch"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"h{r['hidden']} x{r['layers']}",
            f"{r['params'] / 1e6:.1f} M",
            f"{r['bytes'] / 1e6:.1f}",
            f"{r['vllm_s']:.3f}",
            f"{r['vllm_gb_per_s']:.2f}",
            f"{r['torch_s']:.3f}",
            f"{r['vllm_vs_torch']:.1f}x",
        )
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/bench_engine.json"))
    ap.add_argument(
        "--update-sizes",
        type=lambda t: tuple(int(x) for x in t.split("x")),
        nargs="+",
        default=list(UPDATE_SIZES),
        metavar="HIDDENxLAYERS",
        help="models whose vLLM update is timed (default: 128x2 512x4 1024x8 2048x6)",
    )
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
    updates: list[dict[str, float]] = []
    try:
        from rlsched.engine.vllm import VllmRolloutEngine, require_vllm

        require_vllm()
        engines["vllm"] = VllmRolloutEngine(ckpt.path, max_batch=max(args.batches), seed=args.seed)
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
    if "vllm" in engines:
        engines["vllm"].shutdown()
        updates = update_times(args.update_sizes, args.repeats, args.seed)
        Console().print(update_table(updates, args.repeats))
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
                "vllm_update": updates or None,
                "update_bound": "the torch engine's load of the same bytes in one process (no RPC)",
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
