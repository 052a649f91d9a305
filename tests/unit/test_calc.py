"""The SPEC's worked numbers, reproduced through the analytic models and `rlsched calc`."""

from __future__ import annotations

import json

import pytest

from rlsched.calc import run
from rlsched.cli import build_parser
from rlsched.errors import UserError
from rlsched.policy.iteration import amdahl, iteration, pipelined_bound
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


SPEC_CHAIN = ["--generate", "1", "--verify", "0.2", "--update", "0.8", "--publish", "0.1", "--load", "0.3"]


def test_the_pipelined_bound_spec_section_1() -> None:
    """1 + 0.2 + 0.8 + 0.1 + 0.3: 2.4 s in sequence; with k = 1, max(1.3, 0.9, 0.2, 1.2) = 1.3 s."""
    one = calc("iteration", *SPEC_CHAIN, "--staleness", "1")
    assert one["chain"] == pytest.approx(2.4) and one["bound"] == pytest.approx(1.3)
    assert one["terms"] == pytest.approx(
        {"generate + load": 1.3, "update + publish": 0.9, "verify_exposed": 0.2, "chain / (k + 1)": 1.2}
    )
    assert one["binding"] == "generate + load" and round(one["speedup"], 2) == 1.85
    assert calc("iteration", *SPEC_CHAIN, "--staleness", "0")["bound"] == pytest.approx(2.4)  # no overlap
    deep = pipelined_bound(1.0, 0.2, 1.0, 0.1, 0.0, staleness=4)  # balanced: the trainer binds
    assert deep.bound == pytest.approx(1.1) and deep.binding == "update + publish"
    exposed = calc("iteration", *SPEC_CHAIN, "--verify-exposed", "0.05", "--staleness", "1")
    assert exposed["chain"] == pytest.approx(2.25)  # only what generation leaves exposed counts


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
        (["remaining"], "give --samples LIST or --dist SPEC"),
        (["remaining", "--dist", "{kind: gamma}"], "is not a distribution"),
        (["remaining", "--samples", "1,2", "--elapsed", "-1"], "non-negative"),
        (["remaining", "--samples", "1,2", "--quantile", "1.5"], "between 0 and 1"),
        (["deferral", "--saved", "-1", "--group-devices", "1", "--delay", "1"], "non-negative"),
        (["iteration", *SPEC_CHAIN[:-2], "--staleness", "-1"], "staleness must be 0 or more"),
        (["iteration", *SPEC_CHAIN], "add --staleness K"),
        (["iteration", *SPEC_CHAIN, "--staleness", "1", "--speedup", "generate=2"], "leave it out"),
    ],
)
def test_bad_input_is_a_user_error(argv: list[str], needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        calc(*argv)


def test_remaining_spec_section_3() -> None:
    out = calc("remaining", "--samples", "1*9,100", "--elapsed", "10")
    assert out["remaining"] == pytest.approx(90) and out["mean"] == pytest.approx(10.9)
    assert calc("remaining", "--samples", "1*9,100")["remaining"] == pytest.approx(10.9)
    pareto = calc("remaining", "--dist", "{kind: pareto, scale: 1, shape: 3}", "--elapsed", "10")
    assert pareto["remaining"] == pytest.approx(10 / (3 - 1), rel=0.1)  # e / (alpha - 1)


def test_latest_start_spec_section_3() -> None:
    out = calc("latest-start", "--completion", "120", "--need", "100", "--prep", "5")
    assert (out["latest_start"], out["latest_prep_start"]) == (20, 15)


@pytest.mark.parametrize("devices, net, verdict", [("64", -68, "do not defer"), ("16", 28, "defer")])
def test_deferral_spec_section_3(devices: str, net: float, verdict: str) -> None:
    out = calc("deferral", "--saved", "60", "--group-devices", devices, "--delay", "2")
    assert out["net"] == net and out["verdict"] == verdict


def test_iteration_model_directly() -> None:
    r = iteration({"generate": 40, "verify": 10, "update": 30, "publish": 5}, {"generate": 1e12})
    assert r.t_iter_sped_up == pytest.approx(45) and r.speedup == pytest.approx(r.cap)
