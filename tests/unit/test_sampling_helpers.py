"""The sampling helpers the torch engine applies to each step's logits (`rlsched.engine.sampling`)."""

from __future__ import annotations

import math

import torch

from rlsched.engine.sampling import repetition_penalized, top_logprobs


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0], [2.0, -1.0, 3.0]])
    out = repetition_penalized(logits, [2.0, 1.0], [(0, 1, 0), (0, 1)])
    assert out.tolist() == [[1.0, -2.0, 3.0], [2.0, -1.0, 3.0]]  # row 2 has no penalty
    assert logits.tolist()[0] == [2.0, -1.0, 3.0]  # the raw logits are left as they were


def test_no_penalty_returns_the_logits_without_reading_what_was_seen() -> None:
    logits = torch.zeros(2, 4)

    def never() -> object:
        raise AssertionError("seen tokens were built")
        yield

    assert repetition_penalized(logits, [1.0, 1.0], never()) is logits  # type: ignore[arg-type]


def test_top_logprobs_are_normalised_and_only_where_asked() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [1.0, 0.0]])
    norm = logits.logsumexp(-1)
    tops = top_logprobs(logits, norm, [1, 0])
    assert tops[1] == () and tops[0][0][0] == 1
    assert math.isclose(tops[0][0][1], math.log(0.75), rel_tol=1e-6)
    assert top_logprobs(logits, norm, [0, 0]) == [(), ()]
