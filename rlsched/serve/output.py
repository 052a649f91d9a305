"""A choice's text as it streams: token ids in, deltas out, that concatenate to the final message.

Each choice decodes its tokens incrementally (`IncrementalDetokenizer`: never half a character) and
holds back the trailing characters that could still begin one of the request's stop strings (or,
where tools are offered, the `<tool_call>` tag, after which everything waits for the parser), so
nothing is streamed and then taken back. When the sample finishes, the rest of its
text (as the engine cut it at the stop string) is the last delta. The non-streaming response is the
same deltas joined, so the two routes agree by construction, not by a second decoding.

Log-probs are written in OpenAI's shape: per sampled token its text, raw log-prob, UTF-8 bytes and
the `top_logprobs` likeliest alternatives.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from rlsched.engine.protocol import Sample, TokenEvent
from rlsched.model.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)


class ChoiceText:
    def __init__(
        self, tokenizer: Tokenizer, stops: Sequence[str], tool_tag: str | None = None, opened: bool = False
    ) -> None:
        """`tool_tag`: where tools are offered, the text from this tag on is held back (it may be a
        call, parsed when the sample finishes). `opened`: the reply begins inside a call the prompt
        opened (a named or required `tool_choice`), so all of it is held back."""
        self._tok = tokenizer
        self._detok = IncrementalDetokenizer(tokenizer)
        self._watch = tuple(s for s in (*stops, tool_tag or "") if s)
        self._opened = opened
        self.sent = ""  # the text streamed so far
        self.token_ids: list[int] = []
        self.logprobs: list[dict[str, Any]] = []

    def push(self, events: Sequence[TokenEvent], with_logprobs: bool) -> str:
        """Take a step's tokens; the text that may be streamed now (possibly empty)."""
        for ev in events:
            self.token_ids.append(ev.token_id)
            self._detok.push(ev.token_id)
            if with_logprobs:
                self.logprobs.append(self._logprob_entry(ev))
        if self._opened:  # inside the opened call: the parser has it all when the sample finishes
            return ""
        text = self._detok.text
        found = [at for s in self._watch if (at := text.find(s)) >= 0]
        if found:  # a stop string (the sample's text ends before it) or the tool tag
            text = text[: min(found)]
        ready = text[: len(text) - self._held(text)]
        if len(ready) <= len(self.sent):
            return ""
        delta = ready[len(self.sent) :]
        self.sent = ready
        return delta

    def _held(self, text: str) -> int:
        """How many trailing characters could still begin a stop string or the tool tag."""
        longest = max((len(s) for s in self._watch), default=1) - 1
        for k in range(min(longest, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._watch):
                return k
        return 0

    def finish(self, sample: Sample, final: str) -> str:
        """The last delta: what `final` (the finished sample's text, or the part of it that is
        content where the rest was tool calls) adds to what was streamed."""
        if not final.startswith(self.sent):  # would mean the engine decoded differently: keep what was sent
            log.warning("%s: streamed text is not a prefix of the sample's text", sample.request_id)
            return ""
        delta = final[len(self.sent) :]
        self.sent = final
        self.token_ids = list(sample.token_ids)
        return delta

    def _logprob_entry(self, ev: TokenEvent) -> dict[str, Any]:
        entry = self._token_entry(ev.token_id, ev.logprob)
        entry["top_logprobs"] = [self._token_entry(t, lp) for t, lp in ev.top]
        return entry

    def _token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._tok.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode())}
