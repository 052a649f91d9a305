"""The OpenAI endpoint under load, on SmolLM2-135M-Instruct: 64 streaming clients at once on loopback,
against the same requests handed to the engine directly.

    .venv/bin/python scripts/bench_endpoint.py [--clients 64] [--tokens 64] [--repeats 3]

Workload: `--clients` chat requests (one system prompt, a different question each, SmolLM2's chat
template), sampled at temperature 1 with a seed per request and `ignore_eos`, so each decodes exactly
`--tokens` tokens. Each repeat runs, in this order:

- *direct*: the templated ids straight to `TorchRolloutEngine.generate` (the bound);
- *endpoint*: every client opens a streamed `/v1/chat/completions` at once (httpx, one asyncio loop
  in a separate process, so parsing the stream does not share the server's interpreter); time to
  the first content token, the gaps between content chunks, and the wall time from the first request
  to the last `[DONE]`.

Throughput is completion tokens over wall time; the endpoint's overhead is 1 - endpoint/direct
(goal: at most 10%). Both run with the prefix cache off, so the two compute the same. Then, once:

- *429*: a second app over the same engine with `max_waiting` 8 takes `clients + 24` requests at once:
  the rows fill, eight wait, and the rest are refused with 429 and `Retry-After`;
- *disconnects*: 16 clients read three events of a long generation and close the connection; the
  engine must end with nothing running or waiting, and the abort counter must say 16.

Then the same direct-and-streamed pair over the Ray fleet (`rlsched serve`'s default path): one
rollout instance behind the endpoint actor, the bound being the same requests sent to that
instance directly over Ray; the instance runs one torch thread, as in a job.

Figures are medians over `--repeats`. Writes bench_results/bench_endpoint.json (or --json).

`--engine vllm` (in `.venv-vllm`) runs both halves on vLLM: `rlsched serve --engine vllm`'s
in-process endpoint against `VllmRolloutEngine.generate`, and the endpoint over one vLLM rollout
instance (a job's endpoint on vLLM) against that instance's `complete`; the fleet's overhead is also
given against the in-process endpoint, run beside it. It writes bench_endpoint_vllm.json and skips the
429 and disconnect checks, which are the app's and run with the torch engine.

`--grammar` measures what constrained decoding costs instead (`scripts/_bench_grammar.py`: tokens/s
and TTFT at batch 1, 8 and 32, with and without a JSON schema) and writes bench_endpoint_grammar.json.

`--abuse` runs the hostile flood of `scripts/_abuse.py` instead (out-of-range seeds, 20 MB bodies,
non-finite rewards, 200 streams that are never read) and writes bench_endpoint_abuse.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn
from _abuse import abuse
from _bench import parser, table, write
from _bench_grammar import grammar_run
from _streams import body, messages, run_clients, stream_load

from rlsched.config import EndpointConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.model.checkpoint import load_prompting
from rlsched.model.tokenizer import Tokenizer
from rlsched.serve.app import build_app
from rlsched.serve.server import Running, local_served, start

ROOT = Path(__file__).resolve().parents[1]
# -- the measurements ---------------------------------------------------------------------------------------


def requests(tokenizer: Tokenizer, n: int, tokens: int, seed: int) -> list[GenerationRequest]:
    """The clients' requests as the engine takes them: templated ids, the same sampling."""
    reqs = []
    for i in range(n):
        ids = tokenizer.encode(
            tokenizer.hf.apply_chat_template(messages(i), tokenize=False, add_generation_prompt=True)
        )
        params = SamplingParams(temperature=1.0, seed=seed + i, max_tokens=tokens, stop_token_ids=())
        reqs.append(GenerationRequest(RequestId(f"direct-{i}"), tuple(ids), params))
    return reqs


def direct(running: Running, n: int, tokens: int, seed: int) -> dict[str, float]:
    engine = running.served.backend.engine  # type: ignore[attr-defined]
    reqs = requests(running.served.tokenizer, n, tokens, seed)
    start_t = time.perf_counter()
    produced = sum(s.num_tokens for s in engine.generate(reqs))
    wall = time.perf_counter() - start_t
    return {"wall_s": wall, "tokens": produced, "tokens_per_s": produced / wall}


