"""Prompts with references from datasets on disk: JSONL, Parquet, and Hugging Face `datasets` folders.

A `dataset` task reads `task.path`: a JSONL file (one JSON object per line, any keys), a Parquet file
or a directory of Parquet shards, or a directory written by `Dataset.save_to_disk` or
`DatasetDict.save_to_disk`. `task.columns` says which column plays which part (prompt or messages,
reference, and optionally id, verifier, split), so a dataset is used as it was published (GSM8K's
`question` and `answer`) rather than rewritten into the `jsonl` task's fixed keys.

Splits. A DatasetDict has named splits, and so does a directory of shards laid out as the Hub writes
them (`train-00000-of-00002.parquet`, or `train/0000.parquet`): training reads `task.train_split`,
and `task.eval_split`, if set, is held out. Without splits a column may name each row's split
(`task.columns.split`, with `task.eval_split`); otherwise `task.eval_size` rows drawn with
`task.seed` are held out, as in the `jsonl` task.

Everything is checked when the task loads, before any GPU is reserved: a mapped column the data lacks
is refused naming the column, the file and the columns it has; rows with an empty or null prompt or
reference are refused by their line or row (the first few, and how many): a row is never dropped
silently, since a quietly shrunk dataset trains on something else than what was asked.

`datasets` and `pyarrow` are imported only by the readers that need them (they take about a second
to import, which the other tasks and config loading should not pay).
"""

from __future__ import annotations

import bisect
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlsched.config_task import TaskColumns, TaskConfig, TaskFormat
from rlsched.errors import UserError
from rlsched.model.template import Message
from rlsched.rl.task import JsonlProblem, name_rows

HUB_SHARD = re.compile(r"(?P<split>[\w.-]+?)-\d{5}-of-\d{5}\.parquet")  # train-00000-of-00002.parquet
CONVERTER_SHARD = re.compile(r"\d+\.parquet")  # <split>/0000.parquet, the Hub's parquet converter


@dataclass(frozen=True)
class Part:
    """One split of a source, or the whole of one without splits: where its rows are, how they are
    named in messages, its columns, and how to read its rows with just the columns asked for."""

    where: str  # "data/train.parquet", "data/hf split 'test'"
    label: Callable[[int], str]  # row index -> "line 3", "row 12", "train-00001-of-00002.parquet row 4"
    default_id: Callable[[int], str]  # row index -> an id unique within the source
    columns: tuple[str, ...]
    read: Callable[[list[str]], list[dict[str, Any]]]


Source = dict[str, Part]
"""A source's parts by split name; a source without splits has one part, named ''."""


# -- formats ------------------------------------------------------------------------------------------


def resolve_format(path: Path, fmt: TaskFormat) -> TaskFormat:
    """The format `auto` means for this path, from its name or what the directory holds."""
    if not path.exists():
        raise UserError(
            f"task.path {path} does not exist; give a JSONL or Parquet file or a dataset directory"
        )
    if fmt is not TaskFormat.AUTO:
        return fmt
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".ndjson"):
            return TaskFormat.JSONL
        if suffix == ".parquet":
            return TaskFormat.PARQUET
        raise UserError(
            f"cannot tell the format of {path} from its name; set task.format (jsonl, parquet or hf_disk)"
        )
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return TaskFormat.HF_DISK
    if any(path.rglob("*.parquet")):
        return TaskFormat.PARQUET
    raise UserError(
        f"{path} holds neither a saved dataset (dataset_dict.json or state.json, as save_to_disk writes) "
        "nor *.parquet files; point task.path at one, or set task.format"
    )


def read_source(path: Path, fmt: TaskFormat) -> Source:
    match resolve_format(path, fmt):
        case TaskFormat.JSONL:
            return read_jsonl(path)
        case TaskFormat.PARQUET:
            return read_parquet(path)
        case TaskFormat.HF_DISK:
            return read_hf_disk(path)
        case TaskFormat.AUTO:
            raise AssertionError("resolve_format never returns auto")


