"""The torch rollout engine: streaming order, determinism, finish reasons, resume, abort, seeds."""

from __future__ import annotations

import pytest
import torch

from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    RequestId,
    RequestRejected,
    SamplingParams,
)
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.llama import LlamaForCausalLM
from rlsched.model.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def req(
    i: int, params: SamplingParams = GREEDY, prompt: str | None = None, **kw: object
) -> GenerationRequest:
    text = prompt if prompt is not None else f"prompt number {i}:" + "x" * (i % 5)
    return GenerationRequest(RequestId(str(i)), tuple(TOK.encode(text)), params, **kw)  # type: ignore[arg-type]


def test_greedy_is_deterministic_and_batch_independent(engine: TorchRolloutEngine) -> None:
    batch = [req(i) for i in range(6)]
    first = {s.request_id: s.token_ids for s in engine.generate(batch)}
    again = {s.request_id: s.token_ids for s in engine.generate(list(reversed(batch)))}
    alone = {s.request_id: s.token_ids for s in engine.generate([batch[3]])}
    assert first == again
    assert alone["3"] == first["3"]


def test_cache_and_no_cache_engines_agree(tiny_model: LlamaForCausalLM) -> None:
    batch = [req(i) for i in range(5)]
    cached = TorchRolloutEngine(tiny_model, TOK, use_cache=True)
    plain = TorchRolloutEngine(tiny_model, TOK, use_cache=False)
    a = {s.request_id: s for s in cached.generate(batch)}
    b = {s.request_id: s for s in plain.generate(batch)}
    for rid in a:
        assert a[rid].token_ids == b[rid].token_ids
        assert a[rid].logprobs == pytest.approx(b[rid].logprobs, abs=1e-4)


def test_short_samples_are_yielded_before_long_ones_finish(engine: TorchRolloutEngine) -> None:
    short = req(0, SamplingParams(temperature=0.0, max_tokens=2))
    long = req(1, SamplingParams(temperature=0.0, max_tokens=40))
    stream = engine.generate([long, short])
    first = next(stream)
    assert first.request_id == "0" and first.num_tokens == 2
    # the long sample is still running: abort it now and it comes back cut short
    engine.abort(RequestId("1"))
    second = next(stream)
    assert second.request_id == "1"
    assert second.finish_reason is FinishReason.ABORT
    assert 2 <= second.num_tokens < 40


def test_max_tokens_gives_length(engine: TorchRolloutEngine) -> None:
    (s,) = engine.generate([req(0, SamplingParams(temperature=0.0, max_tokens=5))])
    assert s.finish_reason is FinishReason.LENGTH and s.num_tokens == 5 and len(s.logprobs) == 5


def test_stop_token_gives_stop_and_is_kept_in_ids(engine: TorchRolloutEngine) -> None:
    (free,) = engine.generate([req(0, SamplingParams(temperature=0.0, max_tokens=12))])
    stop_tok = free.token_ids[3]
    (s,) = engine.generate(
        [req(0, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_tok,)))]
    )
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop_tok
    assert s.token_ids[-1] == stop_tok and s.token_ids == free.token_ids[: len(s.token_ids)]


def test_stop_string_gives_stop_and_is_cut_from_text(engine: TorchRolloutEngine) -> None:
    (free,) = engine.generate([req(0, SamplingParams(temperature=0.0, max_tokens=30))])
    text = TOK.decode(free.token_ids)
    cut = next(i for i in range(3, len(text)) if text[i] != "\ufffd")
    stop = text[cut]
    (s,) = engine.generate([req(0, SamplingParams(temperature=0.0, max_tokens=30, stop=(stop,)))])
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop
    assert s.text == text[: text.find(stop)]


def test_resume_from_saved_prefix_continues_identically(engine: TorchRolloutEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=16)
    (full,) = engine.generate([req(0, params)])
    saved = full.token_ids[:6]
    (resumed,) = engine.generate([req(0, params, resume_ids=saved)])
    assert resumed.token_ids == full.token_ids
    assert resumed.resumed_tokens == 6
    assert resumed.logprobs == pytest.approx(full.logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine: TorchRolloutEngine) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=10, seed=11)
    (alone,) = engine.generate([req(0, p)])
    together = {s.request_id: s for s in engine.generate([req(1, SamplingParams(max_tokens=10)), req(0, p)])}
    assert together["0"].token_ids == alone.token_ids
    other = SamplingParams(temperature=1.0, max_tokens=10, seed=12)
    outs = {s.token_ids for s in engine.generate([req(k, other, prompt="same") for k in range(8)])}
    assert len(outs) == 1  # same seed, same prompt: same tokens


def test_top_k_one_is_greedy(engine: TorchRolloutEngine) -> None:
    (g,) = engine.generate([req(0, GREEDY)])
    (k1,) = engine.generate([req(0, SamplingParams(temperature=1.0, top_k=1, max_tokens=12))])
    assert g.token_ids == k1.token_ids


def test_logprobs_are_the_raw_model_distribution(
    engine: TorchRolloutEngine, tiny_model: LlamaForCausalLM
) -> None:
    (s,) = engine.generate([req(0, SamplingParams(temperature=0.7, max_tokens=6, seed=1))])
    seq = torch.tensor([[*s.prompt_ids, *s.token_ids]])
    with torch.no_grad():
        logp = tiny_model(seq).log_softmax(-1)[0]
    n = len(s.prompt_ids)
    expected = [float(logp[n - 1 + i, t]) for i, t in enumerate(s.token_ids)]
    assert list(s.logprobs) == pytest.approx(expected, abs=1e-4)


def test_prompt_longer_than_context_is_rejected(engine: TorchRolloutEngine) -> None:
    with pytest.raises(RequestRejected, match="context"):
        list(engine.generate([req(0, prompt="y" * 200)]))


def test_waves_larger_than_max_batch(tiny_model: LlamaForCausalLM) -> None:
    small = TorchRolloutEngine(tiny_model, TOK, max_batch=3)
    big = TorchRolloutEngine(tiny_model, TOK, max_batch=64)
    batch = [req(i) for i in range(8)]
    assert {s.request_id: s.token_ids for s in small.generate(batch)} == {
        s.request_id: s.token_ids for s in big.generate(batch)
    }


def test_weights_load_with_version_and_checksum(
    engine: TorchRolloutEngine, tiny_model: LlamaForCausalLM
) -> None:
    from rlsched.model.checkpoint import checksum, to_bf16_bytes

    blob = to_bf16_bytes(tiny_model)
    copy = TorchRolloutEngine(LlamaForCausalLM(tiny_model.config), TOK)
    assert copy.load_weights(blob, 5) == checksum(blob)  # type: ignore[arg-type]
    (s,) = copy.generate([req(0)])
    assert s.weight_version == 5


def test_rows_of_very_different_lengths_each_stop_at_their_own_limit(engine: TorchRolloutEngine) -> None:
    context = engine.context_length
    long = req(0, SamplingParams(temperature=0.0, max_tokens=50), prompt="z" * (context - 6))
    short = req(1, SamplingParams(temperature=0.0, max_tokens=50), prompt="z" * 5)
    out = {s.request_id: s for s in engine.generate([long, short])}
    assert out["0"].finish_reason is FinishReason.LENGTH and out["0"].num_tokens == 6  # the context is full
    assert out["1"].finish_reason is FinishReason.LENGTH and out["1"].num_tokens == 50
