"""`bench_endpoint.py --grammar`: what constrained decoding costs, on SmolLM2-135M-Instruct's
49,152-token vocabulary (`rlsched.engine.grammar`).

At batch 1, 8 and 32, that many streamed chat requests at once (the in-process endpoint, one client
process, `ignore_eos`, temperature 1, a seed each), each decoding `--tokens` tokens, without a
`response_format` and with a JSON schema that `--tokens` never completes (an array of 40 strings), so
both decode the same number of tokens and the difference is the grammar's: a mask filled per row and
step from xgrammar's matcher, applied to the logits, and the matcher advanced. Tokens per second and
the median time to the first token, medians over `--repeats`, the two modes alternating within each
repeat. Goal: the schema at most 15% slower at batch 32. Writes bench_results/bench_endpoint_grammar.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from typing import Any

import torch
from _bench import table, write
from _streams import stream_load

from rlsched.config import EndpointConfig
from rlsched.serve.server import local_served, start

BATCHES = (1, 8, 32)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "notes": {
            "type": "array",
            "items": {"type": "string", "maxLength": 40},
            "minItems": 40,
            "maxItems": 40,
        }
    },
    "required": ["notes"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "notes", "schema": SCHEMA, "strict": True}}


def grammar_run(args: argparse.Namespace) -> None:
    served = local_served(
        args.checkpoint, model_name="smollm2", max_batch=max(BATCHES), prefix_cache_tokens=0
    )
    running = start(served, EndpointConfig(port=0, max_waiting=1024))
    url = f"http://{running.host}:{running.port}"
    modes: dict[str, dict[str, Any]] = {"plain": {}, "json_schema": {"response_format": FORMAT}}
    try:
        for extra in modes.values():  # warm-up: the first forwards allocate, xgrammar is imported
            stream_load(url, "smollm2", 2, 4, args.seed, **extra)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {m: {b: [] for b in BATCHES} for m in modes}
        for r in range(args.repeats):
            for b in BATCHES:
                for mode, extra in modes.items():
                    runs[mode][b].append(
                        stream_load(url, "smollm2", b, args.tokens, args.seed + 1000 * r, **extra)
                    )
    finally:
        running.stop()

    def med(mode: str, b: int, key: str) -> float:
        return statistics.median(x[key] for x in runs[mode][b])

    rows, results = [], []
    for b in BATCHES:
        plain, schema = med("plain", b, "tokens_per_s"), med("json_schema", b, "tokens_per_s")
        slower = 1 - schema / plain
        ttft_p, ttft_s = med("plain", b, "ttft_p50_s"), med("json_schema", b, "ttft_p50_s")
        results.append(
            {
                "batch": b,
                "plain_tokens_per_s": plain,
                "schema_tokens_per_s": schema,
                "slower": slower,
                "plain_ttft_p50_s": ttft_p,
                "schema_ttft_p50_s": ttft_s,
                "runs": {m: runs[m][b] for m in modes},
            }
        )
        rows.append(
            [
                b,
                f"{plain:.0f}",
                f"{schema:.0f}",
                f"{slower:.1%}",
                f"{ttft_p * 1e3:.0f}",
                f"{ttft_s * 1e3:.0f}",
            ]
        )
    title = f"Constrained decoding's cost ({args.tokens} tokens a request, median of {args.repeats})"
    table(
        title + "; goal: at most 15% slower at batch 32",
        ["batch", "plain tok/s", "schema tok/s", "slower", "plain TTFT ms", "schema TTFT ms"],
        rows,
    )
    write(
        args.json.with_name("bench_endpoint_grammar.json"),
        {
            "workload": {
                "checkpoint": str(args.checkpoint),
                "tokens": args.tokens,
                "batches": list(BATCHES),
                "schema": SCHEMA,
                "repeats": args.repeats,
                "temperature": 1.0,
                "ignore_eos": True,
            },
            "seed": args.seed,
            "machine": {
                "cpu": platform.processor() or platform.machine(),
                "torch_threads": torch.get_num_threads(),
            },
            "goal": {"batch": 32, "max_slower": 0.15},
            "results": results,
        },
    )
