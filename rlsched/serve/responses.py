"""OpenAI's Responses API, its stateless subset: `POST /v1/responses` as newer agent scaffolds (the
OpenAI Agents SDK's default model) call it.

A request is turned into the chat request it means (`to_chat`): `instructions` a system message,
`input` a string or a list of items (messages, `function_call` items the model made, and
`function_call_output` items the agent sends back) the chat's messages, function tools and
`tool_choice` the chat's, `text.format` its `response_format`, and `max_output_tokens` its budget.
It then runs exactly as a chat completion does (templating, constrained decoding, tool-call parsing,
episode capture with `episode_id`), and the finished run is written as a response: a `message` item
with its `output_text`, then a `function_call` item per call (`response_body`), or streamed as the
documented events (`response_events`): `response.created`, `response.in_progress`; per output item
`response.output_item.added`, its content (`response.content_part.added`, `response.output_text.delta`
..., `response.output_text.done`, `response.content_part.done`; or
`response.function_call_arguments.delta` and `.done`), `response.output_item.done`; then
`response.completed` (or `response.incomplete` where `max_output_tokens` cut it). Each event carries
its `sequence_number`.

Stateless: nothing is stored, so `store: true`, `previous_response_id` and `conversation` are refused
with a 400 that says to send the whole conversation as `input` with `store: false`. Hosted tools
(web search, file search, code interpreter, ...) and reasoning are refused by name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from rlsched.serve.run import Run
from rlsched.serve.schema import (
    INDEX_MAX,
    ChatCompletionRequest,
    _Strict,
    lone_surrogate,
)


class ContentPart(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    """A message; the SDKs send the first user turn without a `type`."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    """A call the model made, sent back in the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    """A call's result, from the agent."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_type(item: Any) -> str:
    return str(item.get("type", "message")) if isinstance(item, dict) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or not self.name):
            raise ValueError("text.format of type 'json_schema' needs a name and a schema")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: None = None


STATELESS = (
    "this server keeps no responses (the Responses API's stateless subset): send the whole "
    "conversation as `input`, with `store: false`"
)


class ResponsesRequest(_Strict):
    """The body of `POST /v1/responses` (the fields of the stateless subset, and rlsched's
    extensions as on chat completions)."""

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        if (where := lone_surrogate(data)) is not None:
            raise ValueError(
                f"{where or 'a string'} holds a lone surrogate (not UTF-8 text); send valid Unicode"
            )
        return data

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stream: bool = False
    text: TextConfig | None = None
    include: list[Literal["message.output_text.logprobs"]] | None = None
    top_logprobs: int = Field(0, ge=0, le=20)
    truncation: Literal["disabled"] | None = None
    # stateless: refused unless at their no-op value (`_stateless`)
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    reasoning: Any = None
    background: bool | None = None
    # accepted and ignored, as on chat completions
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # rlsched's and vLLM's extensions
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)
    top_k: int = Field(0, ge=-1, le=INDEX_MAX)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)
    priority: int = 0
    episode_id: str | None = None
    group_id: str | None = None
    reference: str | None = None

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        for name in ("store", "previous_response_id", "conversation", "background"):
            if getattr(self, name):
                raise ValueError(f"{name} is refused: {STATELESS}")
        if self.reasoning:
            raise ValueError(
                "reasoning is refused: the served model has no separate reasoning channel; leave it unset"
            )
        return self


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages the instructions and input items mean: consecutive calls join one assistant
    message (after its text, if the model wrote any before them)."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return out


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request a responses request means (validated as one: a tool choice that
    names no tool is refused the same way)."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _messages(req),
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_completion_tokens": req.max_output_tokens,
        "stream": req.stream,
        "seed": req.seed,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "priority": req.priority,
        "episode_id": req.episode_id,
        "group_id": req.group_id,
        "reference": req.reference,
        "user": req.user,
        "logprobs": bool(req.include),
        "top_logprobs": req.top_logprobs if req.include else 0,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req),
    }
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, NamedFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


# -- the response ---------------------------------------------------------------------------------


class Written:
    """A run written as a response: the ids of its items (stable between the stream and the body)."""

    def __init__(self, run: Run, req: ResponsesRequest) -> None:
        self.run, self.req = run, req
        self.id = f"resp_{run.id}"
        self.message_id = f"msg_{run.id}"
        self.sequence = 0

    def _echo(self) -> dict[str, Any]:
        """The request's settings, as every response object repeats them."""
        req = self.req
        choice: Any = (
            req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction) else req.tool_choice
        )
        fmt = (
            req.text.format.model_dump(by_alias=True, exclude_none=True)
            if req.text and req.text.format
            else None
        )
        return {
            "instructions": req.instructions,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "tool_choice": choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens,
            "text": {"format": fmt or {"type": "text"}},
            "truncation": "disabled",
            "store": False,
            "metadata": req.metadata or {},
            "previous_response_id": None,
            "reasoning": None,
            "user": req.user,
        }

    def body(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        run = self.run
        usage = run.usage()
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": run.created,
            "model": run.served.model_name,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "output": output,
            **self._echo(),
        }
        if status != "in_progress":
            out["usage"] = {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"],
            }
        if run.capture is not None:
            out["episode_id"] = run.capture.episode_ids[0]
        return out

    def status(self) -> str:
        return "incomplete" if self.run.finish_reason(0) == "length" else "completed"

    def message(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": self.logprobs()}
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [part],
        }

    def logprobs(self) -> list[dict[str, Any]]:
        return list(self.run.choices[0].logprobs) if self.run.with_logprobs else []

    def calls(self, status: str = "completed") -> list[dict[str, Any]]:
        reply = self.run.replies[0]
        if reply is None:
            return []
        return [
            {
                "type": "function_call",
                "id": f"fc_{c.id.removeprefix('call_')}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "status": status,
            }
            for c in reply.calls
        ]

    def output(self) -> list[dict[str, Any]]:
        """The finished run's items: its text as a message (none where the reply is only calls), then
        its calls."""
        text = self.run.choices[0].sent
        calls = self.calls()
        items = [self.message(text, "completed")] if text or not calls else []
        return items + calls

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def response_body(run: Run, req: ResponsesRequest) -> dict[str, Any]:
    """The finished run as a response object."""
    written = Written(run, req)
    return written.body(written.status(), written.output())


