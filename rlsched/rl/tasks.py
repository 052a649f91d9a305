"""The task a job's config names (`task.name`), built: the one place that knows every task kind.

The toy addition task and JSONL files live in `rlsched.rl.task`; a Hugging Face dataset or a
parquet/JSON file (`rlsched.rl.datasets`) and the word problems (`rlsched.rl.word_problems`) build
on its `JsonlProblem`, so this factory sits above all three rather than inside the first (where it
made the three modules import each other). `datasets` and `pyarrow` are still imported only by the
readers that need them.
"""

from __future__ import annotations

from rlsched.config_task import TaskConfig, TaskKind
from rlsched.rl.datasets import DatasetTask, load_dataset_task
from rlsched.rl.task import AdditionTask, JsonlTask
from rlsched.rl.word_problems import ArithmeticTask

Task = AdditionTask | JsonlTask | DatasetTask | ArithmeticTask


def build_task(cfg: TaskConfig) -> Task:
    """The task `cfg` names, with its held-out split drawn (`task.eval_size`, `task.seed`)."""
    match cfg.name:
        case TaskKind.ADDITION:
            return AdditionTask(cfg.digits, cfg.eval_size, cfg.seed)
        case TaskKind.JSONL:
            assert cfg.path is not None  # the config's validator guarantees it
            return JsonlTask(cfg.path, cfg.eval_size, cfg.seed)
        case TaskKind.DATASET:
            return load_dataset_task(cfg)
        case TaskKind.ARITHMETIC:
            return ArithmeticTask(cfg.level, cfg.train_size, cfg.eval_size, cfg.seed)
