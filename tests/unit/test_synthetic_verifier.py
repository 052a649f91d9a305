"""The synthetic verifier spends the time its reference says, then judges exactly; bad references fault."""

from __future__ import annotations

import json
import time

import pytest

from verifiers.loading import load_verifier
from verifiers.protocol import ExecutionFault, Verdict, VerifyRequest


@pytest.mark.parametrize("burn", [False, True])
def test_spends_the_time_then_judges(burn: bool) -> None:
    v = load_verifier("synthetic")
    reference = json.dumps({"answer": "586", "seconds": 0.05, "burn": burn})
    start = time.perf_counter()
    right = v.verify(VerifyRequest("s1", " 586 ", reference))
    assert time.perf_counter() - start >= 0.05
    assert isinstance(right, Verdict) and right.correct and right.reward == 1.0
    wrong = v.verify(VerifyRequest("s2", "585", reference))
    assert isinstance(wrong, Verdict) and not wrong.correct and wrong.reward == 0.0


def test_plain_reference_is_an_exact_answer_and_bad_ones_fault() -> None:
    v = load_verifier("synthetic")
    assert isinstance(v.verify(VerifyRequest("s", "12", "12")), Verdict)
    for reference in ('{"answer": 5', '{"seconds": 1}', '{"answer": "1", "seconds": -1}'):
        assert isinstance(v.verify(VerifyRequest("s", "1", reference)), ExecutionFault)
