"""What every `scripts/bench_*.py` shares: its command line, its table and its JSON.

- `parser(doc, name)`: argparse with the script's docstring as help, `--seed` and `--json PATH`
  (default `bench_results/NAME.json`; `--out` is the same flag, for older command lines).
- `table(title, columns, rows)`: one rich table, numbers right-aligned.
- `write(path, payload)`: the JSON (workload, seed, every variant and the bound it is compared
  with), indented, its folder made; says where it went.
- `run_silently(cfg, iterations)`: a Ray job's iterations without output (Ray is imported then).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def parser(doc: str | None, name: str, seed: int = 0) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=seed, help="the workload's seed (default: %(default)s)")
    ap.add_argument(
        "--json",
        "--out",
        dest="json",
        type=Path,
        default=Path(f"bench_results/{name}.json"),
        help="where the results go (default: %(default)s)",
    )
    return ap


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], width: int | None = None
) -> Table:
    """Print one table; cells are shown as given (format numbers before), numbers right-aligned."""
    out = Table(title=title)
    rows = [list(r) for r in rows]
    for k, name in enumerate(columns):
        numeric = bool(rows) and all(_numeric(r[k]) for r in rows)
        out.add_column(name, justify="right" if numeric else "left")
    for r in rows:
        out.add_row(*(str(c) for c in r))
    Console(width=width).print(out)
    return out


def _numeric(cell: object) -> bool:
    text = str(cell).replace(",", "").replace("%", "").replace("x", "").replace("s", "").strip()
    try:
        float(text.split()[0] if text else "x")
    except ValueError:
        return False
    return True


def write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def run_silently(cfg: Any, iterations: int) -> Any:
    """A job (`rlsched.config.JobConfig`) for benchmarks and validation: `iterations` iterations
    without output, its actors released afterwards; the controller's spans and estimator stay
    readable."""
    from actors.controller import JobController

    controller = JobController(cfg, log=lambda _: None)
    try:
        for n in range(1, iterations + 1):
            controller.run_iteration(n)
    finally:
        controller.shutdown()
    return controller
