"""One request's generations and the responses made of them: what the routes of `rlsched.serve.app`
run per request.

`Run` holds the `n` generations of one HTTP request on one event queue: it submits them to the
backend (with the episode's version pin), reads their tokens into deltas (`ChoiceText`), cancels
what is left when the client goes away, and records its turns for an episode. The response builders
turn a finished run into one `chat.completion` or `text_completion`, or its updates into the SSE
chunks of a stream (every chunk with the request's id; a first chunk per choice with
`role: assistant`, content deltas, a `finish_reason` chunk, the optional usage chunk).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    RequestId,
    RequestRejected,
    Sample,
    SamplingParams,
    TokenEvent,
)
from rlsched.engine.stream_server import EngineStopped, Event
from rlsched.model.template import PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.serve.backend import Backend
from rlsched.serve.episodes import EpisodeStore, Turn
from rlsched.serve.errors import ApiError
from rlsched.serve.output import ChoiceText
from rlsched.serve.tools import OPEN as TOOL_TAG
from rlsched.serve.tools import ToolReply, parse_hermes


@dataclass
class Served:
    """What one endpoint serves: a model by name, its tokenizer and template, and the backend."""

    backend: Backend
    tokenizer: Tokenizer
    template: PromptFormat
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))
    episodes: EpisodeStore = field(default_factory=EpisodeStore)
    # why a client's `reference` is refused (the job's verifier runs what a reference holds:
    # `verifiers.protocol.client_reference_refusal`); None: taken, as data
    reference_refusal: str | None = None


@dataclass
class Update:
    index: int
    delta: str
    events: list[TokenEvent]
    sample: Sample | None = None
    tools: ToolReply | None = None


@dataclass(frozen=True)
class Capture:
    """A request in an episode: the episode of each choice, and how its prompt met the last turn."""

    episode_ids: list[str]
    group_id: str | None
    extends: bool
    diverged_at: int | None
    pin: int | None  # the weight version the episode began on: its later turns ask for it
    reference: str | None = None  # for a job's verifier (`ChatCompletionRequest.reference`)


class Run:
    """The `n` generations of one HTTP request, sharing one event queue."""

    def __init__(
        self,
        served: Served,
        prompt: list[int],
        params: list[SamplingParams],
        priority: int,
        with_logprobs: bool,
        tools: bool,
        timeout_s: float,
        forced: str = "",
    ) -> None:
        """`forced`: text the prompt ends with that belongs to the reply (an opened tool call)."""
        self.id = uuid.uuid4().hex
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.served = served
        self.prompt = prompt
        self.reqs = [
            GenerationRequest(RequestId(f"{self.id}-{i}"), tuple(prompt), p) for i, p in enumerate(params)
        ]
        self.index = {r.request_id: i for i, r in enumerate(self.reqs)}
        self.priority = priority
        self.with_logprobs = with_logprobs
        self.tools = tools
        self.forced = forced
        stops = params[0].stop
        tag = TOOL_TAG if tools else None
        self.choices = [ChoiceText(served.tokenizer, stops, tag, opened=bool(forced)) for _ in params]
        self.samples: list[Sample | None] = [None] * len(params)
        self.replies: list[ToolReply | None] = [None] * len(params)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.first_token_at: float | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.created = int(self.started_wall)
        self.capture: Capture | None = None

    def submit(self) -> None:
        pin = self.capture.pin if self.capture is not None else None
        try:
            for req in self.reqs:
                self.served.backend.submit(req, self.priority, self.events, pin)
        except RequestRejected as err:
            self.cancel()
            raise ApiError(400, str(err)) from None
        except EngineStopped as err:
            self.cancel()
            raise ApiError(503, str(err), kind="server_error") from None

    def cancel(self) -> int:
        """Withdraw or abort every generation not yet finished; how many there were."""
        open_ = [r.request_id for r, s in zip(self.reqs, self.samples, strict=True) if s is None]
        for rid in open_:
            self.served.backend.cancel(rid)
        return len(open_)

    async def updates(self) -> AsyncIterator[Update]:
        left = len(self.reqs)
        while left:
            try:
                ev = await asyncio.wait_for(self.events.get(), self.deadline - time.monotonic())
            except TimeoutError:
                raise ApiError(
                    504, f"the request ran past its timeout of {self.timeout_s:g} s", kind="timeout_error"
                ) from None
            if isinstance(ev, BaseException):
                raise ApiError(500, f"the engine failed: {ev}", kind="server_error")
            if isinstance(ev, Sample):
                left -= 1
                yield self._finished(ev)
                continue
            if self.first_token_at is None:
                self.first_token_at = time.monotonic()
            i = self.index[ev[0].request_id]
            yield Update(i, self.choices[i].push(ev, self.with_logprobs), ev)

    def _finished(self, sample: Sample) -> Update:
        i = self.index[sample.request_id]
        self.samples[i] = sample
        text = self.forced + sample.text
        reply = parse_hermes(text) if self.tools else None
        self.replies[i] = reply
        delta = self.choices[i].finish(sample, (reply.content or "") if reply is not None else text)
        return Update(i, delta, [], sample, reply)

    def finish_reason(self, i: int) -> str:
        sample = self.samples[i]
        assert sample is not None
        if self.replies[i] is not None:
            return "tool_calls"
        return "length" if sample.finish_reason is FinishReason.LENGTH else "stop"

    def turns(self) -> list[Turn]:
        """Each choice as a turn of its episode (only once all finished, none aborted)."""
        assert self.capture is not None
        done = [s for s in self.samples if s is not None and s.finish_reason is not FinishReason.ABORT]
        if len(done) != len(self.samples):
            return []
        first = (
            None if self.first_token_at is None else self.started_wall + self.first_token_at - self.started
        )
        return [
            Turn(
                request_id=str(sample.request_id),
                prompt_ids=tuple(self.prompt),
                token_ids=sample.token_ids,
                logprobs=sample.logprobs,
                weight_version=int(sample.weight_version),
                submitted=self.started_wall,
                first_token=first,
                finished=time.time(),
                finish_reason=self.finish_reason(i),
                called_tool=self.replies[i] is not None,
                extends=self.capture.extends,
                diverged_at=self.capture.diverged_at,
                started_version=None if sample.started_version is None else int(sample.started_version),
            )
            for i, sample in enumerate(done)
        ]

    def head(self, kind: str) -> dict[str, Any]:
        """The fields every response body and chunk of this request starts with (one id)."""
        prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
        return {
            "id": f"{prefix}-{self.id}",
            "object": kind,
            "created": self.created,
            "model": self.served.model_name,
        }

    def usage(self) -> dict[str, Any]:
        completion = sum(len(s.token_ids) for s in self.samples if s is not None)
        cached = max((s.cached_tokens for s in self.samples if s is not None), default=0)
        return {
            "prompt_tokens": len(self.prompt),
            "completion_tokens": completion,
            "total_tokens": len(self.prompt) + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


def tool_calls(reply: ToolReply, delta: bool = False) -> list[dict[str, Any]]:
    """The calls as a message's `tool_calls` (a stream's delta numbers them with `index`)."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.calls
    ]
    return [{"index": k, **call} for k, call in enumerate(calls)] if delta else calls


