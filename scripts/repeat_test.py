"""Run tests again and again, some of the runs beside a busy loop on every core: is a test flaky, and
does load make it so?

    .venv/bin/python scripts/repeat_test.py NODEID [NODEID ...] [--runs 20] [--busy 10]
                                             [--json bench_results/repeat_test.json]

Each node id runs `--runs` times, each time in a fresh `pytest` process (as CI runs it); the last
`--busy` of those run while one busy-loop process per core spins beside them (the load a shared CI
machine puts on a test). One table: per test, the runs and failures quiet and loaded, and the
slowest run; the JSON keeps every run's outcome, seconds and, for a failure, the tail of its output.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _spin() -> None:
    while True:
        pass


def busy_loops() -> list[multiprocessing.Process]:
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for loop in loops:
        loop.start()
    return loops


def run_once(nodeid: str, timeout_s: float) -> dict[str, Any]:
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", nodeid]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        passed, tail = proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        passed, tail = False, f"timed out after {timeout_s} s: {str(err.stdout or '')[-2000:]}"
    return {"passed": passed, "seconds": round(time.monotonic() - start, 2), "tail": "" if passed else tail}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nodeids", nargs="+")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=10, help="how many of the runs have a busy loop per core")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for one run")
    ap.add_argument("--json", type=Path, default=ROOT / "bench_results" / "repeat_test.json")
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    for nodeid in args.nodeids:
        results[nodeid] = []
        for k in range(args.runs):
            loaded = k >= args.runs - args.busy
            loops = busy_loops() if loaded else []
            try:
                outcome = run_once(nodeid, args.timeout) | {"busy": loaded}
            finally:
                for loop in loops:
                    loop.terminate()
            results[nodeid].append(outcome)
            mark = "." if outcome["passed"] else "F"
            load = " (busy)" if loaded else ""
            print(f"{mark} {nodeid} run {k + 1}/{args.runs}{load}: {outcome['seconds']} s", flush=True)
    table = Table(title=f"{args.runs} runs each, the last {args.busy} beside a busy loop per core")
    for column in ("test", "quiet runs", "quiet failures", "busy runs", "busy failures", "slowest s"):
        table.add_column(column, justify="left" if column == "test" else "right")
    for nodeid, runs in results.items():
        quiet = [r for r in runs if not r["busy"]]
        busy = [r for r in runs if r["busy"]]
        table.add_row(
            nodeid,
            str(len(quiet)),
            str(sum(not r["passed"] for r in quiet)),
            str(len(busy)),
            str(sum(not r["passed"] for r in busy)),
            f"{max(r['seconds'] for r in runs):.1f}",
        )
    Console(width=200).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": args.runs, "busy": args.busy, "results": results}, indent=1))
    return 0 if all(r["passed"] for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
