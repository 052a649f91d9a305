"""`bench_endpoint.py --abuse`: the endpoint under a flood of hostile requests, and how it holds.

The flood, all at once from one client process (httpx, asyncio): `seeds` chat requests with seeds
out of range (2**64, -2**63 - 1), `bodies` bodies of 20 MB, `rewards` rewards that are NaN, infinite
or 1e308 (each on an episode of its own, made first), and `streams` streamed requests whose client
reads the response's head and then nothing, holding the connection for `hold_s` before it closes.
Meanwhile a second process asks `/health` every 20 ms. Reported: each kind's status codes (400, 413,
422, and the streams' 200), `/health`'s latency percentiles over the flood (goal: p99 under 100 ms),
and the time from the flood's end until a normal request is served (goal: within 2 s).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import statistics
import time
from collections import Counter
from typing import Any

import httpx

HUGE = 20 << 20


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2, **extra}


async def _flood(url: str, model: str, sizes: dict[str, int], hold_s: float) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=sizes["streams"] + 64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def seed(i: int) -> int:
            raw = json.dumps(_chat(model))[:-1] + f', "seed": {2**64 + i if i % 2 else -(2**63) - 1 - i}}}'
            resp = await client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            return resp.status_code

        async def body(i: int) -> int:
            raw = json.dumps(_chat(model)).replace("Say hello.", "x" * HUGE)
            resp = await client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            return resp.status_code

        async def reward(i: int) -> int:
            episode = f"abuse-{i}-{time.monotonic_ns()}"
            await client.post("/v1/chat/completions", json=_chat(model, episode_id=episode))
            value = ("NaN", "Infinity", "-Infinity", "1e308")[i % 4]
            resp = await client.post(
                f"/v1/episodes/{episode}/reward",
                content='{"reward": ' + value + "}",
                headers={"content-type": "application/json"},
            )
            return resp.status_code

        async def stream(i: int) -> int:
            payload = _chat(model, stream=True, max_tokens=64, ignore_eos=True, seed=i)
            async with client.stream("POST", "/v1/chat/completions", json=payload) as resp:
                await asyncio.sleep(hold_s)  # never reads the body
                return resp.status_code

        start = time.monotonic()
        kinds = {"seeds": seed, "bodies": body, "rewards": reward, "streams": stream}
        results = await asyncio.gather(
            *(asyncio.gather(*(f(i) for i in range(sizes[k]))) for k, f in kinds.items())
        )
        ended = time.monotonic()
        normal = await client.post("/v1/chat/completions", json=_chat(model, max_tokens=8))
        served = time.monotonic()
    return {
        "codes": {k: dict(Counter(map(str, codes))) for k, codes in zip(kinds, results, strict=True)},
        "flood_s": round(ended - start, 2),
        "normal_status": normal.status_code,
        "normal_after_flood_s": round(served - ended, 3),
    }


def _probe(url: str, stop: Any, out: Any) -> None:
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            t = time.perf_counter()
            client.get("/health")
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)
    out.put(latencies)


def _flooder(url: str, model: str, sizes: dict[str, int], hold_s: float, out: Any) -> None:
    out.put(asyncio.run(_flood(url, model, sizes, hold_s)))


def abuse(url: str, model: str, sizes: dict[str, int], hold_s: float = 5.0) -> dict[str, Any]:
    """Run the flood against the endpoint at `url`; the figures (module docstring)."""
    ctx = mp.get_context("spawn")
    stop, probes, flooded = ctx.Event(), ctx.Queue(), ctx.Queue()
    prober = ctx.Process(target=_probe, args=(url, stop, probes))
    prober.start()
    time.sleep(1.0)  # the prober's own start-up is not the endpoint's latency
    flooder = ctx.Process(target=_flooder, args=(url, model, sizes, hold_s, flooded))
    flooder.start()
    result: dict[str, Any] = flooded.get()
    flooder.join()
    stop.set()
    latencies = probes.get()
    prober.join()
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1e3

    result["health"] = {
        "probes": len(latencies),
        "p50_ms": round(pct(50), 1),
        "p99_ms": round(pct(99), 1),
        "max_ms": round(max(latencies) * 1e3, 1),
        "mean_ms": round(statistics.mean(latencies) * 1e3, 1),
    }
    result["sizes"] = sizes
    result["hold_s"] = hold_s
    return result
