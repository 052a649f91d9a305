"""The torch rollout engine: batched decoding with a KV cache, each sample yielded when it finishes.

Requests are decoded in waves of at most `max_batch` rows. A wave left-pads its prompts into one
preallocated KV cache, prefills them in one forward pass, then advances every live row one token per
step. When a row finishes (stop token, stop string, max_tokens, full context, or abort) its sample
is yielded at once and the row is dropped from the cache, so later steps cost less and short samples
reach the caller while long ones still run.

Resuming: a request's `resume_ids` (output an earlier attempt generated) are prefilled with its
prompt; their log-probabilities are recomputed under the current weights from the prefill logits,
and generation continues after them, counting them against `max_tokens`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    Partial,
    PartialSink,
    RequestId,
    RequestRejected,
    Sample,
    WeightVersion,
    check_fits,
)
from rlsched.engine.sampling import RowSamplers, select_tokens
from rlsched.model.checkpoint import checksum, load_state_bytes
from rlsched.model.llama import KVCache, LlamaForCausalLM
from rlsched.model.tokenizer import ByteTokenizer, IncrementalDetokenizer


@dataclass
class _Row:
    """A live request inside a wave."""

    req: GenerationRequest
    prefix_len: int  # prompt + resumed tokens
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    stop_reason: str | int | None = None
    text_end: int | None = None  # where a stop string begins in the text
    reported: int = 0  # output tokens already handed to the partial sink

    @property
    def length(self) -> int:
        """Prompt plus every output token so far (resumed and new)."""
        return len(self.req.prompt_ids) + len(self.tokens)


@dataclass
class _Recompute:
    """State of the no-cache baseline: the whole sequence so far, run again at every step."""

    ids: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.ids = self.ids.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)

    def append(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, tokens[:, None]], 1)
        self.valid = torch.cat([self.valid, torch.ones_like(tokens[:, None], dtype=torch.bool)], 1)
        self.positions = torch.cat([self.positions, positions], 1)


State = KVCache | _Recompute


class TorchRolloutEngine:
    """`RolloutEngine` on a torch `LlamaForCausalLM` (CPU or one GPU)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: ByteTokenizer,
        *,
        max_batch: int = 64,
        use_cache: bool = True,
        seed: int = 0,
        version: int = 0,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.use_cache = use_cache
        self._version = WeightVersion(version)
        self._generator = torch.Generator().manual_seed(seed)
        self._aborted: set[RequestId] = set()
        self._lock = threading.Lock()

    @property
    def version(self) -> WeightVersion:
        return self._version

    @property
    def context_length(self) -> int:
        return self.model.config.max_position_embeddings

    def load_weights(self, blob: bytes, version: WeightVersion) -> str:
        load_state_bytes(self.model, blob)
        self._version = WeightVersion(version)
        return checksum(blob)

    def abort(self, request_id: RequestId) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def shutdown(self) -> None:
        """Nothing to release: the model lives in this process."""

    def check(self, req: GenerationRequest) -> None:
        """Reject a request that cannot run, naming the limit it breaks."""
        check_fits(req, self.context_length)
        bad = [t for t in (*req.prompt_ids, *req.resume_ids) if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise RequestRejected(f"request {req.request_id}: token ids out of range: {bad[:5]}")

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        on_partial: PartialSink | None = None,
        partial_every_s: float = 0.25,
    ) -> Iterator[Sample]:
        for req in requests:
            self.check(req)
        for start in range(0, len(requests), self.max_batch):
            reporter = _Reporter(on_partial, partial_every_s) if on_partial else None
            yield from self._wave(list(requests[start : start + self.max_batch]), reporter)

    # -- one wave ------------------------------------------------------------------------------

    @torch.no_grad()
    def _wave(self, reqs: list[GenerationRequest], reporter: _Reporter | None) -> Iterator[Sample]:
        rows = [self._new_row(r) for r in reqs]
        samplers = RowSamplers.build([r.params for r in reqs], self._generator)
        prefix = max(r.prefix_len for r in rows)
        # decode steps this wave can take: each row stops at its max_tokens or at the context's end
        steps = max(
            min(r.req.params.max_tokens - len(r.req.resume_ids), self.context_length - r.prefix_len)
            for r in rows
        )
        logits, cache = self._prefill(rows, prefix, prefix + max(steps, 0))
        for i, row in enumerate(rows):
            self._resume_logprobs(row, logits[i], prefix)
        last = logits[:, -1]
        early = [self._early_finish(r) for r in rows]
        for row, reason in zip(rows, early, strict=True):
            if reason is not None:
                yield self._sample(row, reason)
        live = [i for i, reason in enumerate(early) if reason is None]
        if len(live) < len(rows):
            last, cache, samplers = self._keep(torch.tensor(live, dtype=torch.long), last, cache, samplers)
        while live:
            logp = last.float().log_softmax(-1)
            tokens = select_tokens(last.float(), samplers)
            chosen = logp.gather(1, tokens[:, None])[:, 0]
            keep: list[int] = []
            for j, i in enumerate(live):
                row = rows[i]
                row.tokens.append(int(tokens[j]))
                row.logprobs.append(float(chosen[j]))
                reason = self._finish_reason(row)
                if reason is None:
                    keep.append(j)
                else:
                    yield self._sample(row, reason)
            live = [live[j] for j in keep]
            if not live:
                break
            if reporter is not None:
                reporter.maybe_report([rows[i] for i in live])
            if len(keep) < tokens.shape[0]:
                idx = torch.tensor(keep)
                tokens = tokens.index_select(0, idx)
                last, cache, samplers = self._keep(idx, last, cache, samplers)
            last = self._decode_step(rows, live, tokens, cache)

    def _new_row(self, req: GenerationRequest) -> _Row:
        row = _Row(
            req=req, prefix_len=len(req.prompt_ids) + len(req.resume_ids), reported=len(req.resume_ids)
        )
        if req.params.stop:
            row.detok = IncrementalDetokenizer(self.tokenizer)
        return row

    def _prefill(self, rows: list[_Row], prefix: int, slots: int) -> tuple[torch.Tensor, State]:
        b = len(rows)
        ids = torch.full((b, prefix), self.model.config.pad_token_id, dtype=torch.long)
        valid = torch.zeros(b, prefix, dtype=torch.bool)
        for i, row in enumerate(rows):
            seq = (*row.req.prompt_ids, *row.req.resume_ids)
            ids[i, prefix - len(seq) :] = torch.tensor(seq)
            valid[i, prefix - len(seq) :] = True
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        if not self.use_cache:
            return self.model(ids, positions=positions, key_valid=valid), _Recompute(ids, valid, positions)
        dtype = next(self.model.parameters()).dtype
        cache = KVCache(self.model.config, b, slots, dtype)
        cache.valid[:, :prefix] = valid
        return self.model(ids, positions=positions, cache=cache), cache

    def _decode_step(
        self, rows: list[_Row], live: list[int], tokens: torch.Tensor, cache: State
    ) -> torch.Tensor:
        positions = torch.tensor([[rows[i].length - 1] for i in live])
        if isinstance(cache, _Recompute):
            cache.append(tokens, positions)
            return self.model(cache.ids, positions=cache.positions, key_valid=cache.valid)[:, -1]
        cache.valid[:, cache.length] = True
        return self.model(tokens[:, None], positions=positions, cache=cache)[:, -1]

    def _keep(
        self, idx: torch.Tensor, last: torch.Tensor, cache: State, samplers: RowSamplers
    ) -> tuple[torch.Tensor, State, RowSamplers]:
        samplers.keep_rows(idx)
        cache.keep_rows(idx)
        return last.index_select(0, idx), cache, samplers

    def _resume_logprobs(self, row: _Row, logits: torch.Tensor, prefix: int) -> None:
        """Log-probs of resumed tokens under the current weights, from the prefill logits."""
        n = len(row.req.resume_ids)
        if n == 0:
            return
        end = prefix - 1  # logits at position p predict token p + 1
        pred = logits[end - n : end].float().log_softmax(-1)
        ids = torch.tensor(row.req.resume_ids)
        row.tokens.extend(row.req.resume_ids)
        row.logprobs.extend(pred.gather(1, ids[:, None])[:, 0].tolist())
        if row.detok is not None:
            for t in row.req.resume_ids:
                row.detok.push(t)

    def _early_finish(self, row: _Row) -> FinishReason | None:
        """Resumed tokens may already have spent the budget; an abort may have come first."""
        if row.req.params.max_tokens <= len(row.tokens) or row.prefix_len >= self.context_length:
            return FinishReason.LENGTH
        if self._take_abort(row.req.request_id):
            return FinishReason.ABORT
        return None

    def _take_abort(self, rid: RequestId) -> bool:
        with self._lock:
            if rid in self._aborted:
                self._aborted.discard(rid)
                return True
        return False

    def _finish_reason(self, row: _Row) -> FinishReason | None:
        tok = row.tokens[-1]
        params = row.req.params
        if tok in params.stop_token_ids:
            row.stop_reason = tok
            return FinishReason.STOP
        if row.detok is not None and self._hit_stop_string(row, tok):
            return FinishReason.STOP
        if len(row.tokens) >= params.max_tokens or row.length >= self.context_length:
            return FinishReason.LENGTH
        if self._take_abort(row.req.request_id):
            return FinishReason.ABORT
        return None

    def _hit_stop_string(self, row: _Row, tok: int) -> bool:
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

    def _sample(self, row: _Row, reason: FinishReason) -> Sample:
        if row.detok is not None and row.text_end is not None:
            text = row.detok.text[: row.text_end]
        else:
            text = self.tokenizer.decode(row.tokens)
        return Sample(
            request_id=row.req.request_id,
            prompt_ids=row.req.prompt_ids,
            token_ids=tuple(row.tokens),
            logprobs=tuple(row.logprobs),
            text=text,
            finish_reason=reason,
            weight_version=self._version,
            stop_reason=row.stop_reason,
            resumed_tokens=len(row.req.resume_ids),
        )


class _Reporter:
    """Hands each live row's new tokens to the partial sink every `every_s` seconds."""

    def __init__(self, sink: PartialSink, every_s: float) -> None:
        self.sink, self.every_s = sink, every_s
        self.last = time.monotonic()

    def maybe_report(self, rows: list[_Row]) -> None:
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