# -- the app --------------------------------------------------------------------------------------------


def logprobs_block(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": entries}


def chat_response(run: Run, token_ids: bool) -> dict[str, Any]:
    choices = []
    for i, text in enumerate(run.choices):
        reply = run.replies[i]
        message: dict[str, Any] = {"role": "assistant", "content": text.sent}
        if reply is not None:
            message["content"] = text.sent or None
            message["tool_calls"] = tool_calls(reply)
        choice: dict[str, Any] = {
            "index": i,
            "message": message,
            "logprobs": logprobs_block(text.logprobs) if run.with_logprobs else None,
            "finish_reason": run.finish_reason(i),
        }
        if token_ids:
            choice["token_ids"] = text.token_ids
        if run.capture is not None:
            choice["episode_id"] = run.capture.episode_ids[i]
        choices.append(choice)
    body: dict[str, Any] = {**run.head("chat.completion"), "choices": choices, "usage": run.usage()}
    if token_ids:
        body["prompt_token_ids"] = run.prompt
    return body


def completion_response(run: Run) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": text.sent,
            "logprobs": completion_logprobs(text.logprobs) if run.with_logprobs else None,
            "finish_reason": run.finish_reason(i),
        }
        for i, text in enumerate(run.choices)
    ]
    return {**run.head("text_completion"), "choices": choices, "usage": run.usage()}


def completion_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": [],
    }


# -- streaming ------------------------------------------------------------------------------------------


def event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def chat_chunks(run: Run, include_usage: bool, token_ids: bool) -> AsyncIterator[str]:
    base = run.head("chat.completion.chunk")

    def chunk(i: int, delta: dict[str, Any], **extra: Any) -> str:
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return event({**base, "choices": [choice]})

    for i in range(len(run.reqs)):
        first = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        yield event({**base, "choices": [first], **({"prompt_token_ids": run.prompt} if token_ids else {})})
    pending_lp: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(run.reqs))}
    pending_ids: dict[int, list[int]] = {i: [] for i in range(len(run.reqs))}
    async for up in run.updates():
        i = up.index
        if run.with_logprobs:
            pending_lp[i].extend(run.choices[i].logprobs[len(run.choices[i].logprobs) - len(up.events) :])
        pending_ids[i].extend(ev.token_id for ev in up.events)
        extra: dict[str, Any] = {}
        if up.sample is not None:
            delta: dict[str, Any] = {}
            if up.delta:
                delta["content"] = up.delta
            if up.tools is not None:
                delta["tool_calls"] = tool_calls(up.tools, delta=True)
            extra["finish_reason"] = run.finish_reason(i)
        elif up.delta:
            delta = {"content": up.delta}
        else:
            continue  # an empty delta (a character or a possible stop string still held back)
        if run.with_logprobs:
            extra["logprobs"] = logprobs_block(pending_lp[i])
            pending_lp[i] = []
        if token_ids:
            extra["token_ids"] = pending_ids[i]
            pending_ids[i] = []
        yield chunk(i, delta, **extra)
    if include_usage:
        yield event({**base, "choices": [], "usage": run.usage()})


async def completion_chunks(run: Run, include_usage: bool) -> AsyncIterator[str]:
    base = run.head("text_completion")
    async for up in run.updates():
        if up.sample is None and not up.delta:
            continue
        finish = run.finish_reason(up.index) if up.sample is not None else None
        yield event(
            {
                **base,
                "choices": [{"index": up.index, "text": up.delta, "logprobs": None, "finish_reason": finish}],
            }
        )
    if include_usage:
        yield event({**base, "choices": [], "usage": run.usage()})
