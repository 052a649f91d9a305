"""Where the suite's time goes: run the tests with every phase and fixture timed, then show it.

    .venv/bin/python scripts/ci_profile.py run [--out bench_results/ci_profile.json] [-- PYTEST ARGS]
    .venv/bin/python scripts/ci_profile.py show bench_results/ci_profile.json [--top 25]
    .venv/bin/python scripts/ci_profile.py compare BEFORE.json AFTER.json [--top 25]
    .venv/bin/python scripts/ci_profile.py durations bench_results/ci_profile.json


`run` is `make test`'s pytest (`-m "not vllm"` unless the arguments name another marker) with
`--timings-json` (the plugin in tests/timings.py). `show` prints three tables: the modules (set-up,
call, teardown, tests), the slowest tests (each phase, and what the test guards: its docstring's
first sentence) and the slowest fixture set-ups (scope, and the test that paid for them). `compare`
puts two profiles side by side by module and by test: the before/after kept in docs/development.md.
`--markdown` prints the tables as Markdown for the docs. `durations` writes each module's seconds to
tests/durations.json, the order in which pytest-xdist hands modules out (longest first:
tests/conftest.py); refresh it when a module's time changes much.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("setup", "call", "teardown")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def total(entry: dict[str, Any]) -> float:
    return float(sum(entry.get(p, 0.0) for p in PHASES))


def by_module(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Seconds per module and phase, with the count of tests."""
    rows: dict[str, dict[str, float]] = defaultdict(
        lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0, "n": 0}
    )
    for entry in data["tests"].values():
        row = rows[entry["module"]]
        for phase in PHASES:
            row[phase] += entry.get(phase, 0.0)
        row["n"] += 1
    return dict(rows)


def short(nodeid: str, width: int = 90) -> str:
    nodeid = nodeid.removeprefix("tests/")
    return nodeid if len(nodeid) <= width else nodeid[: width - 1] + "…"


class Out:
    """Rich tables on a terminal, or Markdown for the docs."""

    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown
        self.console = Console(width=220)

    def table(self, title: str, columns: list[str], rows: list[list[str]]) -> None:
        if self.markdown:
            print(f"\n**{title}**\n")
            print("| " + " | ".join(columns) + " |")
            print(
                "|"
                + "|".join("---" if i == 0 or c == "guards" else "---:" for i, c in enumerate(columns))
                + "|"
            )
            for row in rows:
                print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
            return
        table = Table(title=title)
        for i, column in enumerate(columns):
            table.add_column(column, justify="left" if i == 0 or column == "guards" else "right")
        for row in rows:
            table.add_row(*row)
        self.console.print(table)


def show(data: dict[str, Any], top: int, out: Out) -> None:
    modules = by_module(data)
    summed = sum(total(e) for e in data["tests"].values())
    out.table(
        f"{len(data['tests'])} tests, {data['wall_s']:.0f} s wall, {summed:.0f} s in tests: modules by time",
        ["module", "tests", "set-up s", "call s", "teardown s", "total s", "share"],
        [
            [
                short(m),
                f"{r['n']:.0f}",
                f"{r['setup']:.1f}",
                f"{r['call']:.1f}",
                f"{r['teardown']:.1f}",
                f"{r['setup'] + r['call'] + r['teardown']:.1f}",
                f"{(r['setup'] + r['call'] + r['teardown']) / max(summed, 1e-9):.1%}",
            ]
            for m, r in sorted(modules.items(), key=lambda kv: -sum(kv[1][p] for p in PHASES))[:top]
        ],
    )
    tests = sorted(data["tests"].items(), key=lambda kv: -total(kv[1]))[:top]
    out.table(
        f"the {top} slowest tests",
        ["test", "set-up s", "call s", "teardown s", "guards"],
        [
            [short(t), f"{e['setup']:.1f}", f"{e['call']:.1f}", f"{e['teardown']:.1f}", e.get("guards", "")]
            for t, e in tests
        ],
    )
    fixtures = sorted(data["fixtures"], key=lambda f: -f["seconds"])[:top]
    out.table(
        f"the {top} slowest fixture set-ups",
        ["fixture", "scope", "s", "paid by", "guards"],
        [
            [f["fixture"], f["scope"], f"{f['seconds']:.1f}", short(f["test"], 70), f.get("guards", "")]
            for f in fixtures
        ],
    )


