"""The OpenAI-compatible HTTP endpoint (FastAPI): `/v1/chat/completions`, `/v1/completions`,
`/v1/models`, `/health`, `/metrics`.

Per request the server runs template -> tokenize -> schedule -> detokenize -> stream (SPEC section 7):
the messages go through the checkpoint's chat template, the ids to the backend (the engine's intake,
`priority` first), and each sampled token comes back to be decoded into deltas (`ChoiceText`).
Streaming is server-sent events: per choice a first chunk with `role: assistant` and empty content,
then content deltas (empty ones skipped), a chunk with `finish_reason`, then, with
`stream_options.include_usage`, a usage chunk with empty `choices`, then `data: [DONE]`; every chunk
carries the request's id. The non-streaming response joins the same deltas.

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a body that is
not JSON, a field unknown or not implemented, a wrong type, no messages, or a `max_tokens` past the
context; 401 without the API key; 404 for a model not served; 429 with `Retry-After` when the queue
or the client's concurrency limit is full; 504 past the request timeout. A client that disconnects
aborts its generation, which frees its row.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlsched.config import EndpointConfig
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
from rlsched.serve.episodes import EpisodeError, EpisodeStore, Turn, continue_prompt
from rlsched.serve.output import ChoiceText
from rlsched.serve.prompts import PromptError, chat_prompt, completion_prompt, forced_prefix, render_chat
from rlsched.serve.schema import ChatCompletionRequest, CompletionRequest, RewardRequest
from rlsched.serve.tools import OPEN as TOOL_TAG
from rlsched.serve.tools import ToolReply, parse_hermes

log = logging.getLogger(__name__)


@dataclass
class Served:
    """What one endpoint serves: a model by name, its tokenizer and template, and the backend."""

    backend: Backend
    tokenizer: Tokenizer
    template: PromptFormat
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))
    episodes: EpisodeStore = field(default_factory=EpisodeStore)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class _Metrics:
    def __init__(self, served: Served) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rlsched_endpoint_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "rlsched_endpoint_prompt_tokens", "prompt tokens after the template", registry=r
        )
        self.completion_tokens = Counter("rlsched_endpoint_completion_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("rlsched_endpoint_ttft_seconds", "time to the first token", registry=r)
        self.aborted = Counter(
            "rlsched_endpoint_aborted", "generations aborted by a client disconnect", registry=r
        )
        running = Gauge("rlsched_endpoint_running", "requests holding an engine row", registry=r)
        running.set_function(lambda: served.backend.running)
        waiting = Gauge("rlsched_endpoint_waiting", "requests waiting for an engine row", registry=r)
        waiting.set_function(lambda: served.backend.waiting)


# -- request validation -------------------------------------------------------------------------------


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts)


def _validation_error(err: RequestValidationError) -> ApiError:
    first = err.errors()[0]
    kind, where, msg = first.get("type", ""), _field(first.get("loc", ())), str(first.get("msg", ""))
    if kind == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    if kind == "extra_forbidden":
        return ApiError(
            400, f"unknown field '{where}': this server does not know it (see docs/endpoint.md)", param=where
        )
    if "NOT_IMPLEMENTED:" in msg:
        name = msg.split("NOT_IMPLEMENTED:", 1)[1].strip()
        return ApiError(400, f"'{name}' is not implemented by this server; leave it unset", param=name)
    if kind == "missing":
        if not where:
            return ApiError(400, "the request has no JSON body")
        return ApiError(400, f"missing required field '{where}'", param=where)
    return ApiError(400, f"{where or 'body'}: {msg.removeprefix('Value error, ')}", param=where or None)


# -- one request's generations --------------------------------------------------------------------------


@dataclass
class _Update:
    index: int
    delta: str
    events: list[TokenEvent]
    sample: Sample | None = None
    tools: ToolReply | None = None


@dataclass(frozen=True)
class _Capture:
    """A request in an episode: the episode of each choice, and how its prompt met the last turn."""

    episode_ids: list[str]
    group_id: str | None
    extends: bool
    diverged_at: int | None
    pin: int | None  # the weight version the episode began on: its later turns ask for it


class _Run:
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
        self.choices = [ChoiceText(served.tokenizer, stops, TOOL_TAG if tools else None) for _ in params]
        self.samples: list[Sample | None] = [None] * len(params)
        self.replies: list[ToolReply | None] = [None] * len(params)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.first_token_at: float | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.created = int(self.started_wall)
        self.capture: _Capture | None = None

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

    async def updates(self) -> AsyncIterator[_Update]:
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
            yield _Update(i, self.choices[i].push(ev, self.with_logprobs), ev)

    def _finished(self, sample: Sample) -> _Update:
        i = self.index[sample.request_id]
        self.samples[i] = sample
        text = self.forced + sample.text
        reply = parse_hermes(text) if self.tools else None
        self.replies[i] = reply
        delta = self.choices[i].finish(sample, (reply.content or "") if reply is not None else text)
        return _Update(i, delta, [], sample, reply)

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


def _tool_calls(reply: ToolReply, delta: bool = False) -> list[dict[str, Any]]:
    """The calls as a message's `tool_calls` (a stream's delta numbers them with `index`)."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.calls
    ]
    return [{"index": k, **call} for k, call in enumerate(calls)] if delta else calls


