"""Does the fast loop test the pure policies and cores as well as the whole suite? Measure both.

    .venv/bin/python scripts/coverage_tiers.py [--tiers fast,all] [--out bench_results/coverage.json]

Runs each tier's pytest under coverage.py (`make test-fast`'s selection, then `make test`'s) on the
same two xdist workers, with `patch = subprocess` (pyproject's `[tool.coverage.run]`) so that the
workers and every Python process they start are measured: Ray's workers included, as far as they
exit normally (an actor killed with SIGKILL keeps its lines to itself). Only `rlsched/policy` and
`rlsched/core` are measured. Prints one table, a row per module with each tier's line coverage side
by side and the lines the fast tier misses that the whole suite runs, and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
TIERS = {
    "fast": ["-m", "not slow and not ray and not vllm", "tests/unit", "tests/component", "tests/conformance"],
    "all": ["-m", "not vllm"],
}


def measure(tier: str, workdir: Path, workers: int) -> dict[str, Any]:
    """Run one tier under coverage; the per-file line counts, and how long it took."""
    data = workdir / tier
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    env = {**os.environ, "COVERAGE_FILE": str(data / ".coverage")}
    xdist = ["-n", str(workers), "--dist", "loadscope"] if workers else []
    cmd = [sys.executable, "-m", "coverage", "run", "-m", "pytest", "-q", *xdist, *TIERS[tier]]
    print(f"== {tier}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    tests = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    wall = time.monotonic() - start
    subprocess.run([sys.executable, "-m", "coverage", "combine", "-q"], cwd=ROOT, env=env, check=True)
    report = data / "coverage.json"
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", "-q", "-o", str(report)], cwd=ROOT, env=env, check=True
    )
    files = json.loads(report.read_text())["files"]
    return {
        "pytest_exit": tests,
        "wall_s": round(wall, 1),
        "files": {
            name: {"statements": f["summary"]["num_statements"], "executed": sorted(f["executed_lines"])}
            for name, f in files.items()
        },
    }


def percent(executed: int, statements: int) -> float:
    return 100.0 * executed / statements if statements else 100.0


def table(results: dict[str, dict[str, Any]]) -> Table:
    tiers = list(results)
    out = Table(title="line coverage of rlsched/policy and rlsched/core, by tier")
    out.add_column("module")
    out.add_column("lines", justify="right")
    for tier in tiers:
        out.add_column(tier, justify="right")
    if {"fast", "all"} <= set(tiers):
        out.add_column("lines only `all` runs", justify="right")
    names = sorted(set().union(*(r["files"] for r in results.values())))
    totals = {tier: 0 for tier in tiers}
    statements_total = 0
    for name in names:
        statements = max(r["files"].get(name, {}).get("statements", 0) for r in results.values())
        statements_total += statements
        executed = {t: set(results[t]["files"].get(name, {}).get("executed", [])) for t in tiers}
        row = [name, str(statements)]
        for tier in tiers:
            totals[tier] += len(executed[tier])
            row.append(f"{percent(len(executed[tier]), statements):.1f}%")
        if {"fast", "all"} <= set(tiers):
            row.append(str(len(executed["all"] - executed["fast"])))
        out.add_row(*row)
    summary = ["total", str(statements_total)]
    summary += [f"{percent(totals[t], statements_total):.1f}%" for t in tiers]
    out.add_row(*summary, style="bold")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiers", default="fast,all", help="comma-separated: fast, all")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: one process)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "coverage.json")
    args = parser.parse_args()
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if unknown := [t for t in tiers if t not in TIERS]:
        print(f"coverage_tiers: unknown tier(s) {unknown}; choose from {', '.join(TIERS)}", file=sys.stderr)
        return 2
    workdir = ROOT / "bench_results" / "coverage-data"
    results = {tier: measure(tier, workdir, args.workers) for tier in tiers}
    Console().print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        tier: {
            "pytest_exit": r["pytest_exit"],
            "wall_s": r["wall_s"],
            "statements": sum(f["statements"] for f in r["files"].values()),
            "executed": sum(len(f["executed"]) for f in r["files"].values()),
            "files": {n: [len(f["executed"]), f["statements"]] for n, f in r["files"].items()},
        }
        for tier, r in results.items()
    }
    args.out.write_text(json.dumps({"tiers": summary, "selection": TIERS}, indent=1))
    print(f"wrote {args.out}")
    return max(r["pytest_exit"] for r in results.values())


if __name__ == "__main__":
    sys.exit(main())
