"""The torch rollout engine over Hugging Face models: the same tokens and log-probs as transformers'
own forward, on every family; continuous batching; streaming order; finish reasons; resume; abort;
seeds; weights by tensor name, tied heads included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlsched.engine.batch_invariant import fixed_rows
from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    RequestId,
    RequestRejected,
    Sample,
    SamplingParams,
)
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import Checkpoint, checksum, load_checkpoint, to_bf16_bytes
from rlsched.model.template import Message

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
FAMILIES = ["llama", "llama_tied", "qwen2", "qwen3", "mistral"]


def prompt_ids(ck: Checkpoint, i: int) -> tuple[int, ...]:
    text = f"What is {i}+{3 * i}?" + " x" * (i % 5)
    return tuple(ck.template.encode(ck.tokenizer, [Message(role="user", content=text)]))


def req(ck: Checkpoint, i: int, params: SamplingParams = GREEDY, **kw: object) -> GenerationRequest:
    return GenerationRequest(RequestId(str(i)), prompt_ids(ck, i), params, **kw)  # type: ignore[arg-type]


def _reference_logprobs(
    model: torch.nn.Module, prompt: tuple[int, ...], tokens: tuple[int, ...]
) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([[*prompt, *tokens]])).logits.float().log_softmax(-1)[0]
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(tokens)]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_and_logprobs_match_transformers(family: str, tiny_dirs: dict[str, Path]) -> None:
    """Continuous batching (3 rows for 6 requests) gives HF `generate`'s greedy tokens and the log-probs
    of its full forward; Mistral's 48-token window is crossed (prompts ~30 + 40 new tokens)."""
    ck = load_checkpoint(tiny_dirs[family])
    ref = load_checkpoint(tiny_dirs[family]).model
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=3)
    params = SamplingParams(temperature=0.0, max_tokens=40)
    out = {s.request_id: s for s in engine.generate([req(ck, i, params) for i in range(6)])}
    for i in range(6):
        ids = prompt_ids(ck, i)
        with torch.no_grad():
            hf = ref.generate(
                torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        s = out[str(i)]
        assert list(s.token_ids) == hf[0, len(ids) :].tolist()
        assert list(s.logprobs) == pytest.approx(_reference_logprobs(ref, ids, s.token_ids), abs=1e-4)


def test_greedy_is_deterministic_and_batch_independent(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    batch = [req(tiny, i) for i in range(6)]
    first = {s.request_id: s.token_ids for s in engine.generate(batch)}
    again = {s.request_id: s.token_ids for s in engine.generate(list(reversed(batch)))}
    alone = {s.request_id: s.token_ids for s in engine.generate([batch[3]])}
    assert first == again
    assert alone["3"] == first["3"]


def test_cache_and_no_cache_engines_agree(tiny_dirs: dict[str, Path], tiny: Checkpoint) -> None:
    batch = [req(tiny, i) for i in range(5)]
    cached = TorchRolloutEngine(load_checkpoint(tiny_dirs["llama"]).model, tiny.tokenizer)
    plain = TorchRolloutEngine(load_checkpoint(tiny_dirs["llama"]).model, tiny.tokenizer, use_cache=False)
    a = {s.request_id: s for s in cached.generate(batch)}
    b = {s.request_id: s for s in plain.generate(batch)}
    for rid in a:
        assert a[rid].token_ids == b[rid].token_ids
        assert a[rid].logprobs == pytest.approx(b[rid].logprobs, abs=1e-4)


def test_a_freed_row_takes_the_next_request_at_once(tiny: Checkpoint, tiny_dirs: dict[str, Path]) -> None:
    """One row, three requests: each is served as the one before finishes, no wave to wait for."""
    engine = TorchRolloutEngine(load_checkpoint(tiny_dirs["llama"]).model, tiny.tokenizer, max_batch=1)
    lengths = {"0": 2, "1": 9, "2": 4}
    reqs = [req(tiny, int(k), SamplingParams(temperature=0.0, max_tokens=n)) for k, n in lengths.items()]
    order = [(s.request_id, s.num_tokens) for s in engine.generate(reqs)]
    assert order == [("0", 2), ("1", 9), ("2", 4)]


def test_short_samples_are_yielded_before_long_ones_finish(
    engine: TorchRolloutEngine, tiny: Checkpoint
) -> None:
    short = req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=2))
    long = req(tiny, 1, SamplingParams(temperature=0.0, max_tokens=40))
    stream = engine.generate([long, short])
    first = next(stream)
    assert first.request_id == "0" and first.num_tokens == 2
    # the long sample is still running: abort it now and it comes back cut short
    engine.abort(RequestId("1"))
    second = next(stream)
    assert second.request_id == "1"
    assert second.finish_reason is FinishReason.ABORT
    assert 2 <= second.num_tokens < 40


