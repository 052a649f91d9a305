"""How a typed config tree is loaded: defaults in code, then a YAML file, then `--set a.b=value`
overrides, validated once into a frozen pydantic tree; every problem is reported together, each by
its dotted path with how to fix it.

`load_tree` serves every tree: the job (`rlsched.config`), the simulator's scenarios and the cluster
admin's file. `Section` is the base of all their sections.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from rlsched.errors import UserError


class Section(BaseModel):
    """A config section: frozen once validated, and unknown keys refused (with the nearest name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


_M = TypeVar("_M", bound=BaseModel)


# -- loading ---------------------------------------------------------------------------------------


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(
            f"config file {path} does not exist; pass a YAML file such as configs/jobs/quickstart.yaml"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        where = ""
        mark = getattr(err, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(
            f"{path} is not valid YAML{where}: {problem}. Check indentation and quoting there."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{path} must hold a mapping of sections (model:, grpo:, ...), not a {type(data).__name__}"
        )
    return data


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` (value parsed as a YAML scalar: 3, 0.5, true, text) in place."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, for example --set grpo.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node: dict[str, Any] | list[Any] = tree
    for part, child_key in itertools.pairwise(parts):
        child = _child(node, part, assignment)
        if child is None:
            child = [] if child_key.isdigit() else {}
            _assign(node, part, child, assignment)
        if not isinstance(child, dict | list):
            raise UserError(f"--set {assignment!r}: {part!r} is a value, not a section")
        node = child
    _assign(node, parts[-1], value, assignment)


def _child(node: dict[str, Any] | list[Any], part: str, assignment: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if not part.isdigit():
        raise UserError(f"--set {assignment!r}: {part!r} must be an index into the list (0, 1, ...)")
    return node[int(part)] if int(part) < len(node) else None


def _assign(node: dict[str, Any] | list[Any], part: str, value: Any, assignment: str) -> None:
    """Set `node[part]`; a list index may name an existing item or the next one (to append)."""
    if isinstance(node, dict):
        node[part] = value
    elif not part.isdigit() or int(part) > len(node):
        raise UserError(
            f"--set {assignment!r}: index {part} is past the end of a list of {len(node)} "
            f"(use 0..{len(node)})"
        )
    elif int(part) == len(node):
        node.append(value)
    else:
        node[int(part)] = value


def _fix_hint(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling"
    if kind in ("missing",):
        return "required; add it"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    return msg if isinstance(got, dict | list | tuple) else f"{msg} (got {got!r})"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation can hold (through Optional, unions, tuples and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _walk(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[list[str], list[type[BaseModel]]]:
    """Follow an error location: the path as the user wrote it (list indices kept, the tags of
    tagged unions such as a distribution's kind dropped) and the models that can sit at its end."""
    models: list[type[BaseModel]] = [root]
    shown: list[str] = []
    for part in loc:
        if isinstance(part, int):
            shown.append(str(part))  # an item of a list: same models
            continue
        tagged = [m for m in models if _kind_of(m) == part]
        if tagged:
            models = tagged
            continue
        shown.append(str(part))
        fields = [m.model_fields[str(part)] for m in models if str(part) in m.model_fields]
        models = [m for f in fields for m in _models_in(f.annotation)]
    return shown, models


def _valid_keys(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    """The keys allowed where an unknown key was found."""
    models = _walk(loc[:-1], root)[1]
    return ", ".join(models[0].model_fields) if len(models) == 1 else ""


def _kind_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    return field.default if field is not None and isinstance(field.default, str) else None


def format_validation_error(source: str, err: ValidationError, root: type[BaseModel]) -> str:
    """Every problem, one a line, each under the path of its key. A check that spans the whole file
    (a model validator at the top) names its own fields, one problem a line of its message."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(_walk(loc, root)[0])
        hint = _fix_hint(e)
        if e["type"] == "extra_forbidden":
            keys = _valid_keys(loc, root)
            hint += f"; valid keys here: {keys}" if keys else ""
        lines += [f"  {path}: {hint}"] if path else [f"  {p}" for p in hint.splitlines()]
    return "\n".join([f"{source} has {len(lines)} problem(s):", *lines])


def load_tree(root: type[_M], path: Path | str | None, overrides: list[str] | None) -> _M:
    """Any config tree (a job, a scenario, the admin's file): defaults, then the YAML file, then each
    `--set`, validated once; a bad value is a `UserError` naming the key and the fix."""
    tree = read_yaml(Path(path)) if path is not None else {}
    for assignment in overrides or []:
        apply_override(tree, assignment)
    base_dir = Path(path).parent if path is not None else Path(".")
    try:
        return root.model_validate(tree, context={"base_dir": base_dir})
    except ValidationError as err:
        raise UserError(format_validation_error(str(path or "the config"), err, root)) from None
