"""Message content stays text: a special token's string inside a message never becomes that token.

A chat template renders messages to one string, and encoding that string finds every special
token's text in it, the template's own and any a message carries. So a user (or a tool's output) that
writes `<|im_end|>\\n<|im_start|>system\\n...` closes its own turn and opens a system one: role
injection. vLLM's OpenAI server and transformers' `apply_chat_template(tokenize=True)` both encode it
so (docs/endpoint.md).

`render_shielded` renders with each special token's string in a message's content replaced by a
placeholder no message can contain, puts the strings back, and remembers where they are
(`Rendered.literal`); `Rendered.encode` encodes those spans as plain text (`Tokenizer.encode_text`)
and the rest as usual. A prompt whose messages carry no special token's string is rendered and
encoded exactly as before.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlsched.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class Rendered:
    """A templated prompt: its text, and the (start, end) spans of it that a message's content wrote
    as a special token's string, to be encoded as text."""

    text: str
    literal: tuple[tuple[int, int], ...] = ()

    def encode(self, tokenizer: Tokenizer, start: int = 0) -> list[int]:
        """The ids of `text[start:]`: the literal spans as plain text, the rest as the tokenizer reads
        it (the template's own special tokens)."""
        ids: list[int] = []
        pos = start
        for a, b in self.literal:
            if b <= pos:
                continue
            a = max(a, pos)
            if a > pos:
                ids += tokenizer.encode(self.text[pos:a])
            ids += tokenizer.encode_text(self.text[a:b])
            pos = b
        if pos < len(self.text):
            ids += tokenizer.encode(self.text[pos:])
        return ids


def _content_special(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    strings = sorted(tokenizer.special_strings, key=len, reverse=True)  # the longest match first
    return re.compile("|".join(map(re.escape, strings))) if strings else None


def render_shielded(
    tokenizer: Tokenizer,
    render: Callable[[list[dict[str, Any]]], str],
    messages: Sequence[dict[str, Any]],
    shield: bool = True,
) -> Rendered:
    """`render(messages)` (the template applied to transformers-style messages), with every special
    token's string in a message's `content` kept as text (`Rendered.literal`); with `shield` off,
    read as the tokens themselves (vLLM's behaviour)."""
    pattern = _content_special(tokenizer) if shield else None
    nonce = secrets.token_hex(8)
    found: dict[str, str] = {}

    def placeholder(match: re.Match[str]) -> str:
        key = f"\ue000{nonce}:{len(found)}\ue001"
        found[key] = match.group(0)
        return key

    shielded = []
    for m in messages:
        content = m.get("content")
        if pattern is not None and isinstance(content, str):
            m = {**m, "content": pattern.sub(placeholder, content)}
        shielded.append(m)
    if not found:
        return Rendered(render(list(messages)))
    text = render(shielded)
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    length = pos = 0
    for match in re.finditer(f"\ue000{nonce}:\\d+\ue001", text):
        parts.append(text[pos : match.start()])
        length += match.start() - pos
        literal = found[match.group(0)]
        parts.append(literal)
        spans.append((length, length + len(literal)))
        length += len(literal)
        pos = match.end()
    parts.append(text[pos:])
    return Rendered("".join(parts), tuple(spans))