def read_jsonl(path: Path) -> Source:
    """One JSON object per line, any keys; blank lines are skipped, bad lines refused by number."""
    if not path.is_file():
        raise UserError(f"task.path {path} is not a file; a jsonl dataset is one file")
    rows: dict[int, dict[str, Any]] = {}
    bad: list[str] = []
    for n, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            bad.append(f"line {n} ({err.msg})")
            continue
        if isinstance(value, dict):
            rows[n] = value
        else:
            bad.append(f"line {n} (a {type(value).__name__}, not an object)")
    if bad:
        raise UserError(
            f"task file {path}: lines that are not JSON objects: {name_rows(bad)}; fix or remove them"
        )
    columns = tuple(dict.fromkeys(key for row in rows.values() for key in row))
    numbers = list(rows)
    return {
        "": Part(
            str(path),
            lambda i: f"line {numbers[i]}",
            lambda i: f"line-{numbers[i]}",
            columns,
            lambda wanted: [{k: row.get(k) for k in wanted} for row in rows.values()],
        )
    }


def shard_splits(root: Path, files: list[Path]) -> dict[str, list[Path]] | None:
    """Shards by split when every file is named as the Hub lays splits out, else None."""
    splits: dict[str, list[Path]] = {}
    for f in files:
        hub = HUB_SHARD.fullmatch(f.name)
        if hub is not None:
            splits.setdefault(hub["split"], []).append(f)
        elif CONVERTER_SHARD.fullmatch(f.name) and f.parent != root:
            splits.setdefault(f.parent.name, []).append(f)
        else:
            return None
    return splits


def read_parquet(path: Path) -> Source:
    """A Parquet file, or a directory of shards (read in name order), by split where they are named."""
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise UserError(f"{path} holds no *.parquet files; point task.path at a Parquet file or a directory")
    splits = shard_splits(path, files) if path.is_dir() else None
    if splits is None:
        return {"": parquet_part(str(path), files, "row")}
    return {name: parquet_part(f"{path} split '{name}'", shards, name) for name, shards in splits.items()}


