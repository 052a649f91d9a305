"""A `dataset` task's column mapping and row checks (on JSONL), and the prompt-length check."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlsched.config import load_config
from rlsched.config_task import TaskConfig
from rlsched.errors import UserError
from rlsched.model.template import Message
from rlsched.rl.datasets import DatasetTask
from rlsched.rl.task import JsonlProblem, JsonlTask, TaskProblem, check_prompt_lengths, name_rows
from tests.helpers import dataset_task


def write_jsonl(tmp_path: Path, rows: list[dict[str, Any]], name: str = "data.jsonl") -> Path:
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def dataset(path: Path, *sets: str) -> DatasetTask:
    task: DatasetTask = dataset_task(path, *sets)
    return task


def gsm8k_like(n: int) -> list[dict[str, Any]]:
    return [{"question": f"q{i}?", "answer": f"work\n#### {i}"} for i in range(n)]


def test_columns_map_a_published_layout(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path, gsm8k_like(10))
    task = dataset(f, "task.columns.prompt=question", "task.columns.reference=answer", "task.eval_size=3")
    assert len(task.eval_problems) == 3
    p = task.eval_problems[0]
    n = int(p.id.removeprefix("line-")) - 1  # ids are line numbers, from 1
    assert p.messages() == [Message(role="user", content=f"q{n}?")] and p.answer == f"work\n#### {n}"
    assert p.verifier is None  # the job's verifier
    train = task.train_problems(random.Random(0))
    held = {q.id for q in task.eval_problems}
    assert not any(next(train).id in held for _ in range(50))


def test_same_seed_same_held_out_rows(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path, [{"prompt": f"p{i}", "reference": str(i)} for i in range(20)])
    a, b = dataset(f, "task.eval_size=5"), dataset(f, "task.eval_size=5")
    assert [p.id for p in a.eval_problems] == [p.id for p in b.eval_problems]


def test_a_missing_mapped_column_names_it_the_file_and_the_columns_there(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path, gsm8k_like(4))
    with pytest.raises(UserError) as info:
        dataset(f, "task.columns.prompt=problem", "task.columns.reference=answer", "task.eval_size=1")
    msg = str(info.value)
    assert "no column 'problem' for task.columns.prompt" in msg and str(f) in msg
    assert "its columns: question, answer" in msg
    with pytest.raises(UserError, match=r"no column 'prompt' for task\.columns\.prompt \(the default\)"):
        dataset(f, "task.eval_size=1")
    with pytest.raises(UserError, match=r"no column 'uid' for task\.columns\.id"):
        dataset(f, "task.columns.prompt=question", "task.columns.reference=answer", "task.columns.id=uid")


def test_rows_with_empty_or_null_prompts_or_references_are_refused_by_line(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"prompt": f"p{i}", "reference": "r"} for i in range(20)]
    for i in (2, 5, 6, 9, 11, 14, 17):
        rows[i]["prompt"] = "" if i % 2 else None
    rows[3]["reference"] = None
    rows[4].pop("reference")  # a key missing from one line is a null there, not a missing column
    rows[7]["reference"] = float("nan")  # pandas' null
    with pytest.raises(UserError) as info:
        dataset(write_jsonl(tmp_path, rows), "task.eval_size=2")
    msg = str(info.value)
    assert "10 row(s) refused, none dropped" in msg
    assert "prompt in 'prompt': line 3, line 6, line 7, line 10, line 12 and 2 more (7 in all)" in msg
    assert "reference in 'reference': line 4, line 5, line 8." in msg


def test_values_are_read_as_they_are_published(tmp_path: Path) -> None:
    rows = [
        {
            "uid": 100 + i,
            "chat": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"u{i}"}],
            "target": i,  # a numeric reference is written out
            "verifier": "math" if i % 2 else None,
        }
        for i in range(6)
    ]
    f = write_jsonl(tmp_path, rows)
    with pytest.raises(UserError, match="needs both training and held-out rows"):
        dataset(f, "task.columns.messages=chat", "task.columns.reference=target", "task.eval_size=6")
    task = dataset(
        f,
        "task.columns.messages=chat",
        "task.columns.reference=target",
        "task.columns.id=uid",
        "task.eval_size=2",
    )
    problems = {p.id: p for p in [*task.eval_problems, *task.train]}
    assert set(problems) == {str(100 + i) for i in range(6)}
    p = problems["103"]
    assert [m.role for m in p.messages()] == ["system", "user"] and p.answer == "3" and p.verifier == "math"
    assert problems["102"].verifier is None  # null: the job's verifier


def test_bad_messages_and_bad_json_lines_are_refused(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"chat": [{"role": "user", "content": "u"}], "reference": "r"} for _ in range(4)
    ]
    rows[0]["chat"] = [{"role": "user", "content": "u", "name": None}]  # Arrow fills struct fields with nulls
    rows[1]["chat"] = [{"role": "narrator", "content": "x"}]
    rows[2]["chat"] = []
    with pytest.raises(UserError, match=r"not a list of \{role, content\} in 'chat': line 2, line 3"):
        dataset(write_jsonl(tmp_path, rows), "task.columns.messages=chat", "task.eval_size=1")
    f = tmp_path / "broken.jsonl"
    f.write_text('{"prompt": "p", "reference": "r"}\nnot json\n[1, 2]\n')
    with pytest.raises(UserError, match=r"not JSON objects: line 2 \(Expecting value\), line 3 \(a list"):
        dataset(f, "task.eval_size=1")


def test_a_split_column_decides_the_held_out_rows(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{i}", "reference": "r", "part": "test" if i < 3 else "train"} for i in range(10)]
    f = write_jsonl(tmp_path, rows)
    task = dataset(f, "task.columns.split=part", "task.eval_split=test")
    assert [p.id for p in task.eval_problems] == ["line-1", "line-2", "line-3"]
    rows[5]["part"] = "validation"
    rows[6]["part"] = None
    with pytest.raises(
        UserError, match=r"neither 'train' \(task\.train_split\) nor 'test'.*: line 6, line 7;"
    ):
        dataset(write_jsonl(tmp_path, rows), "task.columns.split=part", "task.eval_split=test")
    with pytest.raises(UserError, match=r"task\.eval_split name splits, but .* has none"):
        dataset(f, "task.eval_split=test")
    with pytest.raises(UserError, match=r"task\.train_split name splits, but .* has none"):
        dataset(f, "task.train_split=train")


def test_config_refuses_contradictions() -> None:
    with pytest.raises(UserError, match=r"task\.columns\.split \('part'\) needs task\.eval_split"):
        load_config(None, ["task.name=dataset", "task.path=x.jsonl", "task.columns.split=part"])
    with pytest.raises(UserError, match=r"task\.columns: give one of prompt and messages, not both"):
        load_config(
            None, ["task.name=dataset", "task.path=x", "task.columns.prompt=a", "task.columns.messages=b"]
        )
    with pytest.raises(UserError, match=r"task\.format is only for task\.name 'dataset'.*now 'jsonl'"):
        load_config(None, ["task.name=jsonl", "task.path=x.jsonl", "task.format=parquet"])
    with pytest.raises(UserError, match=r"task\.eval_split and task\.train_split are both 'train'"):
        load_config(None, ["task.name=dataset", "task.path=x", "task.eval_split=train"])
    with pytest.raises(UserError, match=r"task\.path is required when task\.name is 'dataset'"):
        load_config(None, ["task.name=dataset"])
    with pytest.raises(
        UserError, match=r"task\.format: Input should be 'auto', 'jsonl', 'parquet' or 'hf_disk'"
    ):
        load_config(None, ["task.name=dataset", "task.path=x", "task.format=csv"])
    assert TaskConfig(name="dataset", path="x").columns.prompt_column == "prompt"  # type: ignore[arg-type]


def test_unknown_path_and_suffix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        dataset(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(UserError, match=r"cannot tell the format of .*data\.csv.*set task\.format"):
        dataset(tmp_path / "data.csv")
    with pytest.raises(UserError, match="holds neither a saved dataset"):
        dataset(tmp_path)


def test_jsonl_task_refuses_empty_prompts_and_references(tmp_path: Path) -> None:
    f = tmp_path / "task.jsonl"
    lines = [
        '{"prompt": "p", "reference": "r"}',
        '{"prompt": " ", "reference": "r"}',
        '{"prompt": "p", "reference": ""}',
    ]
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as info:
        JsonlTask(f, eval_size=1, seed=0)
    assert "line 2: prompt: is empty" in str(info.value) and "line 3: reference: is empty" in str(info.value)


# -- prompt lengths ----------------------------------------------------------------------------------


def problems(*lengths: int) -> list[TaskProblem]:
    return [
        JsonlProblem(f"p{i}", (Message(role="user", content="x" * n),), "1") for i, n in enumerate(lengths)
    ]


def chars(problem: TaskProblem) -> int:
    return len(problem.messages()[0].content)


def test_prompts_that_fill_the_context_are_refused_by_name() -> None:
    with pytest.raises(UserError) as info:
        check_prompt_lengths(problems(5, 10, 12, 10, 11, 30, 99, 10, 40), chars, 10, 4, "task data.jsonl")
    msg = str(info.value)
    assert msg.startswith("task data.jsonl: 8 prompt(s) fill the model's 10-token context")
    assert (
        "p1 (10 tokens), p2 (12 tokens), p3 (10 tokens), p4 (11 tokens), p5 (30 tokens) and 3 more (8 in all)"
        in msg
    )
    assert "Shorten or filter" in msg and "longer context" in msg


def test_prompts_that_fit_are_reported_not_refused() -> None:
    room = check_prompt_lengths(problems(9, 3, 7, 6), chars, 10, 4, "t")  # 9 + 1 generated token fits
    assert (room.rows, room.longest, room.cramped) == (4, 9, 2)  # 9 and 7 leave less than 4 tokens
    assert room.note() is not None and "2 of 4 prompts leave less than sampling.max_tokens (4)" in (
        room.note() or ""
    )
    assert check_prompt_lengths(problems(1, 2), chars, 10, 4, "t").note() is None
    assert check_prompt_lengths([], chars, 10, 4, "t").longest == 0


def test_name_rows_shows_the_first_few_and_the_count() -> None:
    assert name_rows(["a", "b"]) == "a, b"
    assert name_rows([str(i) for i in range(8)], shown=3) == "0, 1, 2 and 5 more (8 in all)"


def test_a_dumped_config_loads_again(tmp_path: Path) -> None:
    """Keys of other task kinds at their defaults pass (a dump holds them all); set, they are refused."""
    cfg = load_config(None, ["task.name=dataset", "task.path=x.parquet", "task.columns.prompt=question"])
    f = tmp_path / "dumped.yaml"
    f.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(f) == cfg
