"""In-flight weight updates in the torch engine: a version swapped in between two decoding steps of a
running request. Each token records the version that sampled it; by default the earlier tokens'
keys and values are recomputed under the new weights, so every token after the swap has exactly the
new version's log-prob; kept instead, they drift, and the drift is what this measures."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from rlsched.engine.intake import Intake
from rlsched.engine.protocol import (
    GenerationRequest,
    RequestId,
    Sample,
    SamplingParams,
    TokenEvent,
    WeightVersion,
)
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import Checkpoint, load_checkpoint, load_state_bytes, to_bf16_bytes
from rlsched.model.template import Message
from rlsched.policy.versions import SwapKV

SWAP_AFTER = 8  # tokens sampled under version 0 before version 1 comes in
LENGTH = 24


def _prompt(ck: Checkpoint, i: int) -> tuple[int, ...]:
    text = f"Count from {i} to {i + 20}:"
    return tuple(ck.template.encode(ck.tokenizer, [Message(role="user", content=text)]))


def _perturbed_bytes(model: torch.nn.Module, seed: int) -> bytes:
    """Version 1: every weight moved by 5% of its spread (a large update, so the drift shows)."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * p.float().std().nan_to_num() * torch.randn(p.shape, generator=gen).to(p.dtype))
    return to_bf16_bytes(other)


def _logprobs(model: torch.nn.Module, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([[*prompt, *tokens]])).logits.float().log_softmax(-1)[0]
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def _run_with_swap(
    dirs: Path, swap_kv: SwapKV, new: bytes, rows: int = 3
) -> tuple[list[Sample], torch.nn.Module, torch.nn.Module]:
    """`rows` greedy requests; version 1 loaded the moment the first has sampled SWAP_AFTER tokens."""
    ck = load_checkpoint(dirs)
    old = copy.deepcopy(ck.model)
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=rows, swap_kv=swap_kv)
    params = SamplingParams(temperature=0.0, max_tokens=LENGTH)
    reqs = [GenerationRequest(RequestId(str(i)), _prompt(ck, i), params) for i in range(rows)]
    seen = {"n": 0}

    def on_tokens(events: Sequence[TokenEvent]) -> None:
        seen["n"] += sum(e.request_id == "0" for e in events)
        if seen["n"] == SWAP_AFTER:
            engine.load_weights(new, WeightVersion(1))

    intake = Intake(reqs)
    intake.close()
    samples = list(engine.serve(intake, on_tokens))
    newer = copy.deepcopy(old)
    load_state_bytes(newer, new)
    return sorted(samples, key=lambda s: s.request_id), old.eval(), newer.eval()


def _after_swap_gap(samples: list[Sample], model: torch.nn.Module) -> float:
    """Mean |engine log-prob - `model`'s full forward| over the tokens sampled after the swap."""
    gaps = []
    for s in samples:
        ref = _logprobs(model, s.prompt_ids, s.token_ids)
        gaps += [abs(a - b) for a, b in zip(s.logprobs[SWAP_AFTER:], ref[SWAP_AFTER:], strict=True)]
    return sum(gaps) / len(gaps)


def test_each_token_records_its_version_and_recomputed_keys_make_the_new_log_probs_exact(
    tiny_dirs: dict[str, Path],
) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    new = _perturbed_bytes(ck.model, seed=1)
    samples, old, newer = _run_with_swap(tiny_dirs["llama"], SwapKV.RECOMPUTE, new)
    for s in samples:
        assert s.version_spans == ((0, 0), (1, SWAP_AFTER))
        assert s.token_versions() == [(0, 0, SWAP_AFTER), (1, SWAP_AFTER, LENGTH)]
        assert s.weight_version == 1 and s.started_version == 0 and s.oldest_version == 0
        before = _logprobs(old, s.prompt_ids, s.token_ids)[:SWAP_AFTER]
        after = _logprobs(newer, s.prompt_ids, s.token_ids)[SWAP_AFTER:]
        assert list(s.logprobs[:SWAP_AFTER]) == pytest.approx(before, abs=1e-4)
        assert list(s.logprobs[SWAP_AFTER:]) == pytest.approx(after, abs=1e-4)
    # greedy: the tokens after the swap are the new version's continuation of the old one's start
    engine = TorchRolloutEngine(newer, ck.tokenizer, max_batch=3, version=1)
    cont = [
        GenerationRequest(s.request_id, s.prompt_ids, SamplingParams(temperature=0.0, max_tokens=LENGTH),
                          resume_ids=s.token_ids[:SWAP_AFTER])
        for s in samples
    ]  # fmt: skip
    again = sorted(engine.generate(cont), key=lambda s: s.request_id)
    assert [a.token_ids for a in again] == [s.token_ids for s in samples]


def test_kept_keys_and_values_drift_from_the_new_version_and_the_drift_is_measured(
    tiny_dirs: dict[str, Path],
) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    new = _perturbed_bytes(ck.model, seed=1)
    exact, _, newer = _run_with_swap(tiny_dirs["llama"], SwapKV.RECOMPUTE, new)
    kept, _, _ = _run_with_swap(tiny_dirs["llama"], SwapKV.KEEP, new)
    assert all(s.version_spans == ((0, 0), (1, SWAP_AFTER)) for s in kept)
    assert _after_swap_gap(exact, newer) < 1e-4
    assert _after_swap_gap(kept, newer) > 1e-3  # the approximation's drift, reported by bench_inflight


def test_a_request_that_ran_under_one_version_has_no_spans(tiny_dirs: dict[str, Path]) -> None:
    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=2, version=3)
    (s,) = engine.generate([GenerationRequest(RequestId("a"), _prompt(ck, 1), SamplingParams(max_tokens=5))])
    assert s.version_spans == () and s.oldest_version == 3 and s.started_version is None
    assert s.token_versions() == [(3, 0, s.num_tokens)]
    assert engine.recomputed_tokens == 0
