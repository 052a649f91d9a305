"""The streaming clients the endpoint benchmarks share (`bench_endpoint.py` and its `--grammar`
half): chat bodies over a fixed set of questions, and a separate client process that opens them all
at once with httpx and times what comes back (so parsing the streams does not share the server's
interpreter)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from typing import Any

import httpx

SYSTEM = "You are a helpful assistant. Answer in full sentences."
TOPICS = [
    "rivers",
    "bread",
    "stars",
    "trains",
    "honey",
    "glass",
    "maps",
    "clocks",
    "salt",
    "tides",
    "moss",
    "kites",
]


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Question {i}: tell me something about {TOPICS[i % len(TOPICS)]}."},
    ]


def body(i: int, tokens: int, seed: int, model: str, **extra: Any) -> dict[str, Any]:
    """Request `i`'s streamed chat body (usage in its last chunk); `extra` fields join it."""
    return {
        "model": model,
        "messages": messages(i),
        "max_tokens": tokens,
        "temperature": 1.0,
        "seed": seed + i,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


# -- the clients (a separate process) -------------------------------------------------------------------


async def _one(client: httpx.AsyncClient, payload: dict[str, Any]) -> dict[str, Any]:
    sent = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=payload) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return {"status": resp.status_code, "retry_after": resp.headers.get("retry-after")}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"status": 200, "sent": sent, "arrivals": arrivals, "done": time.perf_counter(), "tokens": tokens}


async def _many(url: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=len(payloads) + 8, max_keepalive_connections=len(payloads) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        return list(await asyncio.gather(*(_one(client, p) for p in payloads)))


async def _leave_early(url: str, payloads: list[dict[str, Any]], events: int) -> int:
    async def one(client: httpx.AsyncClient, payload: dict[str, Any]) -> int:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as resp:
            seen = 0
            async for _ in resp.aiter_lines():
                seen += 1
                if seen >= events:
                    break
            return resp.status_code

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        codes = await asyncio.gather(*(one(client, p) for p in payloads))
    return sum(c == 200 for c in codes)


def _clients(job: tuple[str, str, list[dict[str, Any]]], out: Any) -> None:
    kind, url, payloads = job
    if kind == "stream":
        out.put(asyncio.run(_many(url, payloads)))
    else:
        out.put(asyncio.run(_leave_early(url, payloads, 3)))


def run_clients(kind: str, url: str, payloads: list[dict[str, Any]]) -> Any:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_clients, args=((kind, url, payloads), out))
    proc.start()
    result = out.get()
    proc.join()
    return result


def stream_load(url: str, model: str, n: int, tokens: int, seed: int, **extra: Any) -> dict[str, Any]:
    """`n` streamed requests at once from a client process: wall time, completion tokens per second
    (as the usage chunks count them), time to the first content token and between content chunks."""
    payloads = [body(i, tokens, seed, model, **extra) for i in range(n)]
    results = run_clients("stream", url, payloads)
    ok = [r for r in results if r["status"] == 200]
    first = min(r["sent"] for r in ok)
    last = max(r["done"] for r in ok)
    ttft = [r["arrivals"][0] - r["sent"] for r in ok if r["arrivals"]]
    gaps = [b - a for r in ok for a, b in zip(r["arrivals"], r["arrivals"][1:], strict=False)]
    produced = sum(r["tokens"] for r in ok)
    wall = last - first
    return {
        "ok": len(ok),
        "wall_s": wall,
        "tokens": produced,
        "tokens_per_s": produced / wall,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "itl_p50_s": _pct(gaps, 50),
        "itl_p99_s": _pct(gaps, 99),
    }


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]