def test_max_tokens_gives_length(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    (s,) = engine.generate([req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=5))])
    assert s.finish_reason is FinishReason.LENGTH and s.num_tokens == 5 and len(s.logprobs) == 5


def test_stop_token_gives_stop_and_is_kept_in_ids(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    (free,) = engine.generate([req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=12))])
    stop_tok = free.token_ids[3]
    (s,) = engine.generate(
        [req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_tok,)))]
    )
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop_tok
    assert s.token_ids[-1] == stop_tok and s.token_ids == free.token_ids[: len(s.token_ids)]


def test_stop_string_gives_stop_and_is_cut_from_text(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    (free,) = engine.generate([req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=30))])
    text = tiny.tokenizer.decode(free.token_ids)
    cut = next(i for i in range(3, len(text)) if text[i].strip() and text[i] != "\ufffd")
    stop = text[cut]
    (s,) = engine.generate([req(tiny, 0, SamplingParams(temperature=0.0, max_tokens=30, stop=(stop,)))])
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop
    assert s.text == text[: text.find(stop)]


def test_resume_from_saved_prefix_continues_identically(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=16)
    (full,) = engine.generate([req(tiny, 0, params)])
    saved = full.token_ids[:6]
    (resumed,) = engine.generate([req(tiny, 0, params, resume_ids=saved)])
    assert resumed.token_ids == full.token_ids
    assert resumed.resumed_tokens == 6
    assert resumed.logprobs == pytest.approx(full.logprobs, abs=1e-4)


def test_resumed_and_fresh_requests_share_a_prefill(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=16)
    (full,) = engine.generate([req(tiny, 0, params)])
    mixed = {
        s.request_id: s
        for s in engine.generate([req(tiny, 0, params, resume_ids=full.token_ids[:9]), req(tiny, 1, params)])
    }
    assert mixed["0"].token_ids == full.token_ids
    assert mixed["0"].logprobs == pytest.approx(full.logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_batch_independent(
    engine: TorchRolloutEngine, tiny: Checkpoint
) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=10, seed=11)
    (alone,) = engine.generate([req(tiny, 0, p)])
    together = {
        s.request_id: s
        for s in engine.generate([req(tiny, 1, SamplingParams(max_tokens=10)), req(tiny, 0, p)])
    }
    assert together["0"].token_ids == alone.token_ids
    other = SamplingParams(temperature=1.0, max_tokens=10, seed=12)
    same = [GenerationRequest(RequestId(str(k)), prompt_ids(tiny, 0), other) for k in range(8)]
    assert len({s.token_ids for s in engine.generate(same)}) == 1  # same seed, same prompt: same tokens
    unseeded = [
        GenerationRequest(RequestId(str(k)), prompt_ids(tiny, 0), SamplingParams(max_tokens=10))
        for k in range(8)
    ]
    assert len({s.token_ids for s in engine.generate(unseeded)}) > 1  # a shared prefill, separate draws


