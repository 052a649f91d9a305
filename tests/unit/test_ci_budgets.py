"""CI's per-phase budgets are written once (`.ci/budgets`), and docs/development.md quotes them as
they are: every phase `.ci/run` times has a budget, the phases add up within the total, and the docs'
table says the same numbers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def budgets() -> dict[str, int]:
    rows = (line.split() for line in (ROOT / ".ci" / "budgets").read_text().splitlines())
    return {row[0]: int(row[1]) for row in rows if row and not row[0].startswith("#")}


def test_every_phase_ci_runs_has_a_budget_and_they_fit_the_total() -> None:
    """The phases run one after another, except the vLLM tests, which run beside the end of `test`
    (from the moment its first worker is done): those of the others add up within the total, and
    test-vllm fits inside test."""
    script = (ROOT / ".ci" / "run").read_text()
    timed = re.findall(r"^(?:\S+=\S+ )?phase (\S+) ", script, flags=re.MULTILINE)
    beside = re.findall(r"^report (\S+)$", script, flags=re.MULTILINE)
    found = budgets()
    assert timed and beside == ["test-vllm"] and set(timed) | set(beside) | {"total"} == set(found)
    assert sum(found[k] for k in timed) <= found["total"]
    assert found["test-vllm"] <= found["test"]


def test_the_docs_quote_the_budgets() -> None:
    doc = (ROOT / "docs" / "development.md").read_text()
    quoted = dict(re.findall(r"^\| `([\w-]+)` \| ([\d,]+) s \|", doc, flags=re.MULTILINE))
    assert {k: int(v.replace(",", "")) for k, v in quoted.items()} == budgets()
