"""The torch engine's live requests: a row's state, the rules that end it, and its sample.

A `Row` is one request in a row of the engine's KV cache, from admission to its sample. It ends
(`finish_reason`) at a stop token, at a stop string completed by its latest token (the text is cut
where the string begins, as vLLM cuts it), when its grammar is complete (a constrained request's),
at `max_tokens` or the context, or when it was aborted.
A resumed request may end before it takes a token (`finished_before`): its resumed tokens may have
spent the budget already. `Reporter` hands the live rows' new tokens to a partial sink (the rollout
instance's store) every so often. The engine (`rlsched.engine.torch_engine`) owns the cache and
the forward passes; these rules need neither, only the row, the context length and the engine's
abort check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    Partial,
    PartialSink,
    RequestId,
    Sample,
    WeightVersion,
)
from rlsched.model.tokenizer import IncrementalDetokenizer, Tokenizer

TakeAbort = Callable[[RequestId], bool]  # whether the request was aborted (and forget that it was)


@dataclass
class Row:
    """A live request: its cache row's span and what it has produced."""

    req: GenerationRequest
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)  # output so far: resumed, then new
    logprobs: list[float] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    stop_reason: str | int | None = None
    text_end: int | None = None  # where a stop string begins in the text
    reported: int = 0  # output tokens already handed to the partial sink
    base: int = 0  # first real slot of its cache row (left padding before it)
    end: int = 0  # the slot its next fed token goes to
    fed: int = 0  # tokens in the cache (the position of the next fed token)
    cached: int = 0  # prompt tokens copied in from the prefix cache
    finish: FinishReason = FinishReason.STOP  # set when it finishes
    spans: list[tuple[int, int]] = field(default_factory=list)  # (version, first output token it sampled)
    kv_version: int = 0  # the version its cache's keys and values were computed under
    matcher: Any = None  # a constrained request's grammar state (`rlsched.engine.grammar`)
    grammar_ended: bool = False  # its grammar is complete (and took its stop token, if it has any)

    @property
    def length(self) -> int:
        """Prompt plus every output token so far (resumed and new)."""
        return len(self.req.prompt_ids) + len(self.tokens)


def finished_before(row: Row, context_length: int, take_abort: TakeAbort) -> bool:
    """Resumed tokens may already have spent the budget or the context; an abort may have come
    first. Checked before a newcomer takes its first token."""
    if row.tokens and len(row.tokens) > len(row.req.resume_ids):
        return False  # has generated already: its own checks ran
    if row.req.params.max_tokens <= len(row.tokens) or row.length >= context_length:
        row.finish = FinishReason.LENGTH
        return True
    if take_abort(row.req.request_id):
        row.finish = FinishReason.ABORT
        return True
    return False


def finish_reason(row: Row, context_length: int, take_abort: TakeAbort) -> FinishReason | None:
    """Why the row ends at its latest token (set on the row too), or None: it goes on."""
    tok = row.tokens[-1]
    params = row.req.params
    reason: FinishReason | None = None
    if tok in params.stop_token_ids:
        row.stop_reason = tok
        reason = FinishReason.STOP
    elif (row.detok is not None and hit_stop_string(row, tok)) or row.grammar_ended:
        reason = FinishReason.STOP
    elif len(row.tokens) >= params.max_tokens or row.length >= context_length:
        reason = FinishReason.LENGTH
    elif take_abort(row.req.request_id):
        reason = FinishReason.ABORT
    if reason is not None:
        row.finish = reason
    return reason


def hit_stop_string(row: Row, tok: int) -> bool:
    """Whether `tok`'s text completes one of the request's stop strings (only the new text and the
    stop's length before it are searched); where it begins is kept to cut the text there."""
    assert row.detok is not None
    delta = row.detok.push(tok)
    if not delta:
        return False
    text = row.detok.text
    for stop in row.req.params.stop:
        found = text.find(stop, max(0, len(text) - len(delta) - len(stop) + 1))
        if found >= 0:
            row.stop_reason, row.text_end = stop, found
            return True
    return False


def to_sample(row: Row, reason: FinishReason, tokenizer: Tokenizer) -> Sample:
    """The finished row's sample: its text cut before a stop string it hit, its version spans where
    an update landed while it generated."""
    if row.detok is not None and row.text_end is not None:
        text = row.detok.text[: row.text_end]
    else:
        text = tokenizer.decode(row.tokens)
    return Sample(
        request_id=row.req.request_id,
        prompt_ids=row.req.prompt_ids,
        token_ids=tuple(row.tokens),
        logprobs=tuple(row.logprobs),
        text=text,
        finish_reason=reason,
        weight_version=WeightVersion(row.spans[-1][0]),
        stop_reason=row.stop_reason,
        resumed_tokens=len(row.req.resume_ids),
        cached_tokens=row.cached,
        version_spans=tuple(row.spans) if len(row.spans) > 1 else (),
    )


class Reporter:
    """Hands each live row's new tokens to the partial sink every `every_s` seconds."""

    def __init__(self, sink: PartialSink, every_s: float) -> None:
        self.sink, self.every_s = sink, every_s
        self.last = time.monotonic()

    def maybe_report(self, rows: list[Row]) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        out = []
        for row in rows:
            start = row.reported
            out.append(
                Partial(row.req.request_id, start, tuple(row.tokens[start:]), tuple(row.logprobs[start:]))
            )
            row.reported = len(row.tokens)
        self.sink(out)
