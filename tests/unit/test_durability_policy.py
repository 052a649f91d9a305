"""The durability rules (SPEC section 6): the contiguous durable watermark, the commit-cost trade-off
with the SPEC's worked numbers (through `rlsched calc commit` too), pruning behind the watermark, and
where a resumed job starts."""

from __future__ import annotations

import json

import pytest

from rlsched.calc import run
from rlsched.cli import build_parser
from rlsched.errors import UserError
from rlsched.policy.durability import (
    Upload,
    checkpoint_due,
    commit_cost,
    durable_checkpoint,
    prunable,
    resume_point,
    watermark,
)

D, F, P = Upload.DONE, Upload.FAILED, Upload.PENDING


def test_round_3_uploaded_while_round_2_failed_is_durable_through_round_1() -> None:
    assert watermark({1: D, 2: F, 3: D}) == 1


@pytest.mark.parametrize(
    ("rounds", "mark"),
    [
        ({}, 0),
        ({1: P}, 0),
        ({1: F, 2: D}, 0),
        ({1: D, 2: D, 3: D}, 3),
        ({1: D, 2: P, 3: D}, 1),
        ({1: D, 3: D}, 1),  # a missing round is not durable
    ],
)
def test_watermark_is_contiguous(rounds: dict[int, Upload], mark: int) -> None:
    assert watermark(rounds) == mark


def test_a_retried_round_moves_the_watermark_past_the_later_ones() -> None:
    assert watermark({1: D, 2: F, 3: D}) == 1
    assert watermark({1: D, 2: D, 3: D}) == 3


def test_durable_checkpoint_follows_uploads_in_checkpoint_order() -> None:
    saved = [10, 20, 30]
    assert durable_checkpoint(saved, None) == 30  # no uploads: the newest saved
    assert durable_checkpoint(saved, {10: D, 20: F, 30: D}) == 10
    assert durable_checkpoint(saved, {10: P, 20: D, 30: D}) is None
    assert durable_checkpoint([], None) is None


def test_pruning_stays_behind_the_watermark() -> None:
    assert prunable([10, 20, 30, 40], durable=30, keep=2) == [10]  # 30 and 20 kept; 40 is ahead
    assert prunable([10, 20, 30, 40], durable=30, keep=1) == [10, 20]
    assert prunable([10, 20, 30], durable=None, keep=1) == []  # nothing durable: nothing goes
    assert prunable([10], durable=10, keep=1) == []  # never the durable one itself


def test_spec_commit_cost_per_request_and_per_ten() -> None:
    one = commit_cost(100, 0.2, 0.008, 0.002, every=1)
    ten = commit_cost(100, 0.2, 0.008, 0.002, every=10)
    assert (one.overhead_s, one.total_s, one.redo_max_s) == pytest.approx((1.0, 21.0, 0.2))
    assert (ten.overhead_s, ten.total_s, ten.redo_max_s) == pytest.approx((0.28, 20.28, 2.0))


def test_commit_cost_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        commit_cost(100, 0.2, 0.008, 0.002, every=0)
    with pytest.raises(ValueError, match="negative"):
        commit_cost(100, -0.2, 0.008, 0.002, every=1)


def _calc(*argv: str) -> dict:
    args = build_parser().parse_args(["calc", *argv, "--json"])
    return json.loads(run(args.calc_name, args))


def test_calc_commit_reproduces_the_spec() -> None:
    out = _calc(
        "commit", "--requests", "100", "--request-s", "0.2", "--commit-s", "0.008",
        "--per-record-s", "0.002", "--every", "1,10",
    )  # fmt: skip
    assert out["overhead_s"] == pytest.approx([1.0, 0.28])
    assert out["total_s"] == pytest.approx([21.0, 20.28])
    assert out["redo_max_s"] == pytest.approx([0.2, 2.0])


def test_calc_commit_bad_input() -> None:
    with pytest.raises(UserError, match="at least 1"):
        _calc("commit", "--requests", "100", "--request-s", "0.2", "--commit-s", "0.008", "--every", "0")


def test_checkpoint_due_on_schedule_and_at_the_end() -> None:
    assert [i for i in range(1, 11) if checkpoint_due(i, 4, False)] == [4, 8]
    assert checkpoint_due(7, 0, True) and not checkpoint_due(7, 0, False)


def test_resume_point_redoes_what_the_checkpoint_does_not_hold() -> None:
    point = resume_point([1, 2, 3, 4, 5], durable=3)
    assert (point.iteration, point.checkpoint, point.redone) == (3, 3, (4, 5))
    fresh = resume_point([1, 2], durable=None)
    assert (fresh.iteration, fresh.redone) == (0, (1, 2))
