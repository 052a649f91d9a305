"""The torch rollout engine: continuous batching over any Hugging Face causal LM, each sample
yielded the moment it finishes.

The engine drives the checkpoint's own `forward` (transformers' modelling code: projections,
biases, q/k norms, rotary embeddings) with a slot KV cache plugged in as its attention
(`rlsched.engine.kv_attention`). Up to `max_batch` requests are live at once, each in a row of the
cache; the rest wait in arrival order. Every step:

1. *admit* - while rows are free, queued requests are prefilled together (left-padded to one width;
   identical prompts, such as a GRPO group's, are computed once and their cache rows copied), and
   each takes its first token from the prefill's logits;
2. *decode* - every live row feeds its latest token, one forward for all of them;
3. *finish* - a row whose token is a stop token, completes a stop string, reaches `max_tokens` or the
   context, or was aborted, yields its sample at once and frees its row, which the next queued
   request takes at the next step (the last live row moves into it, so rows stay contiguous). A
   row's state and these rules are `rlsched.engine.rows`.

Resuming: a request's `resume_ids` (output an earlier attempt generated) are prefilled with its
prompt; their log-probabilities are recomputed under the current weights from the prefill logits,
and generation continues after them, counting them against `max_tokens`. Log-probabilities are the
raw model's (before temperature, penalties, logit bias, top-k and top-p), as vLLM reports them;
a constrained request's are restricted to what its grammar allows (`rlsched.engine.grammar`).

Devices: the engine runs where the model's parameters are (a GPU, if the caller moved it there). The
cache lives there too; token ids, positions and masks are built on the CPU and moved per forward,
and the logits come back to the CPU, where sampling runs with the requests' own seeded generators
(the same draws on either device; a copy of [batch, vocab] floats a step).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from rlsched.engine.batch_invariant import make_batch_invariant
from rlsched.engine.grammar import Grammars, advance
from rlsched.engine.intake import Intake
from rlsched.engine.kv_attention import (
    ATTENTION,
    SlotCache,
    Step,
    decode_mask,
    extend_mask,
    prefill_mask,
    register,
    sliding_window,
)
from rlsched.engine.prefix_cache import BLOCK, PrefixCache
from rlsched.engine.protocol import (
    GenerationRequest,
    PartialSink,
    RequestId,
    RequestRejected,
    Sample,
    TokenEvent,
    TokenSink,
    WeightVersion,
    check_fits,
)
from rlsched.engine.rows import Reporter, Row, finish_reason, finished_before, to_sample
from rlsched.engine.sampling import RowSamplers, adjusted, select_tokens, top_logprobs
from rlsched.engine.staging import ModelStage
from rlsched.engine.turns import Turns
from rlsched.model.checkpoint import checksum, load_state_bytes
from rlsched.model.precision import bf16_native
from rlsched.model.tokenizer import IncrementalDetokenizer, Tokenizer
from rlsched.policy.versions import SwapKV
from rlsched.transfer.manifest import Buffer


def engine_dtype(name: str) -> torch.dtype:
    """`engine.dtype`: auto is bfloat16 where the device computes it natively (a GPU, or a CPU with
    AVX-512 BF16 or AMX, where it runs several times faster than float32), float32 elsewhere."""
    if name == "bfloat16":
        return torch.bfloat16
    if name == "float32":
        return torch.float32
    native = bf16_native("cuda") if torch.cuda.is_available() else bf16_native("cpu")
    return torch.bfloat16 if native else torch.float32


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


class TorchRolloutEngine:
    """`RolloutEngine` on a transformers causal LM (CPU or one GPU)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        *,
        max_batch: int = 64,
        seed: int = 0,
        version: int = 0,
        use_cache: bool = True,
        prefix_cache_blocks: int = 0,
        swap_kv: SwapKV = SwapKV.RECOMPUTE,
        batch_invariant: bool = False,
    ) -> None:
        """`prefix_cache_blocks`: blocks of 16 tokens whose keys and values are kept for requests
        that share a prefix (`rlsched.engine.prefix_cache`; 0: none). `swap_kv`: what becomes of a
        running request's keys and values when a new version is swapped in under it.
        `batch_invariant`: a request's tokens and log-probs the same whatever batch it runs in
        (`rlsched.engine.batch_invariant`; the model's linear layers keep it)."""
        register()
        model.set_attn_implementation(ATTENTION)
        if batch_invariant:
            make_batch_invariant(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.use_cache = use_cache  # False: every step recomputes each sequence whole (a baseline)
        cfg = _text_config(model.config)
        heads = cfg.num_attention_heads
        self._shape = (
            cfg.num_hidden_layers,
            getattr(cfg, "num_key_value_heads", None) or heads,
            getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        )
        self._window = sliding_window(cfg)
        self._context = int(cfg.max_position_embeddings)
        self._vocab = int(model.get_input_embeddings().weight.shape[0])
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._grammars = Grammars(tokenizer, self._vocab)  # constrained requests' (`rlsched.engine.grammar`)
        self._dtype = next(model.parameters()).dtype
        self._device = next(model.parameters()).device  # inputs go there; logits come back to the CPU
        self._cache: SlotCache | None = None
        self._version = WeightVersion(version)
        self._generator = torch.Generator().manual_seed(seed)
        self._aborted: set[RequestId] = set()
        self._events: TokenSink | None = None  # the running serve's token sink
        # a serve's hook for a request that cannot be admitted: it fails alone, the batch goes on
        # (None: the exception ends the call, as `generate`'s caller expects)
        self.on_request_error: Callable[[RequestId, BaseException], None] | None = None
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if prefix_cache_blocks and use_cache else None
        self._lock = threading.Lock()
        self._step = threading.RLock()  # held around each forward: a staged version swaps in between
        self._ran = self._version  # the version the latest forward ran under
        self.swap_kv = swap_kv
        self.recomputed_tokens = 0  # keys and values recomputed after in-flight swaps
        self._turns = Turns()  # one batch loop at a time (a generate, or a serve with work), in turn

    @property
    def version(self) -> WeightVersion:
        return self._version

    @property
    def context_length(self) -> int:
        return self._context

    def load_weights(self, blob: bytes | Buffer, version: WeightVersion) -> str:
        data = blob if isinstance(blob, bytes) else bytes(blob)  # safetensors decodes from bytes
        with self._step:
            load_state_bytes(self.model, data)
            self._new_version(version)
        return checksum(data)

    def _new_version(self, version: int) -> None:
        self._version = WeightVersion(version)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # its keys and values were computed under the old weights

    def pull_buffer(self, nbytes: int) -> None:
        """None: the torch engine loads from any buffer (and stages from the pull's own)."""
        return None

    def stage(self, version: WeightVersion) -> ModelStage:
        """A staging copy for `version`, filled while generation goes on and swapped in between two
        decoding steps (`rlsched.engine.staging`)."""

        def swapped() -> None:
            self._new_version(version)

        return ModelStage(self.model, self._step, swapped)

    def abort(self, request_id: RequestId) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def shutdown(self) -> None:
        """Nothing to release: the model lives in this process."""

    def check(self, req: GenerationRequest) -> None:
        """Reject a request that cannot run, naming the limit it breaks."""
        check_fits(req, self.context_length)
        bad = [t for t in (*req.prompt_ids, *req.resume_ids) if not 0 <= t < self._vocab]
        if bad:
            raise RequestRejected(f"request {req.request_id}: token ids out of range: {bad[:5]}")
        biased = [t for t, _ in req.params.logit_bias if t >= self._vocab]
        if biased:
            raise RequestRejected(
                f"request {req.request_id}: logit_bias names token ids the vocabulary of {self._vocab} "
                f"lacks: {biased[:5]}"
            )
        if (c := req.params.constraint) is not None:  # a grammar that does not compile is refused here
            self._grammars.matcher(c, req.params.stop_token_ids, req.resume_ids)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        on_partial: PartialSink | None = None,
        partial_every_s: float = 0.25,
    ) -> Iterator[Sample]:
        for req in requests:
            self.check(req)
        if requests:
            reporter = Reporter(on_partial, partial_every_s) if on_partial else None
            intake = Intake(requests)
            intake.close()
            yield from self._serve(intake, reporter, None)

    def serve(
        self,
        intake: Intake,
        on_tokens: TokenSink | None = None,
        on_partial: PartialSink | None = None,
        partial_every_s: float = 0.25,
    ) -> Iterator[Sample]:
        """Generate for whatever `intake` holds, as it arrives, until it is closed and drained: each
        sample yielded the moment it finishes, with `on_tokens` every token the moment it is sampled
        (the OpenAI endpoint's streams), and with `on_partial` the rows' new tokens every
        `partial_every_s` (a job's requests, for the durable store). Requests are checked when put in
        the intake."""
        reporter = Reporter(on_partial, partial_every_s) if on_partial else None
        yield from self._serve(intake, reporter, on_tokens)

    # -- the batch loop ----------------------------------------------------------------------------

    @torch.inference_mode()
    def _serve(
        self, intake: Intake, reporter: Reporter | None, on_tokens: TokenSink | None
    ) -> Iterator[Sample]:
        while True:
            self._turns.take()  # one batch loop at a time runs on the cache (a serve idles without it)
            try:
                yield from self._run_batch(intake, reporter, on_tokens)
            finally:
                self._turns.give()
            if not intake.wait():
                return  # closed and drained

    def _run_batch(
        self, intake: Intake, reporter: Reporter | None, on_tokens: TokenSink | None
    ) -> Iterator[Sample]:
        """Steps until no row is live and nothing waits."""
        live: list[Row] = []
        self._events = on_tokens
        if not intake.open and len(intake):
            self._cache_for(intake.pending())  # a closed batch: the whole cache at once
        while True:
            free = self.max_batch - len(live)
            if intake.open and self._turns.others_wait():
                free = 0  # a serve lets its rows finish and hands the cache to the loop that waits
            admitted = intake.take(free) if free else []
            if admitted:
                yield from self._admit(admitted, live)  # 1
            if not live:
                return
            if reporter is not None:
                reporter.maybe_report(live)
            yield from self._decode(live)  # 2, 3

    def _cache_for(self, requests: Sequence[GenerationRequest]) -> None:
        """A cache with a row per concurrent request and slots for the longest prefix plus output;
        kept for the next call when it is large enough (its stale values are finite and masked)."""
        rows = min(self.max_batch, len(requests))
        prefix = max(len(r.prompt_ids) + len(r.resume_ids) for r in requests)
        new = max(r.params.max_tokens - len(r.resume_ids) for r in requests)
        self._reserve(rows, prefix + max(new, 1) + 1, keep_rows=0, keep_slots=0)

    def _reserve(self, rows: int, slots: int, keep_rows: int, keep_slots: int) -> SlotCache:
        """The cache, grown (at least doubled in what is short) to `rows` x `slots` if it is smaller;
        a grown cache keeps the first `keep_rows` rows' first `keep_slots` slots. Serving an open
        intake grows it as requests come and sequences lengthen, so memory follows what runs."""
        cache = self._cache
        if cache is not None and cache.k[0].dtype == self._dtype:
            if cache.rows >= rows and cache.slots >= slots:
                return cache
            rows = max(rows, min(self.max_batch, 2 * cache.rows) if cache.rows < rows else cache.rows)
            slots = max(slots, 2 * cache.slots if cache.slots < slots else cache.slots)
        layers, kv, dim = self._shape
        grown = SlotCache.allocate(layers, rows, kv, slots, dim, self._dtype, self._device)
        if cache is not None and keep_rows and keep_slots:
            grown.take(cache, keep_rows, keep_slots)
        self._cache = grown
        return grown

    def _admit(self, reqs: list[GenerationRequest], live: list[Row]) -> Iterator[Sample]:
        """Prefill newcomers into the rows after the live ones; each takes its first token."""
        reqs, rows = self._rows_for(reqs)
        if not reqs:
            return
        prefixes = [(*r.prompt_ids, *r.resume_ids) for r in reqs]
        first: dict[tuple[int, ...], int] = {}
        for i, p in enumerate(prefixes):
            first.setdefault(p, i)
        unique = sorted(first.values())
        width = max(len(prefixes[i]) for i in unique)
        keep = max(len(r.resume_ids) for r in reqs) + 1  # logits needed: resumed tokens and the next one
        start = len(live)
        live_slots = max((r.end for r in live), default=0)
        cache = self._reserve(start + len(reqs), width, start, live_slots)
        found = {i: self._cached_blocks(reqs[i]) for i in unique}
        seqs, targets = [prefixes[i] for i in unique], [start + i for i in unique]
        with self._step:  # the prefix cache's blocks and the prefill under one version
            if any(found.values()):
                logits = self._extend(seqs, [found[i] for i in unique], targets, width, keep, cache)
            else:
                logits = self._prefill(seqs, targets, width, keep, cache)
        if self.prefix_cache is not None:
            for i in unique:
                self.prefix_cache.store(prefixes[i], cache, start + i, width - len(prefixes[i]))
        at = {i: u for u, i in enumerate(unique)}
        for i, row in enumerate(rows):
            src = first[prefixes[i]]
            if src != i:
                cache.copy_row(start + src, start + i, width)
            row.base, row.end, row.fed = width - len(prefixes[i]), width, len(prefixes[i])
            row.spans, row.kv_version = [(int(self._ran), 0)], int(self._ran)
            row.cached = len(found[src]) * BLOCK
            self._resume_logprobs(row, logits[at[src]])
        live.extend(rows)
        last = torch.stack([logits[at[first[p]], -1] for p in prefixes])
        yield from self._advance(live, cache, last, range(start, len(live)))

    def _prefill(
        self, seqs: list[tuple[int, ...]], rows: list[int], width: int, keep: int, cache: SlotCache
    ) -> torch.Tensor:
        """Logits [U, keep, V] at each sequence's last `keep` positions; their K/V written to `rows`."""
        ids, valid = self._left_padded(seqs, width)
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        step = Step(
            cache,
            torch.tensor(rows),
            prefill=True,
            mask=prefill_mask(valid, None),
            window_mask=prefill_mask(valid, self._window) if self._window else None,
        )
        return self._forward(ids, positions, step, min(keep, width))

    def _left_padded(self, parts: Sequence[Sequence[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids [U, width], each part ending at the last slot after pad ids, and where they are."""
        ids = torch.full((len(parts), width), self._pad, dtype=torch.long)
        valid = torch.zeros(len(parts), width, dtype=torch.bool)
        for i, part in enumerate(parts):
            ids[i, width - len(part) :] = torch.tensor(part, dtype=torch.long)
            valid[i, width - len(part) :] = True
        return ids, valid

    def _cached_blocks(self, req: GenerationRequest) -> list[int]:
        """The prefix cache's blocks for the start of `req`'s prompt (none for a resumed request,
        whose saved tokens' log-probs come from the prefill); the last token is always computed."""
        if self.prefix_cache is None or req.resume_ids:
            return []
        return self.prefix_cache.lookup(req.prompt_ids, len(req.prompt_ids) - 1)

    def _extend(
        self,
        seqs: list[tuple[int, ...]],
        found: list[list[int]],
        rows: list[int],
        width: int,
        keep: int,
        cache: SlotCache,
    ) -> torch.Tensor:
        """`_prefill` after cached prefixes: each row's cached blocks are copied in, and only the
        rest of each sequence is computed (ending at slot `width` in every row, left-padded)."""
        assert self.prefix_cache is not None
        cached = [len(f) * BLOCK for f in found]
        todo = [len(seq) - c for seq, c in zip(seqs, cached, strict=True)]
        t = max(todo)
        ids, valid = self._left_padded([seq[c:] for seq, c in zip(seqs, cached, strict=True)], t)
        positions = torch.zeros(len(seqs), t, dtype=torch.long)
        bases = torch.tensor([width - len(seq) for seq in seqs])
        for u, seq in enumerate(seqs):
            positions[u] = (torch.arange(len(seq) - t, len(seq))).clamp(min=0)
            if found[u]:
                self.prefix_cache.load(cache, rows[u], int(bases[u]), found[u])
        step = Step(
            cache,
            torch.tensor(rows),
            prefill=True,
            mask=extend_mask(bases, valid, width, None),
            window_mask=extend_mask(bases, valid, width, self._window) if self._window else None,
            read=width,
            write=valid[:, None, :, None],
        )
        return self._forward(ids, positions, step, min(keep, t))

    def _decode(self, live: list[Row]) -> Iterator[Sample]:
        """One token for every live row: feed each row's latest token, then sample the next."""
        b = len(live)
        used = max(r.end for r in live) + 1  # each row writes its fed token at slot `end`
        cache = self._reserve(b, used, b, used)
        if not self.use_cache:
            yield from self._recompute(live, cache)
            return
        with self._step:  # no version swaps in between the recomputation and the step
            if self.swap_kv is SwapKV.RECOMPUTE:
                self._recompute_stale(live, cache)
            last = self._decode_logits(live, cache)
        yield from self._advance(live, cache, last, range(b))

    def _decode_logits(self, live: list[Row], cache: SlotCache) -> torch.Tensor:
        """Each live row's latest token fed (its keys and values written), the next token's logits."""
        b = len(live)
        ids = torch.tensor([[r.tokens[-1]] for r in live])
        positions = torch.tensor([[r.fed] for r in live])
        ends = torch.tensor([r.end for r in live])
        bases = torch.tensor([r.base for r in live])
        read = int(ends.max()) + 1
        step = Step(
            cache,
            torch.arange(b),
            prefill=False,
            mask=decode_mask(bases, ends, read, None),
            window_mask=decode_mask(bases, ends, read, self._window) if self._window else None,
            ends=ends,
            read=read,
            contiguous=True,
        )
        last = self._forward(ids, positions, step, 1)[:, -1]
        for r in live:
            r.fed += 1
            r.end += 1
        return last

    def _recompute_stale(self, live: list[Row], cache: SlotCache) -> None:
        """After an in-flight swap, the keys and values of the tokens each running row has fed so far,
        computed anew under the version now in (one prefill per cache layout: rows admitted
        together share one), in place: each row keeps its slots."""
        stale = [i for i, r in enumerate(live) if r.kv_version != self._version]
        by_end: dict[int, list[int]] = {}
        for i in stale:
            by_end.setdefault(live[i].end, []).append(i)
        for end, rows in by_end.items():
            seqs = [(*live[i].req.prompt_ids, *live[i].tokens)[: live[i].fed] for i in rows]
            self._prefill(seqs, rows, end, 1, cache)
            for i in rows:
                live[i].kv_version = self._ran
            self.recomputed_tokens += sum(len(seq) for seq in seqs)

    def _recompute(self, live: list[Row], cache: SlotCache) -> Iterator[Sample]:
        """The no-cache baseline: every live sequence run whole, its last logits sampled."""
        seqs = [(*r.req.prompt_ids, *r.tokens) for r in live]
        width = max(len(s) for s in seqs)
        last = self._prefill(seqs, list(range(len(live))), width, 1, cache)[:, -1]
        for r, seq in zip(live, seqs, strict=True):
            r.base, r.end, r.fed = width - len(seq), width, len(seq)
            r.kv_version = self._ran
        yield from self._advance(live, cache, last, range(len(live)))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, step: Step, keep: int) -> torch.Tensor:
        dev = self._device
        with self._step:
            self._ran = self._version
            out = self.model(
                input_ids=ids.to(dev),
                position_ids=positions.to(dev),
                use_cache=False,
                logits_to_keep=keep,
                rlsched_step=step.to(dev),
            )
        return out.logits.float().cpu()  # sampling runs on the CPU, with the requests' own generators

    def _advance(
        self, live: list[Row], cache: SlotCache, last: torch.Tensor, which: range
    ) -> Iterator[Sample]:
        """Rows `which` of `live` take their next token from `last` [len(which), V]; finished rows
        yield their sample and leave (the last live row moves into the freed cache row)."""
        rows = [live[i] for i in which]
        params = [r.req.params for r in rows]
        self._grammars.mask(last, [r.matcher for r in rows])  # in place: what is logged is masked too
        samplers = RowSamplers.build(params, self._generator, [r.generator for r in rows])
        prompts, outputs = [r.req.prompt_ids for r in rows], [r.tokens for r in rows]
        tokens = select_tokens(adjusted(last, params, prompts, outputs), samplers).tolist()
        picked = last.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        norm = last.logsumexp(-1)
        chosen = (picked - norm).tolist()  # raw log-probs, without a [B, V] log-softmax
        tops = top_logprobs(last, norm, [r.req.params.top_logprobs for r in rows])
        done: list[int] = []
        events: list[TokenEvent] = []
        for i, row, tok, lp, top in zip(which, rows, tokens, chosen, tops, strict=True):
            if finished_before(row, self.context_length, self._take_abort):
                done.append(i)
                continue
            if row.spans[-1][0] != self._ran:  # a version swapped in while it ran samples from here on
                row.spans.append((int(self._ran), len(row.tokens)))
            row.tokens.append(tok)
            row.logprobs.append(lp)
            if row.matcher is not None:
                row.grammar_ended = advance(row.matcher, tok)
            events.append(TokenEvent(row.req.request_id, tok, lp, top))
            if finish_reason(row, self.context_length, self._take_abort) is not None:
                done.append(i)
        if self._events is not None and events:
            self._events(events)
        ended = set(done)
        going = [
            r.matcher for i, r in zip(which, rows, strict=True) if r.matcher is not None and i not in ended
        ]
        if going:  # their next masks, filled beside the next forward
            self._grammars.prefetch(going)
        for i in sorted(done, reverse=True):
            row = live[i]
            if self.prefix_cache is not None and row.kv_version == self._version:  # the next turn starts so
                fed = (*row.req.prompt_ids, *row.tokens)[: row.fed]
                self.prefix_cache.store(fed, cache, i, row.base)
            yield to_sample(row, row.finish, self.tokenizer)
            moved = live.pop()
            if i < len(live):
                cache.copy_row(len(live), i, moved.end)
                live[i] = moved

    def _rows_for(self, reqs: list[GenerationRequest]) -> tuple[list[GenerationRequest], list[Row]]:
        """A row for each request; one whose row cannot be made is handed to `on_request_error`."""
        kept: list[GenerationRequest] = []
        rows: list[Row] = []
        for req in reqs:
            try:
                rows.append(self._new_row(req))
                kept.append(req)
            except Exception as err:
                if self.on_request_error is None:
                    raise
                self.on_request_error(req.request_id, err)
        return kept, rows

    def _new_row(self, req: GenerationRequest) -> Row:
        gen = torch.Generator().manual_seed(req.params.seed) if req.params.seed is not None else None
        row = Row(req=req, generator=gen, reported=len(req.resume_ids))
        if (c := req.params.constraint) is not None:
            row.matcher = self._grammars.matcher(c, req.params.stop_token_ids, req.resume_ids)
        if req.params.stop:
            row.detok = IncrementalDetokenizer(self.tokenizer)
        return row

    def _resume_logprobs(self, row: Row, logits: torch.Tensor) -> None:
        """Log-probs of resumed tokens under the current weights, from the prefill logits [keep, V]
        (the logits at position p predict the token at p + 1; the last one predicts the next token)."""
        n = len(row.req.resume_ids)
        if n == 0:
            return
        keep = logits.shape[0]
        pred = logits[keep - 1 - n : keep - 1]
        if (c := row.req.params.constraint) is not None:  # each position masked as it was sampled
            pred = pred.clone()
            replay = self._grammars.matcher(c, row.req.params.stop_token_ids)
            for j, tok in enumerate(row.req.resume_ids):
                self._grammars.mask(pred[j : j + 1], [replay])
                replay.accept_token(tok)
        pred = pred.log_softmax(-1)
        ids = torch.tensor(row.req.resume_ids)
        row.tokens.extend(row.req.resume_ids)
        row.logprobs.extend(pred.gather(1, ids[:, None])[:, 0].tolist())
        if row.detok is not None:
            for t in row.req.resume_ids:
                row.detok.push(t)

    def _take_abort(self, rid: RequestId) -> bool:
        with self._lock:
            if rid in self._aborted:
                self._aborted.discard(rid)
                return True
        return False
