"""One weight version fanned out to N receivers on loopback, by the sender alone and with receivers
relaying, against the peer-to-peer bound.

    .venv/bin/python scripts/bench_fanout.py [--receivers 1 2 4 8] [--gbps 0.5] [--chunk-kb 4096]
        [--checkpoint models/smollm2-135m-instruct] [--modes sender relay]

Workload: SmolLM2-135M's BF16 safetensors bytes (269 MB; random bytes of the same size where the
checkpoint is not imported), published by a `WeightService` in its own process with its egress
shaped to E. Each receiver is a process of its own with its ingress capped at r and, with relays,
a service of its own whose egress (its upload) is capped at u; E = r = u = `--gbps`, the egress-bound
setting where the sender alone needs N S / E. The relay plan is `rlsched.policy.bandwidth.relay_plan`
(here one pipelined chain); each receiver pulls from the one before it (`WeightClient.pull`'s
`relays`), which serves its verified chunks as they arrive, and falls back to the sender.

Figures: the time from the first stream opened to the last chunk verified (all receivers started
together), every receiver's SHA-256 confirmed after the clock stops, against the bound:
sender alone `max(S/r, N S/E)`; relayed, Kumar and Ross's `max(S/E, S/r, N S/(E + sum u))`.
Efficiency = bound / measured. Writes bench_results/bench_fanout.json.
"""

from __future__ import annotations

import multiprocessing as mp
import platform
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _bench import parser, table, write

from rlsched.policy.bandwidth import all_receivers_bound, p2p_bound, relay_plan
from rlsched.transfer.client import WeightClient

GBIT = 1e9


def weights(checkpoint: Path, seed: int) -> bytes:
    path = checkpoint / "model.safetensors"
    if path.is_file():
        return path.read_bytes()
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    return save({"weight": rng.integers(0, 2**16, 269_060_552 // 2 - 64, dtype=np.uint16)})


def sender_main(conn: Connection, checkpoint: str, seed: int, egress: float, chunk: int) -> None:
    from rlsched.transfer.service import WeightService

    service = WeightService(egress_bps=egress, chunk_bytes=chunk)
    service.publish(1, weights(Path(checkpoint), seed))
    conn.send(service.address)
    conn.recv()  # until the run is over
    service.close()


def receiver_main(
    name: str, origin: str, ingress: float, upload: float | None, chunk: int, inbox: Any, ready: Any, out: Any
) -> None:
    from rlsched.transfer.service import WeightService

    relay = WeightService(egress_bps=upload, chunk_bytes=chunk) if upload else None
    with WeightClient(origin) as client:
        buffer = bytearray(client.manifest(1).nbytes)  # connected and allocated before the start
        if relay:
            relay.expect(1)  # receivers behind it may ask before its own pull begins
        ready.put((name, relay.address if relay else None))
        sources, go_at = inbox.get()
        while time.monotonic() < go_at:
            time.sleep(0.001)
        pulled = client.pull(
            1,
            receiver=name,
            ingress_bps=ingress,
            buffer=buffer,
            relays=sources,
            on_assembly=relay.relay if relay else None,
        )
    s = pulled.stats
    out.put((name, s.data_started, s.data_finished, s.confirmed, s.sources, s.left))
    inbox.get()  # keep relaying until every receiver is done
    if relay:
        relay.close()


def run(args: Any, n: int, relayed: bool, nbytes: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    rate, chunk = args.gbps * GBIT, args.chunk_kb << 10
    ctl, child = ctx.Pipe()
    sender = ctx.Process(target=sender_main, args=(child, str(args.checkpoint), args.seed, rate, chunk))
    sender.start()
    origin = ctl.recv()
    ready, out = ctx.Queue(), ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    names = [f"r{i}" for i in range(n)]
    upload = rate if relayed else None
    procs = [
        ctx.Process(target=receiver_main, args=(name, origin, rate, upload, chunk, inbox, ready, out))
        for name, inbox in zip(names, inboxes, strict=True)
    ]
    for p in procs:
        p.start()
    relays = dict(ready.get(timeout=300) for _ in procs)
    plan = relay_plan(nbytes, chunk, [rate] * n, rate, [rate if relayed else 0.0] * n)
    go_at = time.monotonic() + 0.3
    for i, inbox in enumerate(inboxes):
        src = plan.source(i)
        inbox.put(([relays[names[src]]] if src is not None else [], go_at))
    got = {g[0]: g for g in (out.get(timeout=600) for _ in procs)}
    for inbox in inboxes:
        inbox.put(None)
    for p in procs:
        p.join(60)
    ctl.send(None)
    sender.join(60)
    start = min(g[1] for g in got.values())
    measured = max(g[2] for g in got.values()) - start
    ups = [rate if relayed else 0.0] * n
    bound = (
        p2p_bound(nbytes, [rate] * n, rate, ups) if relayed else all_receivers_bound(nbytes, [rate] * n, rate)
    )
    return {
        "mode": "relay" if relayed else "sender",
        "receivers": n,
        "chains": [list(c) for c in plan.chains],
        "measured_s": round(measured, 3),
        "model_s": round(plan.all_s, 3),
        "bound_s": round(bound, 3),
        "efficiency": round(bound / measured, 3),
        "confirmed": all(g[3] for g in got.values()),
        "fallbacks": sum(len(g[5]) for g in got.values()),
        "left": [why for g in got.values() for why in g[5]],
        "finish_s": {name: round(got[name][2] - start, 3) for name in names},
    }


def main() -> None:
    ap = parser(__doc__, "bench_fanout")
    ap.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--gbps", type=float, default=0.5, help="E = r = u, Gbit/s")
    ap.add_argument("--chunk-kb", type=int, default=4096)
    ap.add_argument("--checkpoint", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--modes", nargs="+", choices=["sender", "relay"], default=["relay", "sender"])
    args = ap.parse_args()
    nbytes = len(weights(args.checkpoint, args.seed))
    rows = []
    for mode in args.modes:
        for n in args.receivers:
            rows.append(run(args, n, mode == "relay", nbytes))
            print({k: v for k, v in rows[-1].items() if k != "finish_s"}, flush=True)
    table(
        width=120,
        title=f"{nbytes / 1e6:.0f} MB to N receivers, E = r = u = {args.gbps} Gbit/s, "
        f"{args.chunk_kb} KiB chunks",
        columns=["mode", "N", "measured s", "model s", "bound s", "efficiency", "confirmed", "fallbacks"],
        rows=[[r["mode"], r["receivers"], f"{r['measured_s']:.2f}", f"{r['model_s']:.2f}",
               f"{r['bound_s']:.2f}", f"{r['efficiency']:.3f}", r["confirmed"], r["fallbacks"]]
              for r in rows],
    )  # fmt: skip
    write(
        args.json,
        {
            "benchmark": "bench_fanout",
            "workload": {"bytes": nbytes, "gbps": args.gbps, "chunk_kb": args.chunk_kb,
                         "checkpoint": str(args.checkpoint)},
            "seed": args.seed,
            "machine": platform.platform(),
            "bound": {"sender": "max(S/r, N S/E)", "relay": "max(S/E, S/r, N S/(E + sum u))"},
            "results": rows,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
