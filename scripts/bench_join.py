"""Publish and join of a real checkpoint's weights to N rollout instances, against the link bound.

    .venv/bin/python scripts/bench_join.py [--checkpoint models/smollm2-135m-instruct]
        [--receivers 1 2 4] [--egress-gbps 4] [--ingress-gbps 4] [--json OUT]

What a job does at each version, with separate processes on loopback: the sender (the trainer's
rank 0) loads the checkpoint, turns its state dict into BF16 safetensors bytes and publishes them to
its `WeightService` with a shaped egress of `--egress-gbps` (the publish time is both steps). Each
receiver process holds a torch engine on the checkpoint (BF16), connects, then on the start signal
pulls the version over a `--ingress-gbps` link (TCP data plane, every chunk's hash checked), loads
the tensors into its engine by name and confirms the engine's checksum against the published
SHA-256: the join. Per N: the slowest transfer and join, the median load and confirm, and the bound
`max(S / r, N x S / E)` of `rlsched.policy.bandwidth.all_receivers_bound` (efficiency = bound /
slowest transfer). Writes bench_results/bench_join.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _bench import parser, write
from bench_weights import run_receivers  # scripts/ is on the path when this script runs
from rich.console import Console
from rich.table import Table

GBIT = 1e9


def sender_main(conn: Connection, checkpoint: str, egress_bps: float) -> None:
    import torch

    from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes
    from rlsched.transfer.service import WeightService

    torch.set_num_threads(1)
    model = load_checkpoint(Path(checkpoint)).model
    service = WeightService(egress_bps=egress_bps)
    start = time.monotonic()
    blob = to_bf16_bytes(model)
    serialized = time.monotonic()
    manifest = service.publish(1, blob)
    done = time.monotonic()
    conn.send((service.address, len(blob), manifest.sha256, serialized - start, done - start))
    conn.recv()  # stop
    service.close()


def receiver_main(
    checkpoint: str, address: str, name: str, ingress: float, ready: Any, go: Any, out: Any
) -> None:
    import torch

    from rlsched.engine.protocol import WeightVersion
    from rlsched.engine.torch_engine import TorchRolloutEngine
    from rlsched.model.checkpoint import load_checkpoint
    from rlsched.transfer.client import Plane, WeightClient

    torch.set_num_threads(1)
    ck = load_checkpoint(Path(checkpoint), dtype=torch.bfloat16)
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=8)
    with WeightClient(address) as client:
        buffer = bytearray(client.manifest(1).nbytes)
        ready.put(name)
        go.wait()
        t0 = time.monotonic()
        pulled = client.pull(1, receiver=name, ingress_bps=ingress, plane=Plane.TCP, buffer=buffer)
        t1 = time.monotonic()
        loaded = engine.load_weights(bytes(pulled.blob), WeightVersion(1))
        t2 = time.monotonic()
        ok = pulled.stats.confirmed and loaded == pulled.assembly.manifest.sha256
        t3 = time.monotonic()
    out.put({"name": name, "start": t0, "transfer_s": t1 - t0, "load_s": t2 - t1, "confirm_s": t3 - t2,
             "end": t3, "confirmed": ok})  # fmt: skip


def run(ctx: Any, args: argparse.Namespace, address: str, n: int) -> list[dict[str, Any]]:
    """N receivers started together once each has its engine loaded and its buffer allocated."""
    ingress = args.ingress_gbps * GBIT
    targets = [(receiver_main, (str(args.checkpoint), address, f"r{i}", ingress)) for i in range(n)]
    return list(run_receivers(ctx, targets))  # type: ignore[arg-type]


def main() -> int:
    ap = parser(__doc__, "bench_join")
    ap.add_argument("--checkpoint", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--egress-gbps", type=float, default=4.0)
    ap.add_argument("--ingress-gbps", type=float, default=4.0)
    args = ap.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        print(f"{args.checkpoint} not found: run `make model-smollm2`, or pass --checkpoint DIR")
        return 2
    from rlsched.policy.bandwidth import all_receivers_bound

    console = Console(width=120)
    ctx = mp.get_context("spawn")
    ctl, remote = ctx.Pipe()
    sender = ctx.Process(target=sender_main, args=(remote, str(args.checkpoint), args.egress_gbps * GBIT))
    sender.start()
    address, nbytes, sha, serialize_s, publish_s = ctl.recv()
    console.print(
        f"published {nbytes / 1e6:.1f} MB in {publish_s:.2f} s (BF16 bytes {serialize_s:.2f} s) at {address}"
    )
    rows = []
    for n in args.receivers:
        got = run(ctx, args, address, n)
        t0 = min(g["start"] for g in got)
        bound = all_receivers_bound(nbytes, [args.ingress_gbps * GBIT] * n, args.egress_gbps * GBIT)
        transfer = max(g["start"] + g["transfer_s"] - t0 for g in got)
        join = max(g["end"] - t0 for g in got)
        rows.append({
            "receivers": n, "bound_s": bound, "transfer_s": transfer, "efficiency": bound / transfer,
            "load_s": statistics.median(g["load_s"] for g in got),
            "confirm_s": statistics.median(g["confirm_s"] for g in got),
            "join_s": join, "join_vs_bound": join / bound, "all_confirmed": all(g["confirmed"] for g in got),
        })  # fmt: skip
        console.print(f"N={n}: {rows[-1]}")
    ctl.send("stop")
    sender.join()
    table = Table(
        title=f"publish and join of {args.checkpoint.name}: {nbytes / 1e6:.0f} MB BF16, "
        f"egress {args.egress_gbps:g} Gbit/s, ingress {args.ingress_gbps:g} Gbit/s"
    )
    for col in (
        "N",
        "bound s",
        "slowest transfer s",
        "efficiency",
        "load s",
        "confirm s",
        "join s",
        "join / bound",
        "confirmed",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["receivers"]), f"{r['bound_s']:.2f}", f"{r['transfer_s']:.2f}", f"{r['efficiency']:.3f}",
            f"{r['load_s']:.2f}", f"{r['confirm_s']:.3f}", f"{r['join_s']:.2f}", f"{r['join_vs_bound']:.2f}",
            str(r["all_confirmed"]),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"publish: {publish_s:.2f} s for {nbytes / 1e6:.0f} MB (state dict to BF16 bytes {serialize_s:.2f} s)"
    )
    write(
        args.json,
        {
            "benchmark": "bench_join",
            "workload": {
                "checkpoint": str(args.checkpoint),
                "nbytes": nbytes,
                "sha256": sha,
                "egress_gbps": args.egress_gbps,
                "ingress_gbps": args.ingress_gbps,
            },
            "publish_s": publish_s,
            "serialize_s": serialize_s,
            "bound": "max(S / r, N x S / E) (rlsched.policy.bandwidth.all_receivers_bound)",
            "results": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
