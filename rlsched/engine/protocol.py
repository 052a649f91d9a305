"""The rollout-engine protocol that every engine (`torch_engine.py` and `vllm.py`) implements.

An engine holds one weight version at a time, takes generation requests (token ids, never JSON)
and yields each finished sample the moment it finishes. A sample carries the weight version that
produced it, its per-token log-probabilities under the raw model distribution (before temperature,
penalties, logit bias, top-k and top-p, as vLLM's default `raw_logprobs`; restricted to what a
request's grammar allows, where it has one), and why it stopped. A request may resume from
saved output: its prompt plus the tokens an earlier, reclaimed instance had generated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, NewType, Protocol

if TYPE_CHECKING:
    import torch

    from rlsched.model.tokenizer import Tokenizer
    from rlsched.transfer.manifest import Buffer

RequestId = NewType("RequestId", str)
WeightVersion = NewType("WeightVersion", int)


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token or stop string ended the sample
    LENGTH = "length"  # max_tokens reached, or the model's context is full
    ABORT = "abort"  # aborted by id; the tokens so far are kept so the request can resume


SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1  # what torch's generators take (int64 or uint64)
INDEX_MAX = (1 << 31) - 1  # counts that become tensor sizes or indices


BIAS_MAX = 100.0  # OpenAI's bound on a logit bias
PENALTY_MAX = 2.0  # OpenAI's bound on the presence and frequency penalties


@dataclass(frozen=True)
class Constraint:
    """A grammar that every sampled token keeps the output inside: xgrammar's EBNF text, which both
    engines compile (the torch engine with xgrammar, vLLM through its structured outputs). Tokens
    the grammar does not allow next are masked out before sampling, so no knob can pick them; the
    output ends when the grammar is complete (with a stop token, where the request has any)."""

    grammar: str
    what: str = "a grammar"  # what it describes, for messages ("the JSON schema 'weather'")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs, with vLLM's meanings: temperature 0 is greedy, top_k 0 and top_p 1 are off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (0: off)
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and output (1: off)
    top_logprobs: int = 0  # per sampled token, report the raw log-probs of this many likeliest tokens
    # OpenAI's: subtracted from a token's logit once it is in the output (presence), per time (frequency)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit before sampling)
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be a 64-bit integer, in [{SEED_MIN}, {SEED_MAX}]; got {self.seed}")
        if not 0 <= self.top_k <= INDEX_MAX:
            raise ValueError(f"top_k must be in [0, {INDEX_MAX}] (0 means off)")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 means off)")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0 (1 means off)")
        if not 0 <= self.top_logprobs <= INDEX_MAX:
            raise ValueError(f"top_logprobs must be in [0, {INDEX_MAX}]")
        if not 1 <= self.max_tokens <= INDEX_MAX:
            raise ValueError(f"max_tokens must be in [1, {INDEX_MAX}]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -PENALTY_MAX <= getattr(self, name) <= PENALTY_MAX:
                raise ValueError(f"{name} must be in [-{PENALTY_MAX:g}, {PENALTY_MAX:g}] (0 means off)")
        for token, bias in self.logit_bias:
            if not 0 <= token <= INDEX_MAX:
                raise ValueError(f"logit_bias names token {token}, not a token id")
            if not (math.isfinite(bias) and -BIAS_MAX <= bias <= BIAS_MAX):
                raise ValueError(f"logit_bias for token {token} is {bias}; it must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether a penalty or a bias changes the logits before sampling."""
        return bool(
            self.repetition_penalty != 1.0
            or self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
        )


@dataclass(frozen=True)
class GenerationRequest:
    request_id: RequestId
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    resume_ids: tuple[int, ...] = ()  # output saved by an earlier attempt; generation continues after it


