"""One weight version fanned out to N receivers on loopback, by the sender alone and with receivers
relaying, against the peer-to-peer bound.

    .venv/bin/python scripts/bench_fanout.py [--receivers 1 2 4 8] [--gbps 0.5] [--chunk-kb 4096]
        [--checkpoint models/smollm2-135m-instruct] [--modes sender relay] [--ready]
        [--loads sequential staged]

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
Efficiency = bound / measured.

`--ready` measures the whole update instead: each receiver is a rollout `Instance` (the torch engine
on the checkpoint, in its own process, relaying with `start_relay` where relays are on) and the
clock runs from "update done" (the version is published and every instance is told at once) to
"all N READY at v+1" (the last `join` confirmed: transferred, loaded, checksum matched). Each
setting runs twice, loading sequentially (after the whole file) and staged (each tensor as its
bytes are verified, swapped in at the end), and reports how much of the sequential load the staged
one hid: (transfer + sequential load - staged time to READY) / sequential load, with the staged
run's own transfer time; and the instances' CPU share (their CPU seconds over cores x time), which
says when the machine rather than the link sets the time. The published
version is the checkpoint's model, perturbed, as BF16 (`to_bf16_bytes`), so every load changes
every weight. Writes bench_results/bench_fanout.json (bench_fanout_ready.json with --ready).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import time
from collections.abc import Callable
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

    blob = weights(Path(checkpoint), seed)
    service = WeightService(egress_bps=egress, chunk_bytes=chunk)
    service.publish(1, blob)
    conn.send((service.address, len(blob)))
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


def update_blob(checkpoint: Path, seed: int) -> bytes:
    """Version 1 of the checkpoint's model: every weight nudged, as the BF16 bytes a trainer publishes."""
    import torch

    from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes

    model = load_checkpoint(checkpoint).model
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=gen).to(p.dtype))
    return to_bf16_bytes(model)


def ready_sender_main(conn: Connection, checkpoint: str, seed: int, egress: float, chunk: int) -> None:
    from rlsched.transfer.service import WeightService

    blob = update_blob(Path(checkpoint), seed)
    service = WeightService(egress_bps=egress, chunk_bytes=chunk)
    service.publish(1, blob)
    conn.send((service.address, len(blob)))
    conn.recv()
    service.close()


def instance_main(
    name: str, origin: str, checkpoint: str, ingress: float, upload: float, staged: bool, inbox: Any,
    ready: Any, out: Any,
) -> None:  # fmt: skip
    import torch

    from rlsched.rollout.instance import Instance

    torch.set_num_threads(1)
    inst = Instance(name, checkpoint, max_batch=8, use_cache=True, seed=0, stage=staged)
    relay = inst.start_relay(upload) if upload else None
    ready.put((name, relay))
    sources, go_at = inbox.get()
    while time.monotonic() < go_at:
        time.sleep(0.001)
    cpu = time.process_time()
    report = inst.join(origin, 1, ingress_bps=ingress, relays=sources)
    cpu = time.process_time() - cpu
    out.put((name, report.transfer[1], report.load[1] - report.load[0], report.confirm[1], report.staged,
             report.sources, int(inst.engine.version), str(inst.state), cpu))  # fmt: skip
    inbox.get()  # keep relaying until every instance is READY
    inst.release()


def fan_out(
    args: Any,
    n: int,
    relayed: bool,
    sender: Callable[..., None],
    receiver: Callable[..., None],
    extra: tuple[Any, ...],
) -> tuple[dict[str, Any], float, Any, str, int]:
    """The sender's process, then N receivers' (`receiver(name, origin, *extra, inbox, ready, out)`),
    each told its relay (the plan's source) and one start time; what each put in `out`, by name."""
    ctx = mp.get_context("spawn")
    rate, chunk = args.gbps * GBIT, args.chunk_kb << 10
    ctl, child = ctx.Pipe()
    proc = ctx.Process(target=sender, args=(child, str(args.checkpoint), args.seed, rate, chunk))
    proc.start()
    origin, nbytes = ctl.recv()
    ready, out = ctx.Queue(), ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    names = [f"r{i}" for i in range(n)]
    procs = [
        ctx.Process(target=receiver, args=(name, origin, *extra, inbox, ready, out))
        for name, inbox in zip(names, inboxes, strict=True)
    ]
    for p in procs:
        p.start()
    relays = dict(ready.get(timeout=600) for _ in procs)
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
    proc.join(60)
    return got, go_at, plan, origin, nbytes


def bound_s(nbytes: int, n: int, rate: float, relayed: bool) -> float:
    ins = [rate] * n
    return p2p_bound(nbytes, ins, rate, [rate] * n) if relayed else all_receivers_bound(nbytes, ins, rate)


