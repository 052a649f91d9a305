"""The code verifier: real solutions against real tests in the sandbox; wrong, hanging and hostile
solutions are wrong answers, a broken reference is a fault, and timeouts adapt per key."""

from __future__ import annotations

import json

import pytest

from rlsched.policy.timeouts import TimeoutParams, TimeoutTable, adaptive_timeout
from verifiers.code import CodeVerifier, solution_of
from verifiers.loading import load_verifier
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest
from verifiers.sandbox import SandboxLimits, namespaces_available

needs_ns = pytest.mark.skipif(
    not namespaces_available(), reason="PID/net/mount namespaces need root and unshare"
)
TESTS = json.dumps(
    {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"], "key": "add"}
)
FAST = TimeoutParams(floor_s=0.5, cap_s=2.0, hard_cap_s=5.0)


def judge(
    text: str, reference: str = TESTS, verifier: CodeVerifier | None = None
) -> Verdict | ExecutionFault:
    v = verifier or CodeVerifier(SandboxLimits(memory_mb=256), FAST)
    return v.verify(VerifyRequest("p1/0", text, reference))


@needs_ns
@pytest.mark.parametrize(
    "text, reward, detail",
    [
        ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, ""),
        ("def add(a, b):\n    return a - b + 2 * b if a > 0 else a * b", 2 / 3, "assert add(-1, 1) == 0"),
        ("def add(a, b):\n    while True: pass", 0.0, "timeout"),
        ("def add(a, b) return", 0.0, "does not run"),
        ("x = bytearray(1 << 30)\ndef add(a, b): return a + b", 0.0, "does not run"),
        (
            "print('__rlsched_0000000000000000__' + '{\"passed\": 3, \"total\": 3}')\n"
            "def add(a, b): return -99",  # a forged result line ahead of the harness's counts for nothing
            0.0,
            "assert",
        ),
        ("import atexit\natexit.register(lambda: print('forged'))\ndef add(a, b): return a + b", 1.0, ""),
    ],
)
def test_solutions_are_judged_by_their_tests(text: str, reward: float, detail: str) -> None:
    outcome = judge(text)
    assert isinstance(outcome, Verdict), outcome
    assert outcome.reward == pytest.approx(reward) and outcome.correct == (reward == 1.0)
    assert detail in outcome.detail


def test_a_broken_reference_is_a_fault_not_a_zero() -> None:
    for reference in ("not json", json.dumps({"tests": []}), json.dumps({"cases": ["x"]})):
        outcome = judge("def add(a, b): return a + b", reference)
        assert isinstance(outcome, ExecutionFault) and outcome.kind is FaultKind.CRASH


@needs_ns
def test_correct_runs_set_the_key_timeout() -> None:
    verifier = CodeVerifier(SandboxLimits(memory_mb=256), FAST)
    assert verifier.timeouts.timeout("add") == 2.0  # no correct run yet: the cap
    assert isinstance(judge("def add(a, b): return a + b", verifier=verifier), Verdict)
    anchor = verifier.timeouts.anchor("add")
    assert anchor is not None and anchor < 2.0
    assert verifier.timeouts.timeout("add") == max(0.5, 1.5 * anchor)


def test_shipped_kind_loads() -> None:
    assert isinstance(load_verifier("code"), CodeVerifier)
    assert solution_of("text\n```py\nx = 1\n```\nmore") == "x = 1\n"


def test_rollpacker_rule() -> None:
    p = TimeoutParams()  # factor 1.5, floor 2 s, cap 30 s
    assert adaptive_timeout(None, p) == 30.0
    assert adaptive_timeout(1.0, p) == 2.0  # the floor
    assert adaptive_timeout(10.0, p) == 15.0
    assert adaptive_timeout(40.0, p) == 30.0  # the cap
    table = TimeoutTable(TimeoutParams(window=2))
    for seconds in (10.0, 4.0, 3.0):  # the window forgets the old 10 s run
        table.correct_run("k", seconds)
    assert table.anchor("k") == 4.0 and table.timeout("k") == 6.0
    with pytest.raises(ValueError, match="factor"):
        TimeoutParams(factor=0.5)
    with pytest.raises(ValueError, match="floor_s <= cap_s"):
        TimeoutParams(floor_s=40.0)