@dataclass(frozen=True)
class Sample:
    """One finished generation. `token_ids` include resumed tokens and the stop token, if any."""

    request_id: RequestId
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: FinishReason
    weight_version: WeightVersion
    stop_reason: str | int | None = None
    resumed_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    # where a new version was swapped in while it ran: (version, index of the first output token that
    # version sampled), oldest first; empty: `weight_version` sampled it all
    version_spans: tuple[tuple[int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def started_version(self) -> WeightVersion | None:
        """The version its first token was sampled at, where a newer one finished it; else None."""
        return WeightVersion(self.version_spans[0][0]) if len(self.version_spans) > 1 else None

    @property
    def oldest_version(self) -> int:
        """The oldest version that sampled any of its tokens: what its staleness counts from."""
        return self.version_spans[0][0] if self.version_spans else int(self.weight_version)

    def token_versions(self) -> list[tuple[int, int, int]]:
        """(version, first token, end) for each version that sampled a run of its tokens."""
        spans = self.version_spans or ((int(self.weight_version), 0),)
        ends = [start for _, start in spans[1:]] + [len(self.token_ids)]
        return [(v, start, end) for (v, start), end in zip(spans, ends, strict=True)]


@dataclass(frozen=True)
class Partial:
    """Output a running request produced since its last report (for the durable store)."""

    request_id: RequestId
    start: int  # index of the first of these tokens within the request's output (resumed ones count)
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


PartialSink = Callable[[Sequence[Partial]], None]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One token a running request just sampled (for streaming), with its raw log-prob and, where
    the request asked for them, the likeliest alternatives as (token id, raw log-prob)."""

    request_id: RequestId
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


TokenSink = Callable[[Sequence[TokenEvent]], None]


class RequestRejected(ValueError):
    """A request the engine cannot run (e.g. a prompt longer than the model's context)."""


def check_fits(req: GenerationRequest, context_length: int) -> None:
    """Reject a request with an empty prompt, or one that leaves no room in the context to generate."""
    used = len(req.prompt_ids) + len(req.resume_ids)
    if not req.prompt_ids:
        raise RequestRejected(f"request {req.request_id}: the prompt is empty")
    if used >= context_length:
        raise RequestRejected(
            f"request {req.request_id}: prompt of {used} tokens does not fit the model's context "
            f"of {context_length} tokens (at least one token must be left to generate); "
            "shorten the prompt"
        )


class WeightStage(Protocol):
    """An engine's next version, filled tensor by tensor while the bytes arrive and swapped in whole
    (`rlsched.engine.staging`)."""

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Stage one tensor: a view of the pull's buffer, which stays valid and unchanged (the
        engine may keep it as its weight, or copy it)."""
        ...

    def commit(self) -> None:
        """Swap every staged tensor in at once, between two decoding steps; refused if any is
        missing."""
        ...


class RolloutEngine(Protocol):
    max_batch: int  # sequences it generates at once
    tokenizer: Tokenizer  # its checkpoint's

    @property
    def version(self) -> WeightVersion: ...

    @property
    def context_length(self) -> int: ...

    def load_weights(self, blob: bytes | Buffer, version: WeightVersion) -> str:
        """Load BF16 safetensors bytes as `version`; return the checksum of what was loaded."""
        ...

    def pull_buffer(self, nbytes: int) -> Buffer | None:
        """A buffer to pull a version into that `load_weights` then takes without copying it (vLLM:
        a file in shared memory that its workers map); None where any buffer will do."""
        ...

    def stage(self, version: WeightVersion) -> WeightStage | None:
        """A staging copy to fill tensor by tensor while the bytes arrive and swap in at once
        (`rlsched.engine.staging`); None where the engine takes a version only whole."""
        ...

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        on_partial: PartialSink | None = None,
        partial_every_s: float = 0.25,
    ) -> Iterator[Sample]:
        """Yield each request's sample as soon as it finishes (short ones before long ones). With
        `on_partial`, every `partial_every_s` the live requests' new tokens are reported (an entry
        with no tokens is a heartbeat)."""
        ...

    def abort(self, request_id: RequestId) -> None:
        """Finish a running or queued request now with `FinishReason.ABORT`."""
        ...

    def shutdown(self) -> None:
        """Release what the engine holds outside this process (vLLM's engine processes); idempotent."""
        ...
