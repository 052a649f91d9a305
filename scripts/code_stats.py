"""The shape of the code, as numbers to hold a refactor against: module sizes, the longest functions,
and where each runtime rule is written.

    .venv/bin/python scripts/code_stats.py [--top 15] [--json bench_results/code_stats.json]

- Sizes: the lines of every module of `actors/`, `rlsched/sim/` and the in-process loop
  (`rlsched/rl/loop.py`): the runtime and its second copies (issue 18 puts one state core under
  all three).
- Longest functions: over `rlsched/`, `actors/`, `verifiers/` and `scripts/`, from the syntax tree.
- Rule sites: the code lines (not comments, not strings) that apply each rule (its arithmetic or
  comparison, see RULES), the places the rule is written: a rule written once has one site.

`--root DIR` measures another checkout (e.g. a worktree of an older commit) with this script.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
SIZED = ("actors/*.py", "rlsched/core/*.py", "rlsched/sim/*.py", "rlsched/rl/loop.py")
SCANNED = ("rlsched", "actors", "verifiers", "scripts")
# rule -> the expression that applies it, as code_lines() spells a line (tokens joined by spaces,
# strings and comments left out): where the rule is written, not where its setting is passed on
RULES = {
    "staleness": r"- [\w. ]*max_staleness",  # latest - max_staleness
    "warmup": r"step \+ 1 \) / warm",  # (step + 1) / warmup_steps
    "heartbeat loss": r"last_heard > [\w. ]*heartbeat_timeout_s|silent >= [\w. ]*timeout_s",
    "verification timeouts": r"\bTimeoutTable\(|\badaptive_timeout\(",
    "transient windows": r"[+>=] [\w. ]*available_s|after\([\w. ]*available_s",
    "a job's demand": r"(\{ :|\*) [\w. ]*cpus_per_(?:instance|worker|rank)",
    "grace periods": r"\+ [\w. ]*grace_s",
    # issue 42's rules, each decided in one module (rlsched/policy/run_rules.py)
    "time budget": r"> [\w. ]*time_budget_s",  # training seconds > grpo.time_budget_s
    "eval cadence": r"% [\w. ]*(?:every_steps|eval_every) == 0",  # iteration % eval.every_steps == 0
    "checkpoint cadence": r"% (?:[\w.]*checkpoint[\w.]*|every) == 0",  # iteration % checkpoint.every == 0
    "checkpoint hold": r"\basked <= before|\btarget <= before",  # an update waits for the checkpoint
    # whether another attempt follows a failure (rlsched/policy/retry.py): a count of failures against a
    # retry limit, or a loop over the attempts (a fixed `range(3)` is not told from other loops)
    "retries": r"[<>=]=? [\w. ]*(?:retries|max_recoveries|limit) (?:[:)]|and|or|$)"
    r"|range\(\w*[\w., ]*(?:retries|attempts)",
}


def python_files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "_pb2" not in p.name)


def sizes() -> dict[str, int]:
    found = {}
    for pattern in SIZED:
        for path in sorted(ROOT.glob(pattern)):
            if path.name != "__init__.py":
                found[str(path.relative_to(ROOT))] = len(path.read_text().splitlines())
    return found


def longest_functions(top: int) -> list[dict[str, object]]:
    found = []
    for path in python_files(SCANNED):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                found.append(
                    {
                        "function": f"{path.relative_to(ROOT)}:{node.name}",
                        "line": node.lineno,
                        "lines": node.end_lineno - node.lineno + 1,
                    }
                )
    return sorted(found, key=lambda f: -int(str(f["lines"])))[:top]


def code_lines(path: Path) -> dict[int, str]:
    """Each line's code tokens (names, operators, numbers), without comments and strings."""
    lines: dict[int, list[str]] = {}
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for token in tokens:
        if token.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
            lines.setdefault(token.start[0], []).append(token.string)
    return {n: " ".join(parts).replace(" ( ", "(").replace(" (", "(") for n, parts in lines.items()}


def rule_sites() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {rule: [] for rule in RULES}
    for path in python_files(("rlsched", "actors")):
        if "config.py" in path.name:  # where the settings are declared, not applied
            continue
        for number, line in code_lines(path).items():
            for rule, pattern in RULES.items():
                if re.search(pattern, line):
                    found[rule].append(f"{path.relative_to(ROOT)}:{number}")
    return found


def main() -> None:
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", type=Path, default=Path("bench_results/code_stats.json"))
    ap.add_argument("--root", type=Path, default=None, help="the checkout to measure (default: this one)")
    args = ap.parse_args()
    ROOT = (args.root or ROOT).resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    report = {
        "commit": commit.stdout.strip() or None,
        "sizes": sizes(),
        "longest_functions": longest_functions(args.top),
        "rule_sites": rule_sites(),
    }
    table = Table(title=f"code shape at {report['commit']}")
    for col in ("what", "where", "lines / sites"):
        table.add_column(col, justify="right" if col == "lines / sites" else "left")
    for module, lines in report["sizes"].items():
        table.add_row("module size", module, str(lines))
    for f in report["longest_functions"]:
        table.add_row("long function", f"{f['function']} (line {f['line']})", str(f["lines"]))
    for rule, sites in report["rule_sites"].items():
        files = sorted({s.rsplit(":", 1)[0] for s in sites})
        table.add_row("rule sites", f"{rule}: {', '.join(files) or '-'}", str(len(sites)))
    Console(width=140).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
