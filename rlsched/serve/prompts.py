"""Requests to token ids: the chat template applied to OpenAI messages (and tools), or a completion
prompt encoded as it is.

A checkpoint's own Jinja template (`ChatTemplate`) gets the messages the way transformers' templates
expect them: `developer` as `system`, text parts joined, an assistant's tool calls with their
arguments as objects, and the request's `tools` as JSON schemas. An MLC `conv_template` renders
plain role/content turns (it has no tools). Usage counts these ids: the prompt after the template,
control tokens included.
"""

from __future__ import annotations

import json
from typing import Any

from rlsched.errors import UserError
from rlsched.model.template import ChatTemplate, Message, PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.serve.schema import ChatCompletionRequest, ChatMessage, CompletionRequest


class PromptError(ValueError):
    """Messages the template cannot render (a 400 naming why)."""


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # sent back as the model wrote it


def _hf_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def chat_prompt(template: PromptFormat, tokenizer: Tokenizer, req: ChatCompletionRequest) -> list[int]:
    if isinstance(template, ChatTemplate):
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if req.tool_choice == "none":
            tools = None
        try:
            text = tokenizer.hf.apply_chat_template(
                [_hf_message(m) for m in req.messages],
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as err:  # noqa: BLE001 - a template's raise_exception() is bad input
            raise PromptError(f"the chat template refused the messages: {err}") from None
        return tokenizer.encode(str(text))
    if req.tools and req.tool_choice != "none":
        raise PromptError(
            f"this model's conversation template ({template.name}) does not render tools; serve a "
            "checkpoint whose chat template does"
        )
    try:
        messages = [
            Message(role="system" if m.role == "developer" else m.role, content=m.text) for m in req.messages
        ]
        return template.encode(tokenizer, messages)
    except (UserError, ValueError) as err:
        raise PromptError(str(err)) from None


def completion_prompt(tokenizer: Tokenizer, req: CompletionRequest) -> list[int]:
    return list(req.prompt) if isinstance(req.prompt, list) else tokenizer.encode(req.prompt)
