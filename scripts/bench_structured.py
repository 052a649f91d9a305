"""Structured outputs on a real model: random JSON schemas against SmolLM2-135M-Instruct through the
endpoint, every finished reply checked with `jsonschema`.

    .venv/bin/python scripts/bench_structured.py [--requests 200] [--concurrency 32]

Workload: `--requests` chat requests, each with its own random schema (seeded): an object of 1-5
properties, nested objects up to depth 2, enums, arrays of 1-4 items, integers and numbers with
bounds, booleans, strings of bounded length; all properties required, no others allowed. The prompt
asks for an example of the schema (the schema shown); `response_format` is
`{"type": "json_schema", "strict": true}`, temperature 0.7, a seed each. `max_tokens` is the schema's
own bound on its JSON's length in characters (a token is at least one character, so a reply that
follows the grammar to its end fits), at most 1,024. Sent `--concurrency` at a time with the official
`openai` client.

Counts: replies that finished (`finish_reason: stop`) within `max_tokens`, those that parse and
validate, and the cut ones (`length`), apart. Goal: at least 90% finish; every finished reply
validates. Writes bench_results/bench_structured.json.
"""

from __future__ import annotations

import json
import platform
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
from _bench import parser, table, write
from openai import OpenAI

from rlsched.config import EndpointConfig
from rlsched.serve.server import local_served, start

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["alpha", "river", "stone", "cloud", "maple", "ember", "north", "quartz", "delta", "lumen"]
MAX_TOKENS = 1024


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema of 1-5 required properties of random kinds (objects only above depth 2)."""
    kinds = ["string", "integer", "number", "boolean", "enum", "array"] + (["object"] if depth < 2 else [])
    props = {
        f"{rng.choice(WORDS)}_{k}": _value(rng, rng.choice(kinds), depth) for k in range(rng.randint(1, 5))
    }
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _value(rng: random.Random, kind: str, depth: int) -> dict[str, Any]:
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(4, 24)}
    if kind == "integer":
        low = rng.randint(-100, 100)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 1000)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 100])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(2, 4))}
    if kind == "array":
        item = _value(rng, rng.choice(["string", "integer", "enum", "boolean"]), depth)
        return {"type": "array", "items": item, "minItems": 1, "maxItems": rng.randint(1, 4)}
    return random_schema(rng, depth + 1)


def length_bound(schema: dict[str, Any]) -> int:
    """The most characters compact JSON of `schema` can take (as xgrammar writes it: `, ` and `: `)."""
    if schema.get("type") == "object":
        inner = sum(len(json.dumps(k)) + 2 + length_bound(v) for k, v in schema["properties"].items())
        return 2 + inner + 2 * max(len(schema["properties"]) - 1, 0)
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind == "string":
        return 2 + 6 * int(schema["maxLength"])  # an escaped character is at most \\uXXXX
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "number":
        return 24
    if kind == "boolean":
        return 5
    items = int(schema["maxItems"])
    return 2 + items * length_bound(schema["items"]) + 2 * (items - 1)


def ask(client: OpenAI, i: int, schema: dict[str, Any], seed: int) -> dict[str, Any]:
    budget = min(length_bound(schema) + 4, MAX_TOKENS)
    prompt = f"Write one example JSON object for this schema, with realistic values:\n{json.dumps(schema)}"
    t0 = time.perf_counter()
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": prompt}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
        },
        max_tokens=budget,
        temperature=0.7,
        seed=seed + i,
    )
    choice = reply.choices[0]
    out: dict[str, Any] = {
        "i": i,
        "max_tokens": budget,
        "tokens": reply.usage.completion_tokens if reply.usage else None,
        "finish": choice.finish_reason,
        "seconds": time.perf_counter() - t0,
    }
    if choice.finish_reason == "stop":
        try:
            jsonschema.validate(json.loads(choice.message.content or ""), schema)
            out["valid"] = True
        except (json.JSONDecodeError, jsonschema.ValidationError) as err:
            out["valid"], out["error"] = False, str(err)[:300]
    return out


def main() -> None:
    ap = parser(__doc__, "bench_structured")
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    if not args.checkpoint.is_dir():
        raise SystemExit(f"{args.checkpoint} is missing: run `make model-smollm2` first")
    rng = random.Random(args.seed)
    schemas = [random_schema(rng) for _ in range(args.requests)]
    running = start(
        local_served(args.checkpoint, model_name="smollm2", max_batch=args.concurrency),
        EndpointConfig(port=0),
    )
    client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=1200)
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda a: ask(client, *a, args.seed), enumerate(schemas)))
    finally:
        running.stop()
    wall = time.perf_counter() - t0
    finished = [r for r in results if r["finish"] == "stop"]
    valid = [r for r in finished if r.get("valid")]
    cut = [r for r in results if r["finish"] == "length"]
    n = len(results)
    table(
        f"Random JSON schemas on SmolLM2 ({n} requests, {args.concurrency} at a time, {wall:.0f} s)",
        ["replies", "count", "share"],
        [
            ["finished within max_tokens", len(finished), f"{len(finished) / n:.1%}"],
            [
                "finished and valid (jsonschema)",
                len(valid),
                f"{len(valid) / max(len(finished), 1):.1%} of finished",
            ],
            ["cut at max_tokens", len(cut), f"{len(cut) / n:.1%}"],
        ],
    )
    write(
        args.json,
        {
            "workload": {
                "checkpoint": str(args.checkpoint),
                "requests": n,
                "concurrency": args.concurrency,
                "temperature": 0.7,
                "max_tokens": f"the schema's length bound + 4, at most {MAX_TOKENS}",
            },
            "seed": args.seed,
            "machine": {"cpu": platform.processor() or platform.machine()},
            "goal": {"finished_share": 0.9, "valid_share_of_finished": 1.0},
            "finished": len(finished),
            "valid": len(valid),
            "cut": len(cut),
            "wall_s": wall,
            "results": results,
            "schemas": schemas,
        },
    )


if __name__ == "__main__":
    main()
