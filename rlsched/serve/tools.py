"""Tool calls in the model's output, Hermes style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
the format the Qwen and SmolLM2 families are trained on and their chat templates describe.

A reply whose every `<tool_call>` block parses becomes `tool_calls` (with the text before the first
block, if any, as content) and `finish_reason: tool_calls`. A block that is not JSON, lacks a name,
or is left unclosed leaves the whole reply as text: a malformed call is the model's mistake to be
trained away, never a server error.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class ToolReply:
    content: str | None  # text before the first call
    calls: tuple[ParsedCall, ...]


def malformed(text: str) -> str | None:
    """Why a reply that opens a `<tool_call>` does not parse (None: it parses, or opens none): what
    an in-job episode tells the model in an error observation."""
    start = text.find(OPEN)
    if start < 0:
        return None
    rest = text[start:]
    blocks = _BLOCK.findall(rest)
    if not blocks:
        return f"the {OPEN} block is not closed with {CLOSE}"
    if _BLOCK.sub("", rest).strip():
        return f"there is text between or after the {OPEN} blocks; write the calls last, nothing after them"
    for raw in blocks:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            return f"a call is not JSON ({err.msg} at character {err.pos})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return 'a call is not an object with a "name" string'
    return None


def parse_hermes(text: str) -> ToolReply | None:
    """The calls in `text`, or None where it holds none or any is malformed."""
    start = text.find(OPEN)
    if start < 0:
        return None
    rest = text[start:]
    blocks = _BLOCK.findall(rest)
    if not blocks or _BLOCK.sub("", rest).strip():
        return None  # an unclosed block, or text between or after the calls
    calls: list[ParsedCall] = []
    for raw in blocks:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            ParsedCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args, ensure_ascii=False))
        )
    content = text[:start]
    return ToolReply(content if content.strip() else None, tuple(calls))