# -- the app --------------------------------------------------------------------------------------------


def build_app(served: Served, cfg: EndpointConfig) -> FastAPI:
    app = FastAPI(title="rlsched endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = _Metrics(served)
    clients: Tally[str] = Tally()
    app.state.served, app.state.metrics, app.state.clients = served, metrics, clients
    served.episodes.reward_timeout_s = cfg.reward_timeout_s

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(err.status)).inc()
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return await _api_error(request, _validation_error(err))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("%s failed", request.url.path)
        return await _api_error(request, ApiError(500, f"internal error: {err}", kind="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if err.status_code == 404 else None
        return await _api_error(request, ApiError(err.status_code, str(err.detail), code=code))

    def authorize(request: Request) -> str:
        """The caller's key (checked when one is configured), or its address."""
        header = request.headers.get("authorization", "")
        key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if cfg.api_key is not None and not secrets.compare_digest(key, cfg.api_key):
            raise ApiError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                kind="authentication_error",
                code="invalid_api_key",
            )
        return key or (request.client.host if request.client else "anonymous")

    def check_model(name: str) -> None:
        if name != served.model_name:
            raise ApiError(
                404,
                f"model '{name}' is not served here; this endpoint serves '{served.model_name}'",
                param="model",
                code="model_not_found",
            )

    def admit(client: str) -> None:
        """429 past the queue limit or the client's own limit."""
        if served.backend.backlog >= cfg.max_waiting:
            raise ApiError(
                429,
                f"{served.backend.backlog} requests are waiting for a row (the limit is {cfg.max_waiting}); "
                "retry later",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        if cfg.max_per_client and clients[client] >= cfg.max_per_client:
            raise ApiError(
                429,
                f"client '{client}' already has {clients[client]} requests running (the limit is "
                f"{cfg.max_per_client})",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            )

    def sampling(
        req: ChatCompletionRequest | CompletionRequest, prompt_len: int, default_budget: int | None
    ) -> list[SamplingParams]:
        context = served.backend.context_length
        room = context - prompt_len
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {prompt_len} tokens after the template; the model's context is {context}",
                param="messages",
                code="context_length_exceeded",
            )
        budget = req.budget if req.budget is not None else (default_budget or room)
        if budget > room:
            raise ApiError(
                400,
                f"max_tokens is {budget}, but the prompt has {prompt_len} tokens and the model's context "
                f"is {context}: at most {room} tokens can be generated",
                param="max_completion_tokens"
                if getattr(req, "max_completion_tokens", None)
                else "max_tokens",
                code="context_length_exceeded",
            )
        stop_ids = () if req.ignore_eos else served.template.stop_token_ids
        top_logprobs = (
            (req.top_logprobs if req.logprobs else 0)
            if isinstance(req, ChatCompletionRequest)
            else (req.logprobs or 0)
        )
        return [
            SamplingParams(
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(req.top_k, 0),
                min_p=req.min_p,
                repetition_penalty=req.repetition_penalty,
                max_tokens=budget,
                seed=None if req.seed is None else req.seed + i,
                stop=req.stops,
                stop_token_ids=tuple(stop_ids),
                top_logprobs=top_logprobs,
            )
            for i in range(req.n)
        ]

    async def run_to_end(run: _Run, request: Request) -> None:
        """Consume every update (the non-streaming path), aborting if the client goes away."""

        async def consume() -> None:
            async for _ in run.updates():
                pass

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                if run.cancel():
                    metrics.aborted.inc()
        if work.cancelled():
            raise ApiError(499, "the client disconnected")
        work.result()

    async def start(
        req: ChatCompletionRequest | CompletionRequest,
        request: Request,
        prompt: list[int],
        *,
        logprobs: bool,
        tools: bool,
        forced: str = "",
        capture: _Capture | None = None,
    ) -> tuple[_Run, str]:
        client = req.user or authorize(request)
        admit(client)
        default = None if isinstance(req, ChatCompletionRequest) else 16
        params = sampling(req, len(prompt), default)
        run = _Run(served, prompt, params, req.priority, logprobs, tools, cfg.timeout_s, forced)
        run.capture = capture
        run.submit()
        clients[client] += 1
        metrics.prompt_tokens.inc(len(prompt))
        return run, client

    def done(run: _Run, client: str, route: str, status: int = 200) -> None:
        clients[client] -= 1
        if clients[client] <= 0:
            del clients[client]
        if run.capture is not None:
            for episode_id, turn in zip(run.capture.episode_ids, run.turns(), strict=False):
                served.episodes.record(episode_id, run.capture.group_id, turn)
        metrics.completion_tokens.inc(sum(len(s.token_ids) for s in run.samples if s is not None))
        if run.first_token_at is not None:
            metrics.ttft.observe(run.first_token_at - run.started)
        metrics.requests.labels(route, str(status)).inc()

    def episode_prompt(
        body: ChatCompletionRequest, episode_id: str, group_id: str | None
    ) -> tuple[list[int], _Capture]:
        """A turn's prompt from its episode's recorded ids (`continue_prompt`)."""
        try:
            episode = served.episodes.open_turn(episode_id)
        except EpisodeError as err:
            raise ApiError(err.status, str(err), param="episode_id") from None
        if episode is not None and body.n > 1:
            raise ApiError(400, "a later turn continues one episode: send n=1", param="n")
        text, prefix = render_chat(served.template, served.tokenizer, body)
        prompt, extends, diverged = continue_prompt(episode, text, served.tokenizer, prefix)
        ids = [episode_id] if body.n == 1 else [f"{episode_id}-{i}" for i in range(body.n)]
        group = group_id or (episode.group_id if episode is not None else episode_id)
        pin = episode.turns[0].weight_version if episode is not None and episode.turns else None
        return prompt, _Capture(ids, group, extends, diverged, pin)

    def episode_or_404(episode_id: str) -> Any:
        try:
            return served.episodes.get(episode_id)
        except EpisodeError as err:
            raise ApiError(err.status, str(err), code="episode_not_found") from None

    # -- routes -----------------------------------------------------------------------------------------

    @app.get("/v1/episodes")
    async def list_episodes(request: Request, ready: bool = False) -> dict[str, Any]:
        authorize(request)
        store = served.episodes
        chosen = store.ready() if ready else store.all()
        summaries = [
            {k: v for k, v in e.as_json().items() if k != "turns"} | {"turns": len(e.turns)} for e in chosen
        ]
        return {"object": "list", "data": summaries, "dropped_no_reward": store.dropped_no_reward}

    @app.get("/v1/episodes/{episode_id}")
    async def get_episode(episode_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        return dict(episode_or_404(episode_id).as_json())

    @app.post("/v1/episodes/{episode_id}/reward")
    async def reward_episode(episode_id: str, body: RewardRequest, request: Request) -> dict[str, Any]:
        authorize(request)
        episode_or_404(episode_id)
        try:
            episode = served.episodes.reward(episode_id, body.reward)
        except EpisodeError as err:
            raise ApiError(err.status, str(err)) from None
        return {k: v for k, v in episode.as_json().items() if k != "turns"}

    @app.post("/v1/episodes/{episode_id}/end")
    async def end_episode(episode_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        episode_or_404(episode_id)
        episode = served.episodes.end(episode_id)
        return {k: v for k, v in episode.as_json().items() if k != "turns"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "running": served.backend.running, "waiting": served.backend.waiting}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        card = {
            "id": served.model_name,
            "object": "model",
            "created": served.created,
            "owned_by": "rlsched",
            "max_model_len": served.backend.context_length,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        authorize(request)
        check_model(body.model)
        episode_id = body.episode_id or request.headers.get("x-episode-id")
        try:
            if episode_id:
                prompt, capture = episode_prompt(
                    body, episode_id, body.group_id or request.headers.get("x-group-id")
                )
            else:
                prompt, capture = chat_prompt(served.template, served.tokenizer, body), None
        except PromptError as err:
            raise ApiError(400, str(err), param="messages") from None
        tools = bool(body.tools) and body.tool_choice != "none"
        forced = forced_prefix(body)
        run, client = await start(
            body, request, prompt, logprobs=body.logprobs, tools=tools, forced=forced, capture=capture
        )
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = _chat_chunks(run, include_usage, body.return_token_ids)
            return _sse(chunks, run, lambda: done(run, client, "/v1/chat/completions"), metrics)
        try:
            await run_to_end(run, request)
        finally:
            done(run, client, "/v1/chat/completions")
        return _chat_response(run, body.return_token_ids)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        authorize(request)
        check_model(body.model)
        prompt = completion_prompt(served.tokenizer, body)
        run, client = await start(body, request, prompt, logprobs=bool(body.logprobs), tools=False)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = _completion_chunks(run, include_usage)
            return _sse(chunks, run, lambda: done(run, client, "/v1/completions"), metrics)
        try:
            await run_to_end(run, request)
        finally:
            done(run, client, "/v1/completions")
        return _completion_response(run)

    return app


# -- response bodies ------------------------------------------------------------------------------------


def _logprobs_block(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": entries}


def _chat_response(run: _Run, token_ids: bool) -> dict[str, Any]:
    choices = []
    for i, text in enumerate(run.choices):
        reply = run.replies[i]
        message: dict[str, Any] = {"role": "assistant", "content": text.sent}
        if reply is not None:
            message["content"] = text.sent or None
            message["tool_calls"] = _tool_calls(reply)
        choice: dict[str, Any] = {
            "index": i,
            "message": message,
            "logprobs": _logprobs_block(text.logprobs) if run.with_logprobs else None,
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


def _completion_response(run: _Run) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": text.sent,
            "logprobs": _completion_logprobs(text.logprobs) if run.with_logprobs else None,
            "finish_reason": run.finish_reason(i),
        }
        for i, text in enumerate(run.choices)
    ]
    return {**run.head("text_completion"), "choices": choices, "usage": run.usage()}


def _completion_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": [],
    }


# -- streaming ------------------------------------------------------------------------------------------


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _chat_chunks(run: _Run, include_usage: bool, token_ids: bool) -> AsyncIterator[str]:
    base = run.head("chat.completion.chunk")

    def chunk(i: int, delta: dict[str, Any], **extra: Any) -> str:
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return _event({**base, "choices": [choice]})

    for i in range(len(run.reqs)):
        first = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        yield _event({**base, "choices": [first], **({"prompt_token_ids": run.prompt} if token_ids else {})})
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
                delta["tool_calls"] = _tool_calls(up.tools, delta=True)
            extra["finish_reason"] = run.finish_reason(i)
        elif up.delta:
            delta = {"content": up.delta}
        else:
            continue  # an empty delta (a character or a possible stop string still held back)
        if run.with_logprobs:
            extra["logprobs"] = _logprobs_block(pending_lp[i])
            pending_lp[i] = []
        if token_ids:
            extra["token_ids"] = pending_ids[i]
            pending_ids[i] = []
        yield chunk(i, delta, **extra)
    if include_usage:
        yield _event({**base, "choices": [], "usage": run.usage()})


async def _completion_chunks(run: _Run, include_usage: bool) -> AsyncIterator[str]:
    base = run.head("text_completion")
    async for up in run.updates():
        if up.sample is None and not up.delta:
            continue
        finish = run.finish_reason(up.index) if up.sample is not None else None
        yield _event(
            {
                **base,
                "choices": [{"index": up.index, "text": up.delta, "logprobs": None, "finish_reason": finish}],
            }
        )
    if include_usage:
        yield _event({**base, "choices": [], "usage": run.usage()})


def _sse(
    chunks: AsyncIterator[str], run: _Run, on_done: Callable[[], None], metrics: _Metrics
) -> StreamingResponse:
    """The chunks as server-sent events, then `data: [DONE]`. A client that goes away cancels the
    stream (Starlette watches for the disconnect), which aborts the generations; an error after the
    stream began (the timeout) is sent as an event with OpenAI's error body."""

    async def body() -> AsyncIterator[str]:
        completed = False
        try:
            async for text in chunks:
                yield text
            completed = True
        except ApiError as err:
            yield _event(
                {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}
            )
        finally:
            if not completed and run.cancel():
                metrics.aborted.inc()
            on_done()
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
