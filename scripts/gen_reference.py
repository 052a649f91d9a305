"""Write docs/reference/cli.md and docs/reference/config.md from the code itself.

    .venv/bin/python scripts/gen_reference.py           # rewrite both files
    .venv/bin/python scripts/gen_reference.py --check   # exit 1 if either is out of date

The CLI reference walks `rlsched.cli.build_parser()`: every command and subcommand with its help
line, usage and options. The configuration reference walks the pydantic trees a user writes: a job
(`rlsched.config.JobConfig`), the cluster admin's file (`rlsched.admin.AdminConfig`) and the two
simulator scenarios: each section's keys with their type, default and the field's description.
`tests/unit/test_reference_docs.py` fails when a file is not what this script would write.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs/reference/cli.md"
CONFIG_MD = ROOT / "docs/reference/config.md"
HEADER = "<!-- written by scripts/gen_reference.py from the code: edit the code, then run it -->\n"


# -- the CLI -----------------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        text = (action.help or "").replace("%(default)s", str(action.default)).replace("|", "\\|")
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += f" (default: `{action.default}`)"
        rows.append(f"| {names} | {text} |")
    return rows


def _command(path: str, help_line: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    usage = " ".join(parser.format_usage().split())
    lines = [f"{'#' * depth} `{path}`", ""]
    if help_line:
        lines += [help_line[0].upper() + help_line[1:] + ".", ""]
    lines += ["```", usage.removeprefix("usage: "), "```", ""]
    options = _options(parser)
    if options:
        lines += ["| argument | meaning |", "|---|---|", *options, ""]
    for name, sub_help, sub in _subparsers(parser):
        lines += _command(f"{path} {name}", sub_help, sub, min(depth + 1, 4))
    return lines


def cli_reference() -> str:
    from rlsched.cli import build_parser

    parser = build_parser()
    lines = [HEADER, "# Command reference", ""]
    lines += [
        "Every `rlsched` command, its usage and its options; `rlsched COMMAND --help` prints the same.",
        "A command given bad input prints what is wrong and how to fix it, and exits with status 2.",
        "",
    ]
    for name, help_line, sub in _subparsers(parser):
        lines += _command(f"rlsched {name}", help_line, sub, 2)
    return "\n".join(lines).rstrip() + "\n"


# -- the configuration trees -------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    for noise in ("typing.", "pathlib.", "rlsched.config.", "rlsched.sim.dists.", "rlsched.policy.verify."):
        text = text.replace(noise, "")
    return text.replace("NoneType", "None").replace("|", "or")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "(a section)" if _model(info.annotation) else "`[]`"
    if info.default is PydanticUndefined:
        return "required"
    value = info.default
    if isinstance(value, BaseModel):
        return _compact(value) if "kind" in type(value).model_fields else "(a section)"
    if isinstance(value, tuple | list) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} with its defaults"
    return f"`{getattr(value, 'value', value)!s}`" if value is not None else "`null`"


def _compact(value: BaseModel) -> str:
    """A distribution's default as a user writes it: `{kind: constant, value: 0.5}`."""
    fields = ", ".join(f"{k}: {v}" for k, v in value.model_dump(mode="json").items())
    return f"`{{{fields}}}`"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The section models a field can hold (directly, in a list or a mapping, or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _model(annotation: Any) -> type[BaseModel] | None:
    """The one section model a field holds (a union of several, like a distribution, is a type)."""
    found = list(dict.fromkeys(_models(annotation)))
    return found[0] if len(found) == 1 else None


def _kind(annotation: Any) -> str:
    """A union of several models (a distribution's kinds, say) by its members' `kind` values."""
    kinds = []
    for m in dict.fromkeys(_models(annotation)):
        field = m.model_fields.get("kind")
        literal = typing.get_args(field.annotation) if field is not None else ()
        kinds.append(str(literal[0]) if literal else m.__name__)
    optional = " or None" if type(None) in typing.get_args(annotation) else ""
    number = " or a number" if float in typing.get_args(annotation) else ""
    return f"one of: {', '.join(kinds)}{number}{optional}"


def _section(model: type[BaseModel], path: str, seen: set[type[BaseModel]]) -> list[str]:
    doc = " ".join((model.__doc__ or "").split())
    lines = [f"### `{path}`", ""]
    if doc and model.__module__ != "pydantic.main":
        lines += [doc, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    nested = []
    for name, info in model.model_fields.items():
        sub = _model(info.annotation)
        several = len(set(_models(info.annotation))) > 1
        kind = (
            f"section `{path}.{name}`"
            if sub is not None
            else _kind(info.annotation)
            if several
            else _type_name(info.annotation)
        )
        meaning = " ".join((info.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {kind} | {_default(info)} | {meaning} |")
        if sub is not None and sub not in seen:
            nested.append((sub, f"{path}.{name}"))
    lines.append("")
    for sub, sub_path in nested:
        seen.add(sub)
        lines += _section(sub, sub_path, seen)
    return lines


def config_reference() -> str:
    from rlsched.admin import AdminConfig
    from rlsched.config import JobConfig
    from rlsched.sim.cluster_scenario import ClusterScenarioConfig
    from rlsched.sim.scenario import ScenarioConfig

    trees = [
        ("A job (`rlsched run FILE`, `rlsched submit FILE`)", "job", JobConfig),
        ("The cluster admin's file (`rlsched admin check|start FILE`)", "admin", AdminConfig),
        ("A simulated RL scenario (`rlsched simulate FILE`)", "scenario", ScenarioConfig),
        ("A simulated cluster (`rlsched simulate FILE` with `streams`)", "cluster", ClusterScenarioConfig),
    ]
    lines = [HEADER, "# Configuration reference", ""]
    lines += [
        "Every key of every YAML file rlsched reads, with its type, its default and what it means.",
        "Defaults live in the code; a file overrides them, and `--set section.key=value` overrides",
        "the file. A key that does not exist, or a value of the wrong kind, is refused by name.",
        "",
    ]
    for title, root, model in trees:
        lines += [f"## {title}", ""]
        lines += _section(model, root, {model})
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a file is out of date; write nothing")
    args = ap.parse_args()
    stale = []
    for path, text in ((CLI_MD, cli_reference()), (CONFIG_MD, config_reference())):
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run scripts/gen_reference.py", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(map(str, stale)) if stale else "both references are current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
