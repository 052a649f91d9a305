"""What saving partial outputs costs generation, per flush interval.

    .venv/bin/python scripts/bench_store.py [--requests 128] [--tokens 112] [--repeats 5] [--seed 0]
        [--json OUT]

Workload: the shipped base model on the torch engine (one thread, KV cache), `--requests` requests of
exactly `--tokens` new tokens each (ignore_eos), one wave; the engine hands each live request's new
tokens to a sink every `flush_s`, and the sink appends them to the SQLite WAL store
(`rlsched.store.partial`, one transaction per flush), as a rollout instance does. Peers: no store
(the bound), and flush intervals of 1 s, 0.25 s (the default), 0.05 s and every decode step (0).
Per interval: median tokens/s over `--repeats` runs, its ratio to no store, flushes and store bytes
written, and the work at risk (tokens generated since the last flush when an instance is reclaimed:
at most flush_s x tokens/s). Writes bench_results/bench_store.json.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.engine.protocol import GenerationRequest, Partial, RequestId, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint
from rlsched.store.partial import Chunk, PartialStore

INTERVALS: tuple[float | None, ...] = (None, 1.0, 0.25, 0.05, 0.0)


def run_once(
    engine: TorchRolloutEngine, requests: list[GenerationRequest], flush_s: float | None, db: Path
) -> dict[str, float]:
    store = PartialStore(db) if flush_s is not None else None
    flushes = 0

    def sink(partials: Sequence[Partial]) -> None:
        nonlocal flushes
        assert store is not None
        flushes += 1
        store.append(
            [Chunk(p.request_id, p.start, p.token_ids, p.logprobs) for p in partials], 1, time.time()
        )

    if store is not None:
        store.reset()
        store.claim([r.request_id for r in requests], 1, "bench", time.time())
    start = time.perf_counter()
    tokens = sum(s.num_tokens for s in engine.generate(requests, sink if store else None, flush_s or 0.0))
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*")) if store else 0
    if store is not None:
        store.close()
    return {"tokens_per_s": tokens / seconds, "flushes": flushes, "store_bytes": size}


def main() -> None:
    ap = parser(__doc__, "bench_store")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=112)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ckpt = load_checkpoint(None)
    engine = TorchRolloutEngine(ckpt.model, ckpt.tokenizer, max_batch=args.requests, seed=args.seed)
    prompt = tuple(ckpt.tokenizer.encode("12+34="))
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=args.seed)
    requests = [GenerationRequest(RequestId(f"1-{i}-0"), prompt, params) for i in range(args.requests)]
    console = Console(width=120)
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "partial.sqlite"
        for r in range(args.repeats):  # interleaved, so that machine noise spreads over every interval
            for flush_s in INTERVALS:
                runs.setdefault(str(flush_s), []).append(run_once(engine, requests, flush_s, db))
            console.print(f"round {r + 1}/{args.repeats} done")
    base = statistics.median(x["tokens_per_s"] for x in runs["None"])
    rows: list[dict[str, Any]] = []
    for flush_s in INTERVALS:
        got = runs[str(flush_s)]
        tps = statistics.median(x["tokens_per_s"] for x in got)
        rows.append(
            {
                "flush_s": flush_s,
                "tokens_per_s": tps,
                "vs_no_store": tps / base,
                "flushes": statistics.median(x["flushes"] for x in got),
                "store_bytes": statistics.median(x["store_bytes"] for x in got),
                "at_risk_tokens": None if flush_s is None else (flush_s or 0.0) * tps,
            }
        )
    table = Table(
        title=f"partial-output store: {args.requests} requests x {args.tokens} tokens, seed {args.seed}"
    )
    for col in ("flush interval", "tokens/s", "vs no store", "flushes", "store bytes", "tokens at risk"):
        table.add_column(col, justify="right")
    for row in rows:
        name = (
            "no store"
            if row["flush_s"] is None
            else ("every step" if row["flush_s"] == 0 else f"{row['flush_s']} s")
        )
        risk = (
            "all"
            if row["at_risk_tokens"] is None
            else ("one step" if row["flush_s"] == 0 else f"{row['at_risk_tokens']:.0f}")
        )
        table.add_row(
            name,
            f"{row['tokens_per_s']:.0f}",
            f"{row['vs_no_store']:.3f}",
            f"{row['flushes']:.0f}",
            f"{row['store_bytes']:.0f}",
            risk,
        )
    console.print(table)
    write(args.json, {"workload": vars(args) | {"json": str(args.json)}, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
