"""The SPEC's worked numbers, reproduced through the analytic models and `rlsched calc`."""

from __future__ import annotations

import json

import pytest

from rlsched.calc import run
from rlsched.cli import build_parser
from rlsched.errors import UserError
from rlsched.policy.iteration import amdahl, iteration
from rlsched.policy.queueing import batch, fcfs


def calc(*argv: str) -> dict:
    args = build_parser().parse_args(["calc", *argv, "--json"])
    return json.loads(run(args.calc_name, args))


def test_iteration_spec_section_1() -> None:
    base = calc("iteration", "--generate", "40", "--verify", "10", "--update", "30", "--publish", "5")
    assert base["t_iter"] == 85
    fast = calc(
        "iteration",
        "--generate",
        "40",
        "--verify",
        "10",
        "--update",
        "30",
        "--publish",
        "5",
        "--speedup",
        "generate=2",
    )
    assert fast["t_iter_sped_up"] == 65
    assert fast["speedup"] == pytest.approx(85 / 65) and round(fast["speedup"], 2) == 1.31
    assert fast["cap"] == pytest.approx(85 / 45) and round(fast["cap"], 2) == 1.89
    assert amdahl(40 / 85, 2) == pytest.approx(85 / 65)


def test_queue_spec_section_5() -> None:
    ten = calc("queue", "--arrivals", "0*10", "--service", "1", "--workers", "1")
    assert ten["waits"] == [float(i) for i in range(10)] and ten["mean_wait"] == 4.5
    spread = fcfs([float(i) for i in range(10)], [1.0] * 10, 1)
    assert spread.mean_wait == 0.0  # arriving one a second, nobody waits
    calls = calc("queue", "--arrivals", "0*80", "--service", "1", "--workers", "48")
    assert calls["mean_wait"] == pytest.approx(0.4) and calls["completion"] == 2
    assert sum(w == 1 for w in calls["waits"]) == 32
    assert calc("queue", "--arrivals", "0*80", "--service", "1", "--workers", "96")["completion"] == 1


def test_batch_spec_section_3() -> None:
    one = calc("batch", "--arrivals", "0,6,12", "--cpu", "10,2,8", "--workers", "1")
    assert one["starts"] == [0, 10, 12] and one["ends"] == [10, 12, 20] and one["completion"] == 20
    assert calc("batch", "--arrivals", "0,6,12", "--cpu", "10,2,8", "--workers", "2")["completion"] == 20
    for workers in (1, 2, 8):
        slow = batch([0, 6, 12], [10, 2, 80], None, workers)
        assert slow.completion == 92 and slow.lower_bound == 92
    split = calc("batch", "--arrivals", "0,6,12", "--cpu", "5,1,4", "--gpu", "5,1,4", "--workers", "1")
    assert split["completion"] == 20 and split["lower_bound"] == 20


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["iteration", "--generate", "-1", "--verify", "1", "--update", "1", "--publish", "1"], "negative"),
        (
            [
                "iteration",
                "--generate",
                "1",
                "--verify",
                "1",
                "--update",
                "1",
                "--publish",
                "1",
                "--speedup",
                "training=2",
            ],
            "unknown phase",
        ),
        (["queue", "--arrivals", "0,1", "--service", "1,2,3", "--workers", "1"], "one per job"),
        (["queue", "--arrivals", "0,x", "--service", "1", "--workers", "1"], "expected numbers"),
        (["batch", "--arrivals", "0", "--cpu", "1", "--workers", "0"], "at least 1"),
    ],
)
def test_bad_input_is_a_user_error(argv: list[str], needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        calc(*argv)


def test_iteration_model_directly() -> None:
    r = iteration({"generate": 40, "verify": 10, "update": 30, "publish": 5}, {"generate": 1e12})
    assert r.t_iter_sped_up == pytest.approx(45) and r.speedup == pytest.approx(r.cap)
