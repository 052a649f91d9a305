"""`dataset` tasks read from real Parquet files and shards and from `save_to_disk` directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsched.config import load_config
from rlsched.config_task import TaskFormat
from rlsched.errors import UserError
from rlsched.rl.datasets import DatasetTask, read_source, resolve_format
from rlsched.rl.tasks import build_task
from tests.helpers import dataset_task


def dataset(path: Path, *sets: str) -> DatasetTask:
    task: DatasetTask = dataset_task(path, *sets)
    return task


def gsm8k(n: int, start: int = 0) -> dict[str, list[Any]]:
    return {
        "question": [f"What is {i} + 1?" for i in range(start, start + n)],
        "answer": [f"{i} + 1 = {i + 1}\n#### {i + 1}" for i in range(start, start + n)],
    }


GSM8K_COLUMNS = ("task.columns.prompt=question", "task.columns.reference=answer")


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def all_problems(task: DatasetTask) -> list[Any]:
    return [*task.eval_problems, *task.train]


def test_a_parquet_file(tmp_path: Path) -> None:
    f = write_parquet(tmp_path / "train.parquet", gsm8k(12))
    task = dataset(f, *GSM8K_COLUMNS, "task.eval_size=4")
    assert len(task.eval_problems) == 4 and len(all_problems(task)) == 12
    p = next(q for q in all_problems(task) if q.id == "row-3")
    assert p.messages()[0].content == "What is 3 + 1?" and p.answer.endswith("#### 4")


def test_hub_shards_are_splits_and_the_eval_split_is_held_out(tmp_path: Path) -> None:
    root = tmp_path / "gsm8k" / "main"
    write_parquet(root / "train-00000-of-00002.parquet", gsm8k(5))
    write_parquet(root / "train-00001-of-00002.parquet", gsm8k(5, start=5))
    write_parquet(root / "test-00000-of-00001.parquet", gsm8k(3, start=100))
    assert resolve_format(root, TaskFormat.AUTO) is TaskFormat.PARQUET
    assert set(read_source(root, TaskFormat.AUTO)) == {"train", "test"}
    task = dataset(root, *GSM8K_COLUMNS, "task.eval_split=test")
    assert [p.id for p in task.eval_problems] == ["test-0", "test-1", "test-2"]
    assert {p.id for p in task.train} == {f"train-{i}" for i in range(10)}  # shards in name order
    held_out_by_draw = dataset(root, *GSM8K_COLUMNS, "task.eval_size=2")
    assert all(p.id.startswith("train-") for p in all_problems(held_out_by_draw))  # test split unread
    with pytest.raises(
        UserError, match=r"has no split 'validation' \(task\.eval_split\); its splits: test, train"
    ):
        dataset(root, *GSM8K_COLUMNS, "task.eval_split=validation")


def test_converter_layout_and_plain_shards(tmp_path: Path) -> None:
    conv = tmp_path / "converted"
    write_parquet(conv / "train" / "0000.parquet", {"question": ["a", "", "c"], "answer": ["1", "2", "3"]})
    write_parquet(conv / "test" / "0000.parquet", gsm8k(2))
    assert set(read_source(conv, TaskFormat.PARQUET)) == {"train", "test"}
    plain = tmp_path / "plain"
    write_parquet(plain / "part-a.parquet", gsm8k(3))
    write_parquet(plain / "part-b.parquet", gsm8k(3, start=3))
    (whole,) = read_source(plain, TaskFormat.AUTO).values()
    assert [whole.label(i) for i in (0, 4)] == ["plain/part-a.parquet row 0", "plain/part-b.parquet row 1"]
    rows = gsm8k(4)
    rows["question"][1] = ""
    write_parquet(conv / "test" / "0000.parquet", rows)
    with pytest.raises(UserError, match=r"prompt in 'question': train row 1, test row 1\. Fix"):
        dataset(conv, *GSM8K_COLUMNS, "task.eval_split=test")
    assert len(dataset(plain, *GSM8K_COLUMNS, "task.eval_size=2").train) == 4


def test_parquet_refusals_name_the_column_and_the_rows(tmp_path: Path) -> None:
    f = write_parquet(tmp_path / "data.parquet", gsm8k(8))
    with pytest.raises(UserError) as info:
        dataset(f, "task.columns.prompt=problem", "task.columns.reference=answer", "task.eval_size=2")
    assert f"{f} has no column 'problem' for task.columns.prompt; its columns: question, answer" in str(
        info.value
    )
    rows = gsm8k(8)
    rows["question"][2] = None
    rows["answer"][6] = "   "
    g = write_parquet(tmp_path / "holes.parquet", rows)
    with pytest.raises(UserError) as info:
        dataset(g, *GSM8K_COLUMNS, "task.eval_size=2")
    msg = str(info.value)
    assert "2 row(s) refused, none dropped" in msg
    assert "prompt in 'question': row 2" in msg and "reference in 'answer': row 6" in msg
    odd = tmp_path / "odd"
    write_parquet(odd / "a.parquet", gsm8k(2))
    write_parquet(odd / "b.parquet", {"question": ["q"]})
    with pytest.raises(UserError, match=r"the shards of .* differ: b\.parquet has no column answer"):
        dataset(odd, *GSM8K_COLUMNS, "task.eval_size=1")


def test_a_saved_dataset_dict(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({**gsm8k(6), "uid": [f"t{i}" for i in range(6)]}),
            "test": datasets.Dataset.from_dict({**gsm8k(2), "uid": ["e0", "e1"]}),
        }
    ).save_to_disk(str(saved))
    assert resolve_format(saved, TaskFormat.AUTO) is TaskFormat.HF_DISK
    task = dataset(saved, *GSM8K_COLUMNS, "task.columns.id=uid", "task.eval_split=test")
    assert [p.id for p in task.eval_problems] == ["e0", "e1"] and len(task.train) == 6
    with pytest.raises(
        UserError, match=r"has no split 'training' \(task\.train_split\); its splits: test, train"
    ):
        dataset(saved, *GSM8K_COLUMNS, "task.train_split=training")
    with pytest.raises(
        UserError, match=r"split 'train' has no column 'prompt' .*its columns: question, answer, uid"
    ):
        dataset(saved, "task.eval_split=test")
    with pytest.raises(UserError, match="has splits of its own"):
        dataset(saved, *GSM8K_COLUMNS, "task.columns.split=uid", "task.eval_split=test")


def test_a_saved_dataset_with_messages_and_a_split_column(tmp_path: Path) -> None:
    saved = tmp_path / "chat"
    rows = {
        "messages": [[{"role": "user", "content": f"say {i}"}] for i in range(6)],
        "reference": [str(i) for i in range(6)],
        "split": ["train", "train", "eval", "train", "eval", None],
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(saved))
    with pytest.raises(UserError, match=r"neither 'train' .* nor 'eval' \(task\.eval_split\): row 5;"):
        dataset(saved, "task.columns.messages=messages", "task.columns.split=split", "task.eval_split=eval")
    rows["split"][5] = "train"
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "fixed"))
    task = dataset(
        tmp_path / "fixed",
        "task.columns.messages=messages",
        "task.columns.split=split",
        "task.eval_split=eval",
    )
    assert [p.id for p in task.eval_problems] == ["row-2", "row-4"]
    assert task.eval_problems[0].messages()[0].content == "say 2"


def test_a_directory_that_is_not_a_saved_dataset(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="is not a dataset written by save_to_disk"):
        dataset(tmp_path / "empty", "task.format=hf_disk")


def test_the_readme_example(tmp_path: Path) -> None:
    data = tmp_path / "data" / "gsm8k"
    splits = {"train": gsm8k(40), "test": gsm8k(20, start=40)}
    datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in splits.items()}).save_to_disk(
        str(data)
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        f"task:\n  name: dataset\n  path: {data}\n  eval_split: test\n"
        "  columns: {prompt: question, reference: answer}\nverifier:\n  kind: math\n"
    )
    task = build_task(load_config(job).task)
    assert isinstance(task, DatasetTask) and len(task.eval_problems) == 20 and len(task.train) == 40
