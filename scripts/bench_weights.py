"""Weights over the weight service on loopback: shaped transfers against the link model, and the
unshaped data path against a raw TCP socket.

    .venv/bin/python scripts/bench_weights.py [--mb 256] [--repeats 7] [--receivers 1,2,4,8] [--seed 0]
        [--json OUT]

Workload: a BF16 safetensors tensor set of `--mb` MiB (8 MiB tensors, values from `--seed`),
published by a `WeightService` in its own process; receivers are processes of their own that pull
it with `rlsched.transfer.client` (TCP data plane, every chunk's hash checked, the whole SHA-256
confirmed after the clock stops).

Shaped: N = 1, 2, 4, 8 receivers started together, in two cases.
  - receiver-bound: ingress caps alternate 1 and 0.5 Gbit/s, the egress (1.5 N Gbit/s) never binds;
  - egress-bound: a 4 Gbit/s egress, the even receivers uncapped and the odd ones capped at 0.75 of
    a fair share (4/N Gbit/s), so max-min sharing hands their leftover to the others.
  Efficiency = the model's all-receivers bound `max(max_i S/r_i, N S/E)` / the measured time from
  the first stream to the last verified byte; each receiver's finish is compared with the max-min
  model (`rlsched.policy.bandwidth.finish_times`, fed the measured stream start times).
Unshaped: `--repeats` rounds, each in one receiver process that pulls once per peer (raw socket,
TCP data plane, gRPC messages; each peer first in turn) into the same buffer; medians of
throughput and of CPU-seconds per GB in the sender's and the receiver's process. The raw
socket peer sends the same bytes with one `sendall` and receives with `recv_into` (4 MiB per call,
MSG_WAITALL, as the data plane does) into a preallocated buffer, checking nothing.
Writes bench_results/bench_weights.json.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.policy.bandwidth import Flow, all_receivers_bound, finish_times
from rlsched.transfer.client import Plane, WeightClient

GBIT = 1e9
TENSOR_MIB = 8


def make_blob(mib: int, seed: int) -> bytes:
    import torch
    from safetensors.torch import save

    gen = torch.Generator().manual_seed(seed)
    n = max(1, mib // TENSOR_MIB)
    side = int((TENSOR_MIB * 2**20 / 2) ** 0.5)
    tensors = {
        f"layers.{i}.weight": torch.randn(side, side, generator=gen).to(torch.bfloat16) for i in range(n)
    }
    return save(tensors, metadata={"format": "pt"})


# -- the sender's process -------------------------------------------------------------------------
def sender_main(conn: Connection, mib: int, seed: int) -> None:
    from rlsched.transfer.service import WeightService

    blob = make_blob(mib, seed)
    service = WeightService(egress_bps=None)
    service.publish(1, blob)
    raw = socket.create_server(("127.0.0.1", 0))

    def raw_loop() -> None:
        while True:
            c, _ = raw.accept()
            with c:
                c.sendall(memoryview(blob))

    threading.Thread(target=raw_loop, daemon=True).start()
    conn.send((service.address, raw.getsockname()[1], len(blob)))
    while True:
        cmd, arg = conn.recv()
        if cmd == "egress":
            service.reshape(arg)
            conn.send(None)
        elif cmd == "cpu":
            conn.send(time.process_time())
        elif cmd == "slow":
            conn.send([str(s) for s in service.shaper.slow])
        else:
            service.close()
            conn.send(None)
            return


# -- a receiver's process -------------------------------------------------------------------------
def receiver_main(address: str, name: str, ingress: float, plane: str, ready: Any, go: Any, out: Any) -> None:
    with WeightClient(address) as client:
        buffer = bytearray(client.manifest(1).nbytes)  # connected and allocated before the start
        ready.put(name)
        go.wait()
        pulled = client.pull(1, receiver=name, ingress_bps=ingress, plane=Plane(plane), buffer=buffer)
    s = pulled.stats
    out.put((name, s.data_started, s.data_finished, s.confirmed, s.streams, s.data_cpu_s))


def run_receivers(ctx: Any, targets: list[tuple[Any, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, ready, go, out)) for t, a in targets]
    for p in procs:
        p.start()
    for _ in procs:  # every receiver started, connected, its buffer allocated
        ready.get(timeout=300)
    time.sleep(0.2)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return results


# -- shaped ---------------------------------------------------------------------------------------
def shaped_case(case: str, n: int) -> tuple[float, list[float]]:
    if case == "receiver-bound":
        caps = [1.0 * GBIT if i % 2 == 0 else 0.5 * GBIT for i in range(n)]
        return 1.5 * n * GBIT, caps
    egress = 4.0 * GBIT
    return egress, [egress if i % 2 == 0 else 0.75 * egress / n for i in range(n)]


def run_shaped(ctx: Any, ctl: Connection, address: str, nbytes: int, case: str, n: int) -> dict[str, Any]:
    egress, caps = shaped_case(case, n)
    ctl.send(("egress", egress))
    ctl.recv()
    names = [f"r{i}" for i in range(n)]
    got = run_receivers(
        ctx, [(receiver_main, (address, name, cap, "tcp")) for name, cap in zip(names, caps, strict=True)]
    )
    by = {g[0]: g for g in got}
    t0 = min(g[1] for g in got)
    flows = [Flow(name, nbytes, cap, by[name][1] - t0) for name, cap in zip(names, caps, strict=True)]
    model = finish_times(flows, egress)
    measured = {name: by[name][2] - t0 for name in names}
    bound = all_receivers_bound(nbytes, caps, egress)
    ctl.send(("slow", None))
    return {
        "case": case,
        "receivers": n,
        "egress_gbps": egress / GBIT,
        "ingress_gbps": [c / GBIT for c in caps],
        "bound_s": bound,
        "measured_s": max(measured.values()),
        "efficiency": bound / max(measured.values()),
        "finish_s": measured,
        "model_s": model,
        "worst_finish_error": max(abs(measured[k] - model[k]) / model[k] for k in names),
        "all_confirmed": all(g[3] for g in got),
        "slow_receivers": ctl.recv(),
    }


# -- unshaped -------------------------------------------------------------------------------------
def unshaped_round_main(
    ctl: Connection, address: str, raw_port: int, nbytes: int, order: list[str], out: Any
) -> None:
    """One round in one receiver process: each peer once, in `order`, into the same buffer, with
    the sender's CPU read around each transfer (the peers share the process, its gRPC channel
    included, so none is favoured by a warmer or lighter process)."""
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    gb = nbytes / 1e9
    results = {}
    with WeightClient(address) as client:
        client.manifest(1)
        for peer in order:
            ctl.send(("cpu", None))
            sender0 = ctl.recv()
            if peer == "raw":
                cpu, start, at = time.process_time(), time.monotonic(), 0
                with socket.create_connection(("127.0.0.1", raw_port)) as s:
                    while at < nbytes:
                        at += s.recv_into(view[at:], min(4 << 20, nbytes - at), socket.MSG_WAITALL)
                seconds, receiver_cpu = time.monotonic() - start, time.process_time() - cpu
            else:
                stats = client.pull(1, receiver="r0", plane=Plane(peer), buffer=buffer).stats
                seconds, receiver_cpu = stats.seconds, stats.data_cpu_s
            ctl.send(("cpu", None))
            results[peer] = {
                "gbps": 8 * gb / seconds,
                "sender_cpu_s_per_gb": (ctl.recv() - sender0) / gb,
                "receiver_cpu_s_per_gb": receiver_cpu / gb,
            }
    out.put(results)


def run_unshaped_round(
    ctx: Any, ctl: Connection, address: str, raw_port: int, nbytes: int, order: list[str]
) -> dict[str, dict[str, float]]:
    out = ctx.Queue()
    proc = ctx.Process(target=unshaped_round_main, args=(ctl, address, raw_port, nbytes, order, out))
    proc.start()
    results: dict[str, dict[str, float]] = out.get(timeout=600)
    proc.join()
    return results


def main() -> None:
    ap = parser(__doc__, "bench_weights")
    ap.add_argument("--mb", type=int, default=256, help="MiB of BF16 weights (at least 256 for the goal)")
    ap.add_argument("--repeats", type=int, default=7, help="rounds of the unshaped comparison")
    ap.add_argument("--receivers", default="1,2,4,8", help="the shaped runs' receiver counts")
    args = ap.parse_args()
    console = Console(width=120)
    ctx = mp.get_context("spawn")
    ctl, remote = ctx.Pipe()
    sender = ctx.Process(target=sender_main, args=(remote, args.mb, args.seed))
    sender.start()
    address, raw_port, nbytes = ctl.recv()
    console.print(f"publishing {nbytes / 2**20:.0f} MiB of BF16 weights at {address}")

    ctl.send(("egress", None))
    ctl.recv()
    peers = ("raw", "tcp", "grpc")
    rounds: dict[str, list[dict[str, float]]] = {p: [] for p in peers}
    for r in range(args.repeats):
        order = list(peers[r % 3 :] + peers[: r % 3])  # each peer goes first in turn
        got = run_unshaped_round(ctx, ctl, address, raw_port, nbytes, order)
        for peer in peers:
            rounds[peer].append(got[peer])
        console.print(
            f"unshaped round {r + 1}/{args.repeats}: "
            + ", ".join(f"{p} {rounds[p][-1]['gbps']:.2f} Gbit/s" for p in peers)
        )
    unshaped = {
        p: {k: statistics.median(x[k] for x in rounds[p]) for k in rounds[p][0]} | {"runs": rounds[p]}
        for p in peers
    }
    shaped = []
    for case in ("receiver-bound", "egress-bound"):
        for n in (int(k) for k in args.receivers.split(",") if k):
            res = run_shaped(ctx, ctl, address, nbytes, case, n)
            console.print(
                f"shaped {case} N={n}: {res['measured_s']:.2f} s, bound {res['bound_s']:.2f} s, "
                f"efficiency {res['efficiency']:.3f}, worst finish off {res['worst_finish_error']:.1%}"
            )
            shaped.append(res)
    ctl.send(("stop", None))
    ctl.recv()
    sender.join()

    table = Table(title=f"weights: {nbytes / 2**20:.0f} MiB BF16, loopback, seed {args.seed}")
    for col in (
        "run",
        "measured",
        "bound / raw",
        "ratio",
        "finish vs model",
        "sender CPU s/GB",
        "receiver CPU s/GB",
    ):
        table.add_column(col, justify="right" if col != "run" else "left")
    raw = unshaped["raw"]["gbps"]
    for p in peers:
        u = unshaped[p]
        table.add_row(
            f"unshaped {p}",
            f"{u['gbps']:.2f} Gbit/s",
            f"{raw:.2f} Gbit/s",
            f"{u['gbps'] / raw:.3f}",
            "",
            f"{u['sender_cpu_s_per_gb']:.2f}",
            f"{u['receiver_cpu_s_per_gb']:.2f}",
        )
    for s in shaped:
        table.add_row(
            f"{s['case']} N={s['receivers']}",
            f"{s['measured_s']:.2f} s",
            f"{s['bound_s']:.2f} s",
            f"{s['efficiency']:.3f}",
            f"worst {100 * s['worst_finish_error']:.1f}%",
            "",
            "",
        )
    console.print(table)
    console.print(
        "ratio: unshaped rows, throughput / raw socket (goal >= 0.80 for tcp); shaped rows, efficiency = "
        "bound / measured (goal >= 0.90); finish vs model: worst per-receiver error (goal within 10%)"
    )
    write(
        args.json,
        {
            "workload": {"mib": args.mb, "nbytes": nbytes, "seed": args.seed, "repeats": args.repeats},
            "unshaped": unshaped,
            "tcp_vs_raw": unshaped["tcp"]["gbps"] / raw,
            "tcp_vs_raw_median_of_rounds": statistics.median(
                t["gbps"] / r["gbps"] for t, r in zip(rounds["tcp"], rounds["raw"], strict=True)
            ),
            "grpc_vs_raw": unshaped["grpc"]["gbps"] / raw,
            "shaped": shaped,
            "goals": {"efficiency": 0.90, "finish_error": 0.10, "tcp_vs_raw": 0.80},
        },
    )


if __name__ == "__main__":
    sys.exit(main())
