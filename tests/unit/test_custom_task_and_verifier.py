"""A researcher's own task (JSONL) and verifier (`module:callable`), validated at load."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlsched.config import load_config
from rlsched.errors import UserError
from rlsched.rl.task import JsonlTask
from rlsched.rl.tasks import build_task
from verifiers.loading import VerifierSet, VerifierSpecError, load_verifier
from verifiers.protocol import ExecutionFault, Verdict, VerifyRequest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "configs" / "tasks" / "addition_sample.jsonl"


def write(tmp_path: Path, *lines: str) -> Path:
    f = tmp_path / "task.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_shipped_sample_task_splits_by_its_split_fields() -> None:
    task = JsonlTask(SAMPLE, eval_size=5, seed=0)
    assert len(task.eval_problems) == 100
    assert task.eval_problems[0].id == "add-000" and task.eval_problems[0].answer == "586"
    train = task.train_problems(random.Random(0))
    assert all(next(train).id >= "add-100" for _ in range(50))


def test_without_split_fields_a_seeded_draw_is_held_out(tmp_path: Path) -> None:
    f = write(tmp_path, *[f'{{"prompt": "q{i}", "reference": "a{i}"}}' for i in range(10)])
    a, b = JsonlTask(f, eval_size=3, seed=1), JsonlTask(f, eval_size=3, seed=1)
    assert [p.id for p in a.eval_problems] == [p.id for p in b.eval_problems] and len(a.eval_problems) == 3


def test_messages_and_per_sample_verifier(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], '
        '"reference": "r", "verifier": "exact_answer", "split": "eval"}',
        '{"prompt": "p", "reference": "r"}',
    )
    task = JsonlTask(f, eval_size=1, seed=0)
    (held,) = task.eval_problems
    assert [m.role for m in held.messages()] == ["system", "user"] and held.verifier == "exact_answer"


def test_bad_lines_are_all_named(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        '{"prompt": "ok", "reference": "r"}',
        "not json",
        '{"prompt": "x"}',
        '{"prompt": "x", "messages": [], "reference": "r"}',
        '{"prompt": "x", "reference": "r", "extra": 1}',
    )
    with pytest.raises(UserError) as info:
        JsonlTask(f, eval_size=1, seed=0)
    msg = str(info.value)
    assert "4 bad line(s)" in msg
    for n in (2, 3, 4, 5):
        assert f"line {n}:" in msg


def test_too_few_lines(tmp_path: Path) -> None:
    f = write(tmp_path, '{"prompt": "x", "reference": "r"}')
    with pytest.raises(UserError, match="needs both training and held-out lines"):
        JsonlTask(f, eval_size=1, seed=0)


def test_config_rules_for_tasks_and_verifiers(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"task\.path is required"):
        load_config(None, ["task.name=jsonl"])
    with pytest.raises(UserError, match=r"verifier\.kind: .*neither a shipped kind"):
        load_config(None, ["verifier.kind=nonsense"])
    with pytest.raises(UserError, match=r"verifier\.kind: .*cannot import 'no_such_module'"):
        load_config(None, ["verifier.kind=no_such_module:f"])
    with pytest.raises(UserError, match="does not exist"):
        build_task(load_config(None, ["task.name=jsonl", f"task.path={tmp_path / 'missing.jsonl'}"]).task)


def test_module_callable_forms() -> None:
    cls = load_verifier("verifiers.exact_answer:ExactAnswerVerifier")
    assert cls.verify(VerifyRequest("s", "1", "1")) == Verdict("s", 1.0, True)
    fn = load_verifier("tests.unit.test_custom_task_and_verifier:half_credit")
    assert fn.verify(VerifyRequest("s", "anything", "x")) == Verdict("s", 0.5, False)
    with pytest.raises(VerifierSpecError, match="has no 'nope'"):
        load_verifier("verifiers.exact_answer:nope")
    with pytest.raises(VerifierSpecError, match="not callable"):
        load_verifier("verifiers.loading:SHIPPED")


def test_a_verifier_returning_nonsense_becomes_a_fault_not_a_reward() -> None:
    from verifiers.protocol import run_verifier

    bad = load_verifier("tests.unit.test_custom_task_and_verifier:returns_text")
    assert isinstance(run_verifier(bad, VerifyRequest("s", "t", "r")), ExecutionFault)


def test_verifier_set_loads_each_kind_once() -> None:
    vs = VerifierSet("exact_answer")
    assert vs.get() is vs.get("exact_answer") is vs.get(None)


def half_credit(request: VerifyRequest) -> float:
    return 0.5


def returns_text(request: VerifyRequest) -> str:
    return "yes"
