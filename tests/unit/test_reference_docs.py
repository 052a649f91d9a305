"""docs/reference/ is what scripts/gen_reference.py writes from the code today: the CLI's argparse
tree and the pydantic field descriptions of every config file rlsched reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts/gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_and_config_references_are_current() -> None:
    gen = _generator()
    for path, text in ((gen.CLI_MD, gen.cli_reference()), (gen.CONFIG_MD, gen.config_reference())):
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is out of date: run scripts/gen_reference.py"
        )


def test_every_config_key_says_what_it_means() -> None:
    rows = [line for line in _generator().config_reference().splitlines() if line.startswith("| `")]
    keys = [row for row in rows if "| section `" not in row]  # a section has a table of its own
    undescribed = [row.split("|")[1].strip() for row in keys if row.rstrip().endswith("|  |")]
    assert undescribed == [] and len(keys) > 150
