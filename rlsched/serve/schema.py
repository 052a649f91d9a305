"""The request bodies the endpoint accepts, as pydantic models: OpenAI's fields, rlsched's extensions,
and nothing else.

Every model forbids fields it does not know, so a typo or a field from a newer API is refused with
400 naming it rather than ignored. Fields the OpenAI API has but this server does not implement
(`NOT_IMPLEMENTED`) are refused the same way unless they carry their no-op value (an `echo` of
false is accepted; true is not). Fields that change nothing for a model served
here (`IGNORED`: `store`, `metadata`, `service_tier`) are accepted, type-checked and ignored, as vLLM
does: agent frameworks send them by default. Messages accept what the `openai` client sends
back when an agent appends a response's message to its history (`refusal`, `annotations`, ... as
null).

Extensions, as vLLM names them, travel in the body (`extra_body` in the `openai` client): `top_k`,
`min_p`, `repetition_penalty`, `priority` (lower runs sooner) and `return_token_ids`, plus
`episode_id`, `group_id` and `reference` for trajectory capture.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# OpenAI fields that are refused unless at their no-op value (None, or the value given here)
NOT_IMPLEMENTED: dict[str, object] = {
    "functions": None,
    "function_call": None,
    "audio": None,
    "modalities": None,
    "prediction": None,
    "reasoning_effort": None,
    "web_search_options": None,
    "suffix": None,
    "echo": None,
    "best_of": None,
}


# OpenAI fields accepted and ignored: nothing is stored for OpenAI's distillation or evals, the
# metadata is theirs, and a local model has one service tier
IGNORED = ("store", "metadata", "service_tier")

INDEX_MAX = (1 << 31) - 1  # counts that become tensor sizes or indices (`rlsched.engine.protocol`)


def lone_surrogate(data: Any, where: str = "") -> str | None:
    """Where in a JSON value a string holds a lone surrogate (None: nowhere), as `messages.0.content`."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(key, str) and lone_surrogate(key) is not None:
            return f"{where}.{key!r}" if where else "a key"
        if (found := lone_surrogate(value, f"{where}.{key}" if where else str(key))) is not None:
            return found
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = None  # a streamed call's number, which clients that join deltas may keep


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # what the openai client writes when an agent sends a response's message back: accepted as null
    refusal: None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None
    reasoning_content: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    """`text`, `json_object` (any JSON object) or `json_schema` (JSON that validates against it),
    decoded under a grammar (`rlsched.serve.constraints`)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format needs json_schema exactly when its type is 'json_schema'")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    """Fields shared by both routes."""

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        """Text that cannot be UTF-8 (a lone surrogate, which JSON's `\\ud800` makes) is refused here,
        by name, before a tokenizer meets it."""
        if (where := lone_surrogate(data)) is not None:
            raise ValueError(
                f"{where or 'a string'} holds a lone surrogate (not UTF-8 text); send valid Unicode"
            )
        return data

    model: str
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1, description="a 64-bit integer")
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # rlsched's and vLLM's extensions
    top_k: int = Field(0, ge=-1, le=INDEX_MAX, description="-1 or 0: off")
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)
    priority: int = 0
    return_token_ids: bool = False
    ignore_eos: bool = False
    # OpenAI's penalties on the output's tokens, and biases by token id (a string, as JSON keys are)
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    # OpenAI's fields that change nothing here (`IGNORED`)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit() or int(key) > INDEX_MAX:
                raise ValueError(f"logit_bias keys are token ids (as strings); {key!r} is not one")
            if not -100 <= value <= 100:
                raise ValueError(f"logit_bias for token {key} is {value}; it must be in [-100, 100]")
        return bias

    @property
    def biases(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @model_validator(mode="after")
    def _refuse_unimplemented(self) -> _Sampling:
        for name in sorted(self.model_fields_set & NOT_IMPLEMENTED.keys()):
            value = getattr(self, name)
            if value is not None and value != NOT_IMPLEMENTED[name]:
                raise ValueError(f"NOT_IMPLEMENTED:{name}")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # trajectory capture (rlsched)
    episode_id: str | None = None
    group_id: str | None = None
    reference: str | None = None  # what a job's verifier judges the episode's final answer against
    response_format: ResponseFormat | None = None
    # refused unless at their no-op value (see NOT_IMPLEMENTED)
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def constrained(self) -> bool:
        """Whether the reply is decoded under a grammar: a forced tool call, or a JSON response."""
        forced = bool(self.tools) and self.tool_choice not in (None, "none", "auto")
        return forced or (self.response_format is not None and self.response_format.type != "text")

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> ChatCompletionRequest:
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice names a tool or is 'required', but the request has no tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools:
            names = {t.function.name for t in self.tools}
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names {self.tool_choice.function.name!r}, which is not among the "
                    f"tools ({', '.join(sorted(names))})"
                )
        return self


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[int]) -> str | list[int]:
        return prompt

    @property
    def budget(self) -> int | None:
        return self.max_tokens


class RewardRequest(_Strict):
    reward: float