def paired(running: Running, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A warm-up (the first forwards allocate), then `--repeats` pairs: direct, then the endpoint."""
    direct(running, 8, 8, args.seed)
    endpoint(running, 8, 8, args.seed)
    runs = []
    for r in range(args.repeats):
        d = direct(running, args.clients, args.tokens, args.seed + 1000 * r)
        e = endpoint(running, args.clients, args.tokens, args.seed + 1000 * r)
        runs.append({"direct": d, "endpoint": e, "ratio": e["tokens_per_s"] / d["tokens_per_s"]})
    return runs


def endpoint(running: Running, n: int, tokens: int, seed: int) -> dict[str, Any]:
    return stream_load(f"http://{running.host}:{running.port}", running.served.model_name, n, tokens, seed)


def refusals(running: Running, n: int, max_waiting: int) -> dict[str, Any]:
    """A second app over the same engine, with a small queue limit."""
    cfg = EndpointConfig(port=0, max_waiting=max_waiting)
    app = build_app(running.served, cfg)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    total = n + max_waiting + 24
    payloads = [body(i, 32, 0, running.served.model_name) for i in range(total)]
    results = run_clients("stream", f"http://127.0.0.1:{port}", payloads)
    server.should_exit = True
    thread.join()
    refused = [r for r in results if r["status"] == 429]
    return {
        "sent": total,
        "rows": n,
        "max_waiting": max_waiting,
        "served": sum(r["status"] == 200 for r in results),
        "refused_429": len(refused),
        "retry_after": sorted({r["retry_after"] for r in refused}),
        "other": sorted({r["status"] for r in results} - {200, 429}),
    }


def disconnects(running: Running, clients: int) -> dict[str, Any]:
    url = f"http://{running.host}:{running.port}"
    before = _aborted(url)
    payloads = [body(i, 4000, 0, running.served.model_name) for i in range(clients)]
    opened = run_clients("leave", url, payloads)
    backend = running.served.backend
    deadline = time.monotonic() + 60
    while (backend.running or backend.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {
        "clients": clients,
        "opened": opened,
        "aborted": _aborted(url) - before,
        "left_running": backend.running,
        "left_waiting": backend.waiting,
    }


def fleet(
    checkpoint: Path, clients: int, tokens: int, repeats: int, seed: int, engine: str = "torch"
) -> list[dict[str, Any]]:
    """The same load over the Ray fleet (`rlsched serve`'s default): one rollout instance (one torch
    thread, as in a job) behind the endpoint actor; the bound is the same requests sent to that
    instance directly (`complete`, the job's path), in the same run."""
    import ray

    from actors.endpoint_serve import serve_fleet

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = EndpointConfig(port=0, max_waiting=1024, model_name="smollm2")
        server = serve_fleet(
            checkpoint, cfg, instances=1, max_batch=clients, prefix_cache_tokens=0, engine=engine
        )
        (instance,) = server.instances.values()
        tokenizer, _ = load_prompting(checkpoint)
        url = server.base_url.removesuffix("/v1")

        def on_instance(n: int, t: int, s: int) -> dict[str, float]:
            reqs = requests(tokenizer, n, t, s)
            start_t = time.perf_counter()
            produced = sum(x.num_tokens for x in ray.get(instance.complete.remote(reqs)))
            wall = time.perf_counter() - start_t
            return {"wall_s": wall, "tokens": produced, "tokens_per_s": produced / wall}

        on_instance(8, 8, seed)  # warm-up
        stream_load(url, "smollm2", 8, 8, seed)
        runs = []
        for r in range(repeats):
            d = on_instance(clients, tokens, seed + 1000 * r)
            e = stream_load(url, "smollm2", clients, tokens, seed + 1000 * r)
            runs.append({"direct": d, "endpoint": e, "ratio": e["tokens_per_s"] / d["tokens_per_s"]})
        server.stop()
        return runs
    finally:
        ray.shutdown()


def _aborted(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("rlsched_endpoint_aborted_total"):
            return float(line.split()[1])
    return 0.0


def abuse_run(args: argparse.Namespace) -> None:
    """`--abuse`: the flood of `scripts/_abuse.py` against an endpoint on the checkpoint."""
    served = local_served(args.checkpoint, model_name="smollm2", max_batch=args.clients)
    running = start(served, EndpointConfig(port=0, max_waiting=1024))
    sizes = {"seeds": 100, "bodies": 4, "rewards": 100, "streams": 200}
    try:
        url = f"http://{running.host}:{running.port}"
        httpx.post(
            f"{url}/v1/chat/completions", json={"model": "smollm2", "messages": messages(0), "max_tokens": 4}
        )
        result = abuse(url, "smollm2", sizes)
        left = {"running": served.backend.running, "waiting": served.backend.waiting}
    finally:
        running.stop()
    health = result["health"]
    rows = [[kind, str(sizes[kind]), ", ".join(f"{n} x {code}" for code, n in sorted(codes.items()))]
            for kind, codes in result["codes"].items()]  # fmt: skip
    table(
        f"abuse: one flood of {sum(sizes.values())} hostile requests, SmolLM2-135M",
        ["kind", "sent", "answers"],
        rows,
    )
    print(
        f"/health over {result['flood_s']} s of flood ({health['probes']} probes): "
        f"p50 {health['p50_ms']} ms, "
        f"p99 {health['p99_ms']} ms (goal < 100), max {health['max_ms']} ms; a normal request after the "
        f"flood: {result['normal_status']} in {result['normal_after_flood_s']} s (goal <= 2); "
        f"left running {left['running']}, waiting {left['waiting']}"
    )
    write(
        args.json.with_name(args.json.stem + "_abuse.json"),
        {
            "workload": {"checkpoint": str(args.checkpoint), "flood": sizes, "hold_s": result["hold_s"],
                         "machine": platform.processor() or platform.machine()},
            "seed": args.seed,
            "result": result,
            "left": left,
            "bound": "/health p99 under 100 ms during the flood; a normal request within 2 s of its end",
        },
    )  # fmt: skip


def main() -> None:
    ap = parser(__doc__, "bench_endpoint")
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--abuse", action="store_true", help="the hostile flood instead (scripts/_abuse.py says what)"
    )
    ap.add_argument(
        "--engine", choices=["torch", "vllm"], default="torch", help="vllm: run in .venv-vllm (above)"
    )
    ap.add_argument(
        "--grammar",
        action="store_true",
        help="constrained decoding's cost instead (scripts/_bench_grammar.py)",
    )
    args = ap.parse_args()
    if not args.checkpoint.is_dir():
        raise SystemExit(f"{args.checkpoint} is missing: run `make model-smollm2` first")
    if args.abuse:
        abuse_run(args)
        return
    if args.grammar:
        grammar_run(args)
        return
    if args.engine == "vllm":
        vllm_run(args)
        return
    served = local_served(
        args.checkpoint, model_name="smollm2", max_batch=args.clients, prefix_cache_tokens=0
    )
    running = start(served, EndpointConfig(port=0, max_waiting=1024))
    try:
        runs = paired(running, args)
        limit = refusals(running, args.clients, 8)
        left = disconnects(running, 16)
    finally:
        running.stop()
    del served, running
    fleet_runs = fleet(args.checkpoint, args.clients, args.tokens, args.repeats, args.seed)

    def med(key: str, sub: str, of: list[dict[str, Any]] = runs) -> float:
        return statistics.median(run[sub][key] for run in of)

    ratio = statistics.median(run["ratio"] for run in runs)
    fleet_ratio = statistics.median(run["ratio"] for run in fleet_runs)

    def stream_row(name: str, of: list[dict[str, Any]], r: float) -> list[str]:
        return [
            name,
            f"{med('tokens_per_s', 'endpoint', of):.0f}",
            f"{med('wall_s', 'endpoint', of):.2f}",
            f"{med('ttft_p50_s', 'endpoint', of) * 1e3:.0f}",
            f"{med('ttft_p99_s', 'endpoint', of) * 1e3:.0f}",
            f"{med('itl_p50_s', 'endpoint', of) * 1e3:.0f}",
            f"{med('itl_p99_s', 'endpoint', of) * 1e3:.0f}",
            f"{r:.3f}",
        ]

    rows = [
        [
            "direct",
            f"{med('tokens_per_s', 'direct'):.0f}",
            f"{med('wall_s', 'direct'):.2f}",
            "-",
            "-",
            "-",
            "-",
            "1.00",
        ],
        stream_row("endpoint", runs, ratio),
        [
            "fleet: instance direct",
            f"{med('tokens_per_s', 'direct', fleet_runs):.0f}",
            f"{med('wall_s', 'direct', fleet_runs):.2f}",
            *["-"] * 4,
            "1.00",
        ],
        stream_row("fleet: endpoint", fleet_runs, fleet_ratio),
    ]
    table(
        f"{args.clients} clients x {args.tokens} tokens, SmolLM2-135M ({torch.get_num_threads()} threads), "
        f"median of {args.repeats}",
        ["path", "tok/s", "wall s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "of direct"],
        rows,
        width=120,
    )
    print(
        f"overhead {1 - ratio:.1%} in process, {1 - fleet_ratio:.1%} over the fleet (goal <= 10%); "
        f"429: {limit['refused_429']} of {limit['sent']} refused "
        f"(Retry-After {limit['retry_after']}), {limit['served']} served; disconnects: "
        f"{left['aborted']:.0f} of {left['clients']} aborted, {left['left_running']} running and "
        f"{left['left_waiting']} waiting after"
    )
    write(
        args.json,
        {
            "workload": {
                "checkpoint": str(args.checkpoint),
                "clients": args.clients,
                "tokens": args.tokens,
                "repeats": args.repeats,
                "sampling": "temperature 1, seed per request, ignore_eos",
                "machine": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
            },
            "seed": args.seed,
            "runs": runs,
            "bound": "direct: the same requests to TorchRolloutEngine.generate in the same run",
            "endpoint_over_direct_median": ratio,
            "overhead_median": 1 - ratio,
            "fleet_runs": fleet_runs,
            "fleet_bound": "the same requests to the rollout instance's `complete` over Ray, in the same run",
            "fleet_endpoint_over_direct_median": fleet_ratio,
            "fleet_overhead_median": 1 - fleet_ratio,
            "goal_overhead": 0.10,
            "queue_limit": limit,
            "disconnects": left,
        },
    )


def vllm_run(args: argparse.Namespace) -> None:
    """`--engine vllm`: `rlsched serve --engine vllm` in process, then a job's endpoint over one vLLM
    rollout instance, each against its own bound, in one run."""
    from rlsched.config import EngineKind

    served = local_served(
        args.checkpoint, model_name="smollm2", max_batch=args.clients, engine=EngineKind.VLLM
    )
    running = start(served, EndpointConfig(port=0, max_waiting=1024))
    try:
        runs = paired(running, args)
    finally:
        running.stop()
    del served, running
    fleet_runs = fleet(args.checkpoint, args.clients, args.tokens, args.repeats, args.seed, engine="vllm")

    def med(of: list[dict[str, Any]], sub: str, key: str) -> float:
        return statistics.median(run[sub][key] for run in of)

    serve_ratio = statistics.median(run["ratio"] for run in runs)
    fleet_ratio = statistics.median(run["ratio"] for run in fleet_runs)
    against_serve = med(fleet_runs, "endpoint", "tokens_per_s") / med(runs, "endpoint", "tokens_per_s")
    rows = [
        [name, f"{med(of, sub, 'tokens_per_s'):.0f}", f"{med(of, sub, 'wall_s'):.2f}",
         *(f"{med(of, sub, k) * 1e3:.0f}" if sub == "endpoint" else "-"
           for k in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")), ratio]
        for name, of, sub, ratio in [
            ("vLLM engine direct", runs, "direct", "1.00"),
            ("rlsched serve --engine vllm", runs, "endpoint", f"{serve_ratio:.3f}"),
            ("fleet: vLLM instance direct", fleet_runs, "direct", "1.00"),
            ("fleet: endpoint", fleet_runs, "endpoint", f"{fleet_ratio:.3f}"),
        ]
    ]  # fmt: skip
    table(
        f"{args.clients} clients x {args.tokens} tokens, SmolLM2-135M on vLLM, median of {args.repeats}",
        ["path", "tok/s", "wall s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "of direct"],
        rows,
        width=120,
    )
    print(
        f"overhead {1 - serve_ratio:.1%} in process, {1 - fleet_ratio:.1%} over the fleet; the fleet's "
        f"endpoint streams {against_serve:.3f}x the tokens/s of `rlsched serve --engine vllm`"
    )
    write(
        args.json.with_name(args.json.stem + "_vllm.json"),
        {
            "workload": {
                "checkpoint": str(args.checkpoint), "clients": args.clients, "tokens": args.tokens,
                "repeats": args.repeats, "engine": "vllm",
                "sampling": "temperature 1, seed per request, ignore_eos",
                "machine": platform.processor() or platform.machine(),
            },
            "seed": args.seed,
            "runs": runs,
            "bound": "direct: the same requests to VllmRolloutEngine.generate in the same run",
            "serve_overhead_median": 1 - serve_ratio,
            "fleet_runs": fleet_runs,
            "fleet_bound": "the same requests to the vLLM rollout instance's `complete` over Ray",
            "fleet_overhead_median": 1 - fleet_ratio,
            "fleet_over_serve_endpoint": against_serve,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
