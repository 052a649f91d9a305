"""The torch engine's prefix cache on the tiny models: a prompt that shares blocks with an earlier one
computes only the rest, and samples exactly what the engine without a cache samples (every family,
the sliding-window one included); a finished sequence's output is cached for the next turn; a new
weight version empties the cache; a full pool evicts the least recently used blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.engine.prefix_cache import BLOCK
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, SamplingParams, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint, published_state, state_bytes

SHARED = list(range(10, 10 + 3 * BLOCK + 5))  # three whole blocks and a bit


def prompts() -> list[tuple[int, ...]]:
    return [tuple(SHARED + tail) for tail in ([7, 8, 9], [30, 31], [40] * 20, [50])]


def generate(engine: TorchRolloutEngine, seqs: list[tuple[int, ...]], tag: str, n: int = 12) -> list[Sample]:
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=n)
    reqs = [GenerationRequest(RequestId(f"{tag}{i}"), s, params) for i, s in enumerate(seqs)]
    out = {s.request_id: s for s in engine.generate(reqs)}
    return [out[r.request_id] for r in reqs]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_cached_prefixes_sample_exactly_what_a_full_prefill_does(
    tiny_dirs: dict[str, Path], family: str
) -> None:
    ck = load_checkpoint(tiny_dirs[family])
    plain = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=8)
    cached = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=8, prefix_cache_blocks=64)
    expected = generate(plain, prompts(), "p")
    warm = generate(cached, prompts()[:1], "w")
    assert warm[0].cached_tokens == 0
    got = generate(cached, prompts(), "c")
    assert [s.cached_tokens for s in got] == [3 * BLOCK] * 4
    for want, have in zip(expected, got, strict=True):
        assert have.token_ids == want.token_ids
        assert have.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_the_next_turn_finds_the_last_turns_output(tiny_dirs: dict[str, Path]) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=4, prefix_cache_blocks=64)
    [turn] = generate(engine, [tuple(SHARED)], "t1", n=2 * BLOCK)
    follow = (*SHARED, *turn.token_ids, 99, 98, 97)
    [nxt] = generate(engine, [follow], "t2")
    fed = len(SHARED) + len(turn.token_ids) - 1  # the last sampled token was never fed
    assert nxt.cached_tokens == fed // BLOCK * BLOCK > len(SHARED)


def test_a_new_version_empties_the_cache(tiny_dirs: dict[str, Path]) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=4, prefix_cache_blocks=64)
    generate(engine, prompts()[:1], "a")
    assert engine.prefix_cache is not None and len(engine.prefix_cache) > 0
    blob = state_bytes(published_state(ck.model))
    engine.load_weights(blob, WeightVersion(1))
    assert len(engine.prefix_cache) == 0
    [again] = generate(engine, prompts()[:1], "b")
    assert again.cached_tokens == 0


def test_a_full_pool_evicts_the_least_recently_used_blocks(tiny_dirs: dict[str, Path]) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=4, prefix_cache_blocks=4)
    a = tuple(range(100, 100 + 2 * BLOCK + 1))
    b = tuple(range(150, 150 + 2 * BLOCK + 1))
    c = tuple(range(200, 200 + 2 * BLOCK + 1))
    for seq, tag in ((a, "a"), (b, "b")):
        generate(engine, [seq], tag, n=1)
    assert generate(engine, [a], "a2", n=1)[0].cached_tokens == 2 * BLOCK  # a is now the most recent
    generate(engine, [c], "c", n=1)  # takes b's two blocks
    assert generate(engine, [a], "a3", n=1)[0].cached_tokens == 2 * BLOCK
    assert generate(engine, [b], "b2", n=1)[0].cached_tokens == 0