def parquet_part(where: str, files: list[Path], prefix: str) -> Part:
    import pyarrow.parquet as pq

    schemas = {f: tuple(pq.read_schema(f).names) for f in files}
    columns = tuple(dict.fromkeys(c for names in schemas.values() for c in names))
    missing = {f: [c for c in columns if c not in names] for f, names in schemas.items()}
    if any(missing.values()):
        f = next(f for f, cols in missing.items() if cols)
        raise UserError(
            f"the shards of {where} differ: {f.name} has no column {', '.join(missing[f])}; "
            "give every shard the same columns"
        )
    lengths = [pq.read_metadata(f).num_rows for f in files]
    starts = [sum(lengths[:k]) for k in range(len(files))]

    def label(i: int) -> str:
        if len(files) == 1:
            return f"row {i}" if prefix == "row" else f"{prefix} row {i}"
        k = bisect.bisect_right(starts, i) - 1
        return f"{files[k].parent.name}/{files[k].name} row {i - starts[k]}"

    def read(wanted: list[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for f in files:
            rows.extend(pq.read_table(f, columns=wanted).to_pylist())
        return rows

    return Part(where, label, lambda i: f"{prefix}-{i}", columns, read)


def read_hf_disk(path: Path) -> Source:
    """A directory written by `Dataset.save_to_disk` (no splits) or `DatasetDict.save_to_disk`."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise UserError(
            f"{path} is not a dataset written by save_to_disk ({err}); check task.path, or set task.format"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        return {name: hf_part(f"{path} split '{name}'", ds, name) for name, ds in loaded.items()}
    return {"": hf_part(str(path), loaded, "row")}


def hf_part(where: str, ds: Any, prefix: str) -> Part:
    return Part(
        where,
        lambda i: f"row {i}" if prefix == "row" else f"{prefix} row {i}",
        lambda i: f"{prefix}-{i}",
        tuple(ds.column_names),
        lambda wanted: list(ds.select_columns(wanted).to_list()),
    )


# -- columns and rows ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnPlan:
    """The column each part is read from, checked against the columns a part has."""

    prompt: str | None
    messages: str | None
    reference: str
    id: str | None
    verifier: str | None
    split: str | None

    def columns(self) -> list[str]:
        named = (self.prompt, self.messages, self.reference, self.id, self.verifier, self.split)
        return list(dict.fromkeys(c for c in named if c is not None))


def plan_columns(columns: TaskColumns, part: Part) -> ColumnPlan:
    """Resolve the mapping against a part's columns; a mapped column it lacks is refused."""
    have = set(part.columns)
    required = {"prompt": columns.prompt_column, "messages": columns.messages, "reference": columns.reference}
    named = {**required, "id": columns.id, "verifier": columns.verifier, "split": columns.split}
    for role, column in named.items():
        if column is not None and column not in have:
            default = "" if role in columns.model_fields_set else " (the default)"
            raise UserError(
                f"{part.where} has no column {column!r} for task.columns.{role}{default}; its columns: "
                f"{', '.join(part.columns) or 'none'}. Map yours, e.g. task.columns.{role}: <column>"
            )

    def optional(given: str | None, default: str) -> str | None:
        return given if given is not None else (default if default in have else None)

    return ColumnPlan(
        columns.prompt_column,
        columns.messages,
        columns.reference,
        optional(columns.id, "id"),
        optional(columns.verifier, "verifier"),
        columns.split,
    )


def as_text(value: Any) -> str | None:
    """A reference or id as text: strings as they are, numbers written out; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value:  # not NaN
        return str(value)
    return None


def as_conversation(value: Any) -> tuple[Message, ...] | None:
    """A list of {role, content} as messages (other keys, such as Arrow's null-filled struct fields,
    are left out); None when it is not one."""
    if not isinstance(value, list | tuple) or not value or not all(isinstance(m, dict) for m in value):
        return None
    try:
        return tuple(Message(role=m.get("role"), content=m.get("content")) for m in value)
    except ValidationError:
        return None


@dataclass(frozen=True)
class MadeRow:
    split: str | None  # the row's value in the split column, if one is mapped
    label: str
    problem: JsonlProblem


@dataclass
class RowProblems:
    """What a part's rows became: the problems, and the rows refused for each reason."""

    rows: list[MadeRow]
    refused: dict[str, list[str]]

    def problems(self, split: str | None = None) -> list[JsonlProblem]:
        return [r.problem for r in self.rows if split is None or r.split == split]


def row_problem(row: dict[str, Any], plan: ColumnPlan, index: int, part: Part) -> JsonlProblem | str:
    """One row as a problem, or why it is refused."""
    if plan.messages is not None:
        convo = as_conversation(row[plan.messages])
        if convo is None:
            return f"messages that are not a list of {{role, content}} in {plan.messages!r}"
    else:
        assert plan.prompt is not None
        prompt = row[plan.prompt]
        if not isinstance(prompt, str) or not prompt.strip():
            return f"an empty, null or non-text prompt in {plan.prompt!r}"
        convo = (Message(role="user", content=prompt),)
    reference = as_text(row[plan.reference])
    if reference is None or not reference.strip():
        return f"an empty, null or non-text reference in {plan.reference!r}"
    given_id = as_text(row[plan.id]) if plan.id is not None else None
    verifier = row[plan.verifier] if plan.verifier is not None else None
    if verifier is not None and not isinstance(verifier, str):
        return f"a verifier kind that is not text in {plan.verifier!r}"
    return JsonlProblem(given_id or part.default_id(index), convo, reference, verifier or None)


def part_problems(part: Part, plan: ColumnPlan) -> RowProblems:
    out = RowProblems([], {})
    for index, row in enumerate(part.read(plan.columns())):
        made = row_problem(row, plan, index, part)
        if isinstance(made, str):
            out.refused.setdefault(made, []).append(part.label(index))
            continue
        split = row[plan.split] if plan.split is not None else None
        out.rows.append(MadeRow(None if split is None else str(split), part.label(index), made))
    return out


def refuse_rows(path: Path, refused: dict[str, list[str]]) -> None:
    if not refused:
        return
    count = sum(len(rows) for rows in refused.values())
    reasons = "; ".join(f"{why}: {name_rows(rows)}" for why, rows in refused.items())
    raise UserError(
        f"task {path}: {count} row(s) refused, none dropped: {reasons}. Fix or filter them "
        "(e.g. Dataset.filter before save_to_disk), or map other columns with task.columns"
    )


# -- splits -------------------------------------------------------------------------------------------


class DatasetTask:
    """Problems from a dataset: the held-out ones, and a stream of training ones."""

    def __init__(self, train: list[JsonlProblem], held: list[JsonlProblem], where: str) -> None:
        if not held or not train:
            raise UserError(
                f"{where} needs both training and held-out rows: it has {len(train)} and {len(held)}; "
                "lower task.eval_size, or name a non-empty task.train_split and task.eval_split"
            )
        self.eval_problems: tuple[JsonlProblem, ...] = tuple(held)
        self.train: tuple[JsonlProblem, ...] = tuple(train)

    def train_problems(self, rng: random.Random) -> Iterator[JsonlProblem]:
        while True:
            yield rng.choice(self.train)


def pick_part(source: Source, name: str, key: str, path: Path) -> Part:
    if name not in source:
        raise UserError(f"{path} has no split {name!r} (task.{key}); its splits: {', '.join(sorted(source))}")
    return source[name]


def load_dataset_task(cfg: TaskConfig) -> DatasetTask:
    """Read, map and check a dataset task (see the module docstring for the rules on splits)."""
    assert cfg.path is not None  # the config's validator guarantees it
    source = read_source(cfg.path, cfg.format)
    if "" not in source:
        return split_by_parts(cfg, source, cfg.path)
    whole = source[""]
    refuse_split_names(cfg, whole)
    made = part_problems(whole, plan_columns(cfg.columns, whole))
    refuse_rows(cfg.path, made.refused)
    if cfg.eval_split is not None:
        return split_by_column(cfg, made, whole)
    problems = made.problems()
    random.Random(cfg.seed).shuffle(problems)
    return DatasetTask(problems[cfg.eval_size :], problems[: cfg.eval_size], whole.where)


def refuse_split_names(cfg: TaskConfig, whole: Part) -> None:
    """Split names given for a source without splits (and no split column) would be ignored."""
    named = [f"task.{key}" for key in ("train_split", "eval_split") if key in cfg.model_fields_set]
    if cfg.columns.split is None and named:
        raise UserError(
            f"{' and '.join(named)} name splits, but {whole.where} has none; name the column that gives "
            "each row's split with task.columns.split, or unset them to hold out task.eval_size rows "
            "drawn with task.seed"
        )


def split_by_parts(cfg: TaskConfig, source: Source, path: Path) -> DatasetTask:
    """A source with named splits: train on one, hold out another (or eval_size rows of the first)."""
    if cfg.columns.split is not None:
        raise UserError(
            f"{path} has splits of its own ({', '.join(sorted(source))}); choose them with "
            "task.train_split and task.eval_split, and unset task.columns.split"
        )
    names = [(cfg.train_split, "train_split")] + ([(cfg.eval_split, "eval_split")] if cfg.eval_split else [])
    parts = [pick_part(source, name, key, path) for name, key in names]
    made = [part_problems(part, plan_columns(cfg.columns, part)) for part in parts]
    refused: dict[str, list[str]] = {}
    for m in made:
        for why, rows in m.refused.items():
            refused.setdefault(why, []).extend(rows)
    refuse_rows(path, refused)
    train = made[0].problems()
    if cfg.eval_split is not None:
        return DatasetTask(train, made[1].problems(), str(path))
    random.Random(cfg.seed).shuffle(train)
    return DatasetTask(train[cfg.eval_size :], train[: cfg.eval_size], parts[0].where)


def split_by_column(cfg: TaskConfig, made: RowProblems, part: Part) -> DatasetTask:
    """Rows marked with `task.train_split` are trained on, those marked `task.eval_split` held out;
    a row marked otherwise (or not at all) is refused, not dropped."""
    assert cfg.eval_split is not None and cfg.columns.split is not None
    wanted = (cfg.train_split, cfg.eval_split)
    others = [r.label for r in made.rows if r.split not in wanted]
    if others:
        raise UserError(
            f"{part.where}: rows whose {cfg.columns.split!r} is neither {cfg.train_split!r} "
            f"(task.train_split) nor {cfg.eval_split!r} (task.eval_split): {name_rows(others)}; "
            "fix or filter them"
        )
    return DatasetTask(made.problems(cfg.train_split), made.problems(cfg.eval_split), part.where)