def test_a_seeded_request_gives_the_same_tokens_and_logprobs_in_any_batch(tiny_dirs: dict[str, Path]) -> None:
    """What a requeued request relies on to reproduce its first attempt
    (`rlsched.engine.batch_invariant`): generated alone, in batches of 5 (whose last steps decode 1 to
    4 rows) and all 24 at once, each seeded request's tokens and log-probs agree to the bit. Without
    fixed-row products, on an AMD EPYC in fp32, all 24 differed alone and 14 in batches of 5 (log-probs
    by up to 1e-5, tokens alike); with a floor of 4 rows instead, which held there, 24 differed alone
    on an Intel Xeon. The prompts share one length, as the addition task's do: with lengths that
    differ, left padding moves where a row's keys start, and attention sums them in another grouping
    (docs/internals/engines.md)."""
    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=64, seed=3, batch_invariant=True)
    candidates = [prompt_ids(ck, i) for i in range(200)]
    length = max(set(map(len, candidates)), key=[len(c) for c in candidates].count)
    prompts = [c for c in candidates if len(c) == length][:24]
    assert len(set(prompts)) == 24
    reqs = [
        GenerationRequest(RequestId(str(i)), p, SamplingParams(max_tokens=4 + i % 9, seed=100 + i))
        for i, p in enumerate(prompts)
    ]

    def run(batches: list[list[GenerationRequest]]) -> dict[str, tuple[tuple[int, ...], tuple[float, ...]]]:
        return {s.request_id: (s.token_ids, s.logprobs) for b in batches for s in engine.generate(b)}

    together = run([reqs])
    assert run([[r] for r in reqs]) == together
    assert run([reqs[i : i + 5] for i in range(0, len(reqs), 5)]) == together


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_from_fixed_row_products_in_any_batch(
    threads: int, dtype: torch.dtype
) -> None:
    """`fixed_rows` on the shapes whose plain products differ by batch size on the CPUs measured
    (inner sizes of 384 and up: any `M` below 16 on an Intel Xeon, up to 64 with two threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        for inner, outer in [(128, 256), (576, 1536), (1536, 576)]:
            weight = torch.randn(outer, inner, generator=gen).to(dtype)
            bias = torch.randn(outer, generator=gen).to(dtype)
            x = torch.randn(200, inner, generator=gen).to(dtype)
            whole = fixed_rows(x, weight, bias)
            for start, rows in [(0, 1), (7, 3), (50, 5), (3, 17), (100, 64)]:
                assert torch.equal(
                    fixed_rows(x[start : start + rows], weight, bias), whole[start : start + rows]
                )
    finally:
        torch.set_num_threads(before)


def test_top_k_one_is_greedy(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    (g,) = engine.generate([req(tiny, 0, GREEDY)])
    (k1,) = engine.generate([req(tiny, 0, SamplingParams(temperature=1.0, top_k=1, max_tokens=12))])
    assert g.token_ids == k1.token_ids


def test_logprobs_are_the_raw_model_distribution(engine: TorchRolloutEngine, tiny: Checkpoint) -> None:
    (s,) = engine.generate([req(tiny, 0, SamplingParams(temperature=0.7, max_tokens=6, seed=1))])
    assert list(s.logprobs) == pytest.approx(
        _reference_logprobs(tiny.model, s.prompt_ids, s.token_ids), abs=1e-4
    )


def test_prompt_longer_than_context_is_rejected(engine: TorchRolloutEngine) -> None:
    long = GenerationRequest(RequestId("0"), tuple([7] * (engine.context_length + 5)), GREEDY)
    with pytest.raises(RequestRejected, match="context"):
        list(engine.generate([long]))


def test_more_requests_than_rows(tiny: Checkpoint, tiny_dirs: dict[str, Path]) -> None:
    small = TorchRolloutEngine(load_checkpoint(tiny_dirs["llama"]).model, tiny.tokenizer, max_batch=3)
    big = TorchRolloutEngine(load_checkpoint(tiny_dirs["llama"]).model, tiny.tokenizer, max_batch=64)
    batch = [req(tiny, i, SamplingParams(temperature=0.0, max_tokens=3 + 4 * (i % 3))) for i in range(8)]
    assert {s.request_id: s.token_ids for s in small.generate(batch)} == {
        s.request_id: s.token_ids for s in big.generate(batch)
    }


@pytest.mark.parametrize("family", ["llama", "llama_tied"])
def test_weights_load_by_name_with_version_and_checksum(family: str, tiny_dirs: dict[str, Path]) -> None:
    """A tied head is published once (safetensors refuses shared tensors) and follows its embedding."""
    source = load_checkpoint(tiny_dirs[family])
    with torch.no_grad():
        for p in source.model.parameters():
            p.add_(0.01)
    blob = to_bf16_bytes(source.model)
    target = load_checkpoint(tiny_dirs[family])
    engine = TorchRolloutEngine(target.model, target.tokenizer)
    assert engine.load_weights(blob, 5) == checksum(blob)  # type: ignore[arg-type]
    (s,) = engine.generate([req(target, 0)])
    assert s.weight_version == 5
    ref = TorchRolloutEngine(source.model.to(torch.bfloat16).float(), source.tokenizer)
    (r,) = ref.generate([req(source, 0)])
    assert s.token_ids == r.token_ids
    if family == "llama_tied":
        model = target.model
        assert (
            model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        )


def test_rows_of_very_different_lengths_each_stop_at_their_own_limit(engine: TorchRolloutEngine) -> None:
    context = engine.context_length
    params = SamplingParams(temperature=0.0, max_tokens=50)
    long = GenerationRequest(RequestId("0"), tuple([7] * (context - 6)), params)
    short = GenerationRequest(RequestId("1"), (7, 8, 9, 10, 11), params)
    out = {s.request_id: s for s in engine.generate([long, short])}
    assert out["0"].finish_reason is FinishReason.LENGTH and out["0"].num_tokens == 6  # the context is full
    assert out["1"].finish_reason is FinishReason.LENGTH and out["1"].num_tokens == 50


def test_a_generate_is_not_starved_by_a_serve_under_steady_load(tiny: Checkpoint) -> None:
    """The endpoint's streams keep an instance's serve loop busy; the job's own batch on the same
    engine still runs: the serve stops admitting while it waits, its rows finish, the batch runs,
    and the streams go on after it."""
    import threading

    from rlsched.engine.stream_server import StreamServer

    engine = TorchRolloutEngine(tiny.model, tiny.tokenizer, max_batch=4)
    server = StreamServer(engine)
    served: list[str] = []
    stop = threading.Event()
    params = SamplingParams(temperature=0.0, max_tokens=6)

    def feed(k: int) -> None:  # each finished stream is replaced at once: the intake never empties
        def done(event: object) -> None:
            if isinstance(event, Sample):
                served.append(event.request_id)
                if not stop.is_set():
                    feed(k + 100)

        server.submit(GenerationRequest(RequestId(f"s{k}"), prompt_ids(tiny, k % 7), params), 0, done)

    for k in range(6):
        feed(k)
    while len(served) < 8:  # the serve loop runs with requests waiting
        threading.Event().wait(0.01)
    batch: list[str] = []
    worker = threading.Thread(
        target=lambda: batch.extend(s.request_id for s in engine.generate([req(tiny, i) for i in range(3)]))
    )
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the batch waited behind the serve loop"
    assert sorted(batch) == ["0", "1", "2"]
    after = len(served)
    while len(served) < after + 4:  # the streams are served again after the batch
        threading.Event().wait(0.01)
    stop.set()
    server.close()


def test_a_request_running_across_a_weight_swap_says_which_version_it_began_at(
    tiny_dirs: dict[str, Path],
) -> None:
    """The endpoint's episodes must see every version that sampled them: a serve's row that was
    running when a new version came in finishes under it, and its sample names both."""
    import threading

    from rlsched.engine.protocol import TokenEvent, WeightVersion
    from rlsched.engine.stream_server import StreamServer

    ck = load_checkpoint(tiny_dirs["llama"])
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=2)
    server = StreamServer(engine)
    began, finished = threading.Event(), threading.Event()
    out: list[Sample] = []

    def deliver(event: object) -> None:
        if isinstance(event, list) and event and isinstance(event[0], TokenEvent):
            began.set()
        elif isinstance(event, Sample):
            out.append(event)
            finished.set()

    params = SamplingParams(temperature=0.0, max_tokens=200)  # no stop tokens: it runs to 200
    server.submit(GenerationRequest(RequestId("long"), prompt_ids(ck, 1), params), 0, deliver)
    assert began.wait(30)
    engine.load_weights(to_bf16_bytes(ck.model), WeightVersion(1))
    assert finished.wait(60)
    server.close()
    (sample,) = out
    assert sample.weight_version == 1 and sample.started_version == 0
    (again,) = engine.generate([GenerationRequest(RequestId("after"), prompt_ids(ck, 1), GREEDY)])
    assert again.weight_version == 1 and again.started_version is None
