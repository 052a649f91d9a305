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

from rlsched.config import ContentTokens
from rlsched.errors import UserError
from rlsched.model.content import Rendered, render_shielded
from rlsched.model.template import ChatTemplate, Message, PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.serve.schema import ChatCompletionRequest, ChatMessage, CompletionRequest, NamedToolChoice
from rlsched.serve.tools import OPEN as TOOL_OPEN


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


def renders_tool_calls(template: PromptFormat, tokenizer: Tokenizer) -> bool:
    """Whether the template describes Hermes-style calls (`<tool_call>`), the one format parsed."""
    return isinstance(template, ChatTemplate) and TOOL_OPEN in (tokenizer.chat_template or "")


def forced_prefix(req: ChatCompletionRequest) -> str:
    """What the assistant's reply is made to start with: `tool_choice: required` opens a call, a
    named function opens a call to it (the model writes the rest; nothing else constrains it)."""
    choice = req.tool_choice
    if not req.tools or choice in (None, "none", "auto"):
        return ""
    if choice == "required":
        return TOOL_OPEN + "\n"
    assert isinstance(choice, NamedToolChoice)
    return TOOL_OPEN + '\n{"name": ' + json.dumps(choice.function.name) + ', "arguments": '


def render_chat(
    template: PromptFormat,
    tokenizer: Tokenizer,
    req: ChatCompletionRequest,
    content: ContentTokens = ContentTokens.TEXT,
) -> tuple[Rendered, list[int]]:
    """The templated prompt, ending with `forced_prefix`, and the ids that go before it (an MLC
    template's system prefix; none for a chat template). Under `ContentTokens.TEXT` a special token's
    string in a message is encoded as text (`rlsched.model.content`); under CONTROL, as the token."""
    if isinstance(template, ChatTemplate):
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if req.tool_choice == "none":
            tools = None
        elif tools and not renders_tool_calls(template, tokenizer):
            raise PromptError(
                "the request has tools, but this model's chat template does not describe tool calls; "
                "serve it with a template that does (rlsched serve --chat-template "
                "configs/chat_templates/smollm2_tools.jinja, for SmolLM2)"
            )

        def apply(messages: list[dict[str, Any]]) -> str:
            text = tokenizer.hf.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            return str(text)

        messages = [_hf_message(m) for m in req.messages]
        try:
            rendered = render_shielded(tokenizer, apply, messages, content is ContentTokens.TEXT)
        except Exception as err:  # noqa: BLE001 - a template's raise_exception() is bad input
            raise PromptError(f"the chat template refused the messages: {err}") from None
        return Rendered(rendered.text + forced_prefix(req), rendered.literal), []
    if req.tools and req.tool_choice != "none":
        raise PromptError(
            f"this model's conversation template ({template.name}) does not render tools; serve a "
            "checkpoint whose chat template does"
        )
    try:
        conversation = [
            Message(role="system" if m.role == "developer" else m.role, content=m.text) for m in req.messages
        ]
        turns = [m.model_dump() for m in conversation]
        rendered = render_shielded(
            tokenizer,
            lambda ms: template.render([Message(**m) for m in ms]),
            turns,
            content is ContentTokens.TEXT,
        )
        return rendered, list(template.system_prefix_token_ids)
    except (UserError, ValueError) as err:
        raise PromptError(str(err)) from None


def chat_prompt(
    template: PromptFormat,
    tokenizer: Tokenizer,
    req: ChatCompletionRequest,
    content: ContentTokens = ContentTokens.TEXT,
) -> list[int]:
    """The templated prompt's ids (`render_chat`, tokenized)."""
    rendered, prefix = render_chat(template, tokenizer, req, content)
    return [*prefix, *rendered.encode(tokenizer)]


def completion_prompt(tokenizer: Tokenizer, req: CompletionRequest) -> list[int]:
    return list(req.prompt) if isinstance(req.prompt, list) else tokenizer.encode(req.prompt)
