"""How fast a sandbox timeout really stops the work, and what a plain subprocess timeout leaves behind.

    .venv/bin/python scripts/bench_sandbox.py [--runs 30] [--timeout 0.2] [--json OUT]

Workload: three hostile programs (an infinite loop, a double-forked setsid daemon, a 64-process fork
tree), each
run `--runs` times with a `--timeout`-second limit. For rlsched's sandbox (verifiers/sandbox.py) the
figure is the kill latency: from the kill to the launcher's exit observed and no live process left in
the run's PID namespace (scanned in /proc). The peer is `subprocess.run(..., timeout=...)`, the
timeout most RL reward code uses: its latency is from the timeout to `run` returning, and the figure
that matters is how many processes of the run are still alive afterwards (found by a marker in their
command line, then killed). Medians and p99 over the runs. Writes bench_results/bench_sandbox.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from verifiers.sandbox import SandboxLimits, namespaces_available, run_sandboxed

PROGRAMS = {
    "infinite loop": "while True: pass",
    "setsid daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)\n    os._exit(0)\ntime.sleep(600)"
    ),
    # a bounded fork tree (64 processes): a real bomb would take the machine down under the peer
    "fork tree": "import os, time\nfor _ in range(6):\n    os.fork()\ntime.sleep(600)",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in "ZX":
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def plain_subprocess(program: str, timeout: float) -> tuple[float, int]:
    marker = f"rlsched-bench-{uuid.uuid4().hex}"
    called = time.monotonic()
    latency = 0.0
    try:
        subprocess.run([sys.executable, "-c", program, marker], timeout=timeout, capture_output=True)
    except subprocess.TimeoutExpired:  # run() killed its child and waited: from the deadline to here
        latency = time.monotonic() - (called + timeout)
    survivors = marked(marker)
    for pid in survivors:  # clean up what the peer left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return latency, len(survivors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=0.2)
    ap.add_argument("--json", type=Path, default=Path("bench_results/bench_sandbox.json"))
    args = ap.parse_args()
    console = Console(width=120)
    if not namespaces_available():
        console.print("namespaces are not available here (needs root and unshare); measuring the fallback")
    limits = SandboxLimits(timeout_s=args.timeout)
    results: dict[str, dict[str, float]] = {}
    for name, program in PROGRAMS.items():
        ours, left = [], 0
        for _ in range(args.runs):
            r = run_sandboxed(program, limits)
            ours.append(r.kill_latency_s or 0.0)
            left += len(r.leftover_pids)
        peer, peer_left = [], 0
        for _ in range(args.runs):
            latency, survivors = plain_subprocess(program, args.timeout)
            peer.append(latency)
            peer_left += survivors
        results[name] = {
            "sandbox_p50_ms": 1000 * statistics.median(ours),
            "sandbox_p99_ms": 1000 * percentile(ours, 0.99),
            "sandbox_left_alive": left,
            "subprocess_p50_ms": 1000 * statistics.median(peer),
            "subprocess_p99_ms": 1000 * percentile(peer, 0.99),
            "subprocess_left_alive": peer_left,
        }
        console.print(f"{name}: done", highlight=False)
    table = Table(title=f"timeout -> exit: {args.runs} runs each, timeout {args.timeout} s")
    for col in ("program", "sandbox p50", "p99", "left alive", "subprocess.run p50", "p99", "left alive"):
        table.add_column(col, justify="left" if col == "program" else "right")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['sandbox_p50_ms']:.1f} ms",
            f"{r['sandbox_p99_ms']:.1f} ms",
            str(r["sandbox_left_alive"]),
            f"{r['subprocess_p50_ms']:.1f} ms",
            f"{r['subprocess_p99_ms']:.1f} ms",
            str(r["subprocess_left_alive"]),
        )
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "bench_sandbox",
                "workload": vars(args) | {"json": str(args.json), "programs": PROGRAMS},
                "namespaces": namespaces_available(),
                "bound": "peer: subprocess.run(timeout=...) on the same programs",
                "results": results,
            },
            indent=1,
        )
    )
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