async def response_events(run: Run, req: ResponsesRequest) -> AsyncIterator[str]:
    """The run as the Responses API's stream of events (see the module docstring for their order)."""
    w = Written(run, req)
    yield w.event("response.created", response=w.body("in_progress", []))
    yield w.event("response.in_progress", response=w.body("in_progress", []))
    opened = False
    msg = {"item_id": w.message_id, "output_index": 0, "content_index": 0}
    sent_lp = 0

    def open_message() -> list[str]:
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = {
            "type": "message",
            "id": w.message_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        return [
            w.event("response.output_item.added", output_index=0, item=item),
            w.event("response.content_part.added", **msg, part=empty),
        ]

    async for up in run.updates():
        if up.delta:
            if not opened:
                for text in open_message():
                    yield text
                opened = True
            lps = w.logprobs()
            yield w.event("response.output_text.delta", **msg, delta=up.delta, logprobs=lps[sent_lp:])
            sent_lp = len(lps)
        if up.sample is None:
            continue
        output = w.output()
        index = 0
        if output and output[0]["type"] == "message":
            if not opened:
                for text in open_message():
                    yield text
            part = output[0]["content"][0]
            yield w.event("response.output_text.done", **msg, text=part["text"], logprobs=part["logprobs"])
            yield w.event("response.content_part.done", **msg, part=part)
            yield w.event("response.output_item.done", output_index=0, item=output[0])
            index = 1
        for k, call in enumerate(w.calls()):
            at = index + k
            yield w.event(
                "response.output_item.added",
                output_index=at,
                item={**call, "arguments": "", "status": "in_progress"},
            )
            ids = {"item_id": call["id"], "output_index": at}
            yield w.event("response.function_call_arguments.delta", **ids, delta=call["arguments"])
            yield w.event(
                "response.function_call_arguments.done", **ids, arguments=call["arguments"], name=call["name"]
            )
            yield w.event("response.output_item.done", output_index=at, item=call)
        status = w.status()
        yield w.event(f"response.{status}", response=w.body(status, output))