def compare(before: dict[str, Any], after: dict[str, Any], top: int, out: Out) -> None:
    mb, ma = by_module(before), by_module(after)

    def secs(rows: dict[str, dict[str, float]], m: str) -> float:
        return sum(rows.get(m, {}).get(p, 0.0) for p in PHASES)

    names = sorted(set(mb) | set(ma), key=lambda m: -max(secs(mb, m), secs(ma, m)))[:top]
    out.table(
        f"modules: before {before['wall_s']:.0f} s wall ({len(before['tests'])} tests), "
        f"after {after['wall_s']:.0f} s wall ({len(after['tests'])} tests)",
        ["module", "tests before", "tests after", "before s", "after s", "after/before"],
        [
            [
                short(m),
                f"{mb.get(m, {}).get('n', 0):.0f}",
                f"{ma.get(m, {}).get('n', 0):.0f}",
                f"{secs(mb, m):.1f}",
                f"{secs(ma, m):.1f}",
                f"{secs(ma, m) / secs(mb, m):.2f}x" if secs(mb, m) > 0 else "new",
            ]
            for m in names
        ],
    )
    tb, ta = before["tests"], after["tests"]
    slow = sorted(set(tb) | set(ta), key=lambda t: -max(total(tb.get(t, {})), total(ta.get(t, {}))))[:top]
    out.table(
        f"the {top} slowest tests, before and after",
        ["test", "before s", "after s", "where the seconds went (after: set-up/call/teardown)"],
        [
            [
                short(t),
                f"{total(tb[t]):.1f}" if t in tb else "-",
                f"{total(ta[t]):.1f}" if t in ta else "gone",
                "/".join(f"{ta[t][p]:.1f}" for p in PHASES) if t in ta else "",
            ]
            for t in slow
        ],
    )


DURATIONS = ROOT / "tests" / "durations.json"


def durations(data: dict[str, Any]) -> None:
    """Each module's seconds (set-up, calls and teardown), rounded, into tests/durations.json."""
    seconds = {m: round(total(row)) for m, row in sorted(by_module(data).items())}
    DURATIONS.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"wrote {len(seconds)} modules' seconds to {DURATIONS.relative_to(ROOT)}")


def run(out_path: Path, pytest_args: list[str]) -> int:
    marker = [] if "-m" in pytest_args else ["-m", "not vllm"]
    cmd = [sys.executable, "-m", "pytest", "-q", *marker, f"--timings-json={out_path}", *pytest_args]
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run the suite with timings, then show them")
    p_run.add_argument("--out", type=Path, default=ROOT / "bench_results" / "ci_profile.json")
    p_run.add_argument("pytest_args", nargs="*")
    p_show = sub.add_parser("show", help="the tables of one profile")
    p_show.add_argument("profile", type=Path)
    p_cmp = sub.add_parser("compare", help="two profiles side by side")
    p_cmp.add_argument("before", type=Path)
    p_cmp.add_argument("after", type=Path)
    p_dur = sub.add_parser("durations", help="write each module's seconds to tests/durations.json")
    p_dur.add_argument("profile", type=Path)
    for p in (p_run, p_show, p_cmp):
        p.add_argument("--top", type=int, default=25)
        p.add_argument("--markdown", action="store_true", help="Markdown tables, for docs/development.md")
    args = parser.parse_args()
    out = Out(getattr(args, "markdown", False))
    if args.cmd == "run":
        rc = run(args.out, args.pytest_args)
        if args.out.exists():
            show(load(args.out), args.top, out)
        return rc
    if args.cmd == "show":
        show(load(args.profile), args.top, out)
        return 0
    if args.cmd == "durations":
        durations(load(args.profile))
        return 0
    compare(load(args.before), load(args.after), args.top, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
