"""The sampling helpers the torch engine applies to each step's logits (`rlsched.engine.sampling`)."""

from __future__ import annotations

import math

import torch

from rlsched.engine.protocol import SamplingParams
from rlsched.engine.sampling import adjusted, top_logprobs


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0], [2.0, -1.0, 3.0]])
    params = [SamplingParams(repetition_penalty=2.0), SamplingParams()]
    out = adjusted(logits, params, [(0, 1), (0, 1)], [(0,), ()])
    assert out.tolist() == [[1.0, -2.0, 3.0], [2.0, -1.0, 3.0]]  # row 2 has no penalty
    assert logits.tolist()[0] == [2.0, -1.0, 3.0]  # the raw logits are left as they were


def test_no_penalty_or_bias_returns_the_logits_themselves() -> None:
    logits = torch.zeros(2, 4)
    assert adjusted(logits, [SamplingParams(), SamplingParams()], [(1,), (2,)], [(), ()]) is logits


def test_openai_penalties_count_output_tokens_only_and_the_bias_adds_first() -> None:
    """frequency: minus 0.5 per occurrence in the output; presence: minus 1 once; the prompt's tokens
    are not counted; the bias is added before a repetition penalty divides (vLLM's order)."""
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0, logit_bias=((3, 2.0),))
    out = adjusted(logits, [p], [(0,)], [(1, 1, 2)])
    assert out.tolist() == [[1.0, 1.0 - 2 * 0.5 - 1.0, 1.0 - 0.5 - 1.0, 3.0]]
    q = SamplingParams(repetition_penalty=2.0, logit_bias=((0, 3.0),))
    assert adjusted(logits, [q], [(0,)], [()]).tolist() == [[2.0, 1.0, 1.0, 1.0]]  # (1 + 3) / 2


def test_top_logprobs_are_normalised_and_only_where_asked() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [1.0, 0.0]])
    norm = logits.logsumexp(-1)
    tops = top_logprobs(logits, norm, [1, 0])
    assert tops[1] == () and tops[0][0][0] == 1
    assert math.isclose(tops[0][0][1], math.log(0.75), rel_tol=1e-6)
    assert top_logprobs(logits, norm, [0, 0]) == [(), ()]