def run_ready(args: Any, n: int, relayed: bool, staged: bool) -> dict[str, Any]:
    rate = args.gbps * GBIT
    extra = (str(args.checkpoint), rate, rate if relayed else 0.0, staged)
    got, go_at, _, origin, nbytes = fan_out(args, n, relayed, ready_sender_main, instance_main, extra)
    bound = bound_s(nbytes, n, rate, relayed)
    ready_s = max(g[3] for g in got.values()) - go_at
    return {
        "mode": "relay" if relayed else "sender",
        "load": "staged" if staged else "sequential",
        "receivers": n,
        "bytes": nbytes,
        "transfer_s": round(max(g[1] for g in got.values()) - go_at, 3),
        "load_tail_s": round(sorted(g[2] for g in got.values())[n // 2], 3),  # median
        "ready_s": round(ready_s, 3),
        "bound_s": round(bound, 3),
        "efficiency": round(bound / ready_s, 3),
        "all_ready_at_v1": all(g[6] == 1 and g[7] == "ready" for g in got.values()),
        "staged": all(g[4] for g in got.values()),
        "from_peers": sum(1 for g in got.values() if g[5] and g[5][0] != origin),
        "cpu_s": round(sum(g[8] for g in got.values()), 2),  # the instances' own, during their joins
        "cpu_share": round(sum(g[8] for g in got.values()) / (ready_s * (os.cpu_count() or 1)), 2),
    }


def ready_main(args: Any) -> None:
    rows = []
    for mode in args.modes:
        for n in args.receivers:
            pair = {}
            for staged in (False, True):
                if ("staged" if staged else "sequential") in args.loads:
                    pair[staged] = run_ready(args, n, mode == "relay", staged)
                    print(pair[staged], flush=True)
            rows += pair.values()
            if len(pair) < 2:
                continue
            seq, pip = pair[False], pair[True]
            # the (transfer + sequential load - staged READY) / sequential load, with the
            # staged run's own transfer (conservative: staging also spares the confirm's hashing)
            hidden = (pip["transfer_s"] + seq["load_tail_s"] - pip["ready_s"]) / max(seq["load_tail_s"], 1e-9)
            pip["hidden"] = round(hidden, 3)
    nbytes = rows[0]["bytes"]
    table(
        width=130,
        title=f"update done -> all N READY at v+1: {nbytes / 1e6:.0f} MB, E = r = u = {args.gbps} Gbit/s",
        columns=["mode", "N", "load", "transfer s", "load s", "READY s", "bound s", "efficiency", "hidden",
                 "all at v1", "from peers", "CPU share"],
        rows=[[r["mode"], r["receivers"], r["load"], f"{r['transfer_s']:.2f}", f"{r['load_tail_s']:.3f}",
               f"{r['ready_s']:.2f}", f"{r['bound_s']:.2f}", f"{r['efficiency']:.3f}",
               f"{r['hidden']:.2f}" if "hidden" in r else "", r["all_ready_at_v1"], r["from_peers"],
               f"{r['cpu_share']:.2f}"]
              for r in rows],
    )  # fmt: skip
    write(
        args.json.with_name("bench_fanout_ready.json"),
        {
            "benchmark": "bench_fanout --ready",
            "workload": {"bytes": nbytes, "gbps": args.gbps, "chunk_kb": args.chunk_kb,
                         "checkpoint": str(args.checkpoint), "engine": "torch"},
            "seed": args.seed,
            "machine": platform.platform(),
            "bound": {"sender": "max(S/r, N S/E)", "relay": "max(S/E, S/r, N S/(E + sum u))"},
            "hidden": "(staged transfer + sequential load - staged time to READY) / sequential load",
            "cpu_share": "the instances' CPU seconds during their joins / (cores x time to READY)",
            "results": rows,
        },
    )  # fmt: skip


def run(args: Any, n: int, relayed: bool) -> dict[str, Any]:
    rate = args.gbps * GBIT
    extra = (rate, rate if relayed else None, args.chunk_kb << 10)
    got, _, plan, _, nbytes = fan_out(args, n, relayed, sender_main, receiver_main, extra)
    start = min(g[1] for g in got.values())
    measured = max(g[2] for g in got.values()) - start
    bound = bound_s(nbytes, n, rate, relayed)
    return {
        "mode": "relay" if relayed else "sender",
        "receivers": n,
        "bytes": nbytes,
        "chains": [list(c) for c in plan.chains],
        "measured_s": round(measured, 3),
        "model_s": round(plan.all_s, 3),
        "bound_s": round(bound, 3),
        "efficiency": round(bound / measured, 3),
        "confirmed": all(g[3] for g in got.values()),
        "fallbacks": sum(len(g[5]) for g in got.values()),
        "left": [why for g in got.values() for why in g[5]],
        "finish_s": {name: round(g[2] - start, 3) for name, g in sorted(got.items())},
    }


def main() -> None:
    ap = parser(__doc__, "bench_fanout")
    ap.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--gbps", type=float, default=0.5, help="E = r = u, Gbit/s")
    ap.add_argument("--chunk-kb", type=int, default=4096)
    ap.add_argument("--checkpoint", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--modes", nargs="+", choices=["sender", "relay"], default=["relay", "sender"])
    ap.add_argument("--ready", action="store_true", help="whole updates to rollout instances, until READY")
    ap.add_argument(
        "--loads",
        nargs="+",
        choices=["sequential", "staged"],
        default=["sequential", "staged"],
        help="with --ready: which loads to run (hidden needs both)",
    )
    args = ap.parse_args()
    if args.ready:
        ready_main(args)
        return
    rows = []
    for mode in args.modes:
        for n in args.receivers:
            rows.append(run(args, n, mode == "relay"))
            print({k: v for k, v in rows[-1].items() if k != "finish_s"}, flush=True)
    nbytes = rows[0]["bytes"]
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
