"""The OpenAI-compatible HTTP endpoint (FastAPI): `/v1/chat/completions`, `/v1/completions`,
`/v1/models`, `/health`, `/metrics`.

Per request the server runs template -> tokenize -> schedule -> detokenize -> stream (SPEC section 7):
the messages go through the checkpoint's chat template, the ids to the backend (the engine's intake,
`priority` first), and each sampled token comes back to be decoded into deltas (`ChoiceText`).
Streaming is server-sent events: per choice a first chunk with `role: assistant` and empty content,
then content deltas (empty ones skipped), a chunk with `finish_reason`, then, with
`stream_options.include_usage`, a usage chunk with empty `choices`, then `data: [DONE]`; every chunk
carries the request's id. The non-streaming response joins the same deltas.

Errors have OpenAI's shape (`rlsched.serve.errors`): 400 for a body that is not JSON, a field unknown
or not implemented, a wrong type, no messages, or a `max_tokens` past the context; 401 without the
API key; 404 for a model not served; 429 with `Retry-After` when the queue or the client's
concurrency limit is full; 504 past the request timeout. A client that disconnects
aborts its generation, which frees its row.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
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
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlsched.config import EndpointConfig
from rlsched.engine.protocol import (
    Constraint,
    SamplingParams,
)
from rlsched.serve.constraints import ConstraintError, chat_constraint
from rlsched.serve.episodes import EpisodeError, continue_prompt
from rlsched.serve.errors import ApiError, validation_error
from rlsched.serve.limits import BodyLimit
from rlsched.serve.prompts import PromptError, chat_prompt, completion_prompt, forced_prefix, render_chat
from rlsched.serve.responses import ResponsesRequest, response_body, response_events, to_chat
from rlsched.serve.run import (
    Capture,
    Run,
    Served,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    event,
)
from rlsched.serve.schema import ChatCompletionRequest, CompletionRequest, RewardRequest

log = logging.getLogger(__name__)


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


def build_app(served: Served, cfg: EndpointConfig) -> FastAPI:
    app = FastAPI(title="rlsched endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=int(cfg.max_body_mb * (1 << 20)))
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
        return await _api_error(request, validation_error(err))

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
        req: ChatCompletionRequest | CompletionRequest,
        prompt_len: int,
        default_budget: int | None,
        constraint: Constraint | None = None,
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
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                logit_bias=req.biases,
                constraint=constraint,
                max_tokens=budget,
                seed=None if req.seed is None else req.seed + i,
                stop=req.stops,
                stop_token_ids=tuple(stop_ids),
                top_logprobs=top_logprobs,
            )
            for i in range(req.n)
        ]

    async def run_to_end(run: Run, request: Request) -> None:
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
        capture: Capture | None = None,
        constraint: Constraint | None = None,
    ) -> tuple[Run, str]:
        client = req.user or authorize(request)
        admit(client)
        default = None if isinstance(req, ChatCompletionRequest) else 16
        params = sampling(req, len(prompt), default, constraint)
        run = Run(served, prompt, params, req.priority, logprobs, tools, cfg.timeout_s, forced)
        run.capture = capture
        run.submit()
        clients[client] += 1
        metrics.prompt_tokens.inc(len(prompt))
        return run, client

    def done(run: Run, client: str, route: str, status: int = 200) -> None:
        clients[client] -= 1
        if clients[client] <= 0:
            del clients[client]
        if run.capture is not None:
            for episode_id, turn in zip(run.capture.episode_ids, run.turns(), strict=False):
                served.episodes.record(episode_id, run.capture.group_id, turn, run.capture.reference)
        metrics.completion_tokens.inc(sum(len(s.token_ids) for s in run.samples if s is not None))
        if run.first_token_at is not None:
            metrics.ttft.observe(run.first_token_at - run.started)
        metrics.requests.labels(route, str(status)).inc()

    tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        """Templating and tokenizing, on a thread of their own, one request at a time (a tokenizer is
        not safe to share between threads), so that a long prompt never holds the event loop."""
        return await asyncio.get_running_loop().run_in_executor(tokenizing, functools.partial(fn, *args))

    async def episode_prompt(
        body: ChatCompletionRequest, episode_id: str, group_id: str | None
    ) -> tuple[list[int], Capture]:
        """A turn's prompt from its episode's recorded ids (`continue_prompt`)."""
        try:
            episode = served.episodes.open_turn(episode_id)
        except EpisodeError as err:
            raise ApiError(err.status, str(err), param="episode_id") from None
        if episode is not None and body.n > 1:
            raise ApiError(400, "a later turn continues one episode: send n=1", param="n")

        def tokenize() -> tuple[list[int], bool, int | None]:
            rendered, prefix = render_chat(
                served.template, served.tokenizer, body, cfg.special_tokens_in_content
            )
            return continue_prompt(episode, rendered, served.tokenizer, prefix)

        prompt, extends, diverged = await off_loop(tokenize)
        ids = [episode_id] if body.n == 1 else [f"{episode_id}-{i}" for i in range(body.n)]
        group = group_id or (episode.group_id if episode is not None else episode_id)
        pin = episode.turns[0].weight_version if episode is not None and episode.turns else None
        return prompt, Capture(ids, group, extends, diverged, pin, body.reference)

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
        summaries = [e.summary() for e in chosen]
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
        return episode.summary()

    @app.post("/v1/episodes/{episode_id}/end")
    async def end_episode(episode_id: str, request: Request) -> dict[str, Any]:
        authorize(request)
        episode_or_404(episode_id)
        episode = served.episodes.end(episode_id)
        return episode.summary()

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

    async def chat_run(body: ChatCompletionRequest, request: Request) -> tuple[Run, str]:
        """A chat request templated, constrained and submitted (both the chat and the responses
        routes run one)."""
        authorize(request)
        check_model(body.model)
        episode_id = body.episode_id or request.headers.get("x-episode-id")
        if body.reference is not None and not episode_id:
            raise ApiError(
                400, "'reference' belongs to an episode: send an episode_id too", param="reference"
            )
        if body.reference is not None and served.reference_refusal is not None:
            refusal = f"'reference' refused: {served.reference_refusal}"
            raise ApiError(403, refusal, kind="permission_error", param="reference")
        try:
            if episode_id:
                prompt, capture = await episode_prompt(
                    body, episode_id, body.group_id or request.headers.get("x-group-id")
                )
            else:
                prompt = await off_loop(
                    chat_prompt, served.template, served.tokenizer, body, cfg.special_tokens_in_content
                )
                capture = None
        except PromptError as err:
            raise ApiError(400, str(err), param="messages") from None
        tools = bool(body.tools) and body.tool_choice != "none"
        try:
            constraint = await off_loop(chat_constraint, body) if body.constrained else None
        except ConstraintError as err:
            param = "response_format" if body.response_format is not None else "tools"
            raise ApiError(400, str(err), param=param) from None
        return await start(
            body,
            request,
            prompt,
            logprobs=body.logprobs,
            tools=tools,
            forced=forced_prefix(body),
            capture=capture,
            constraint=constraint,
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        run, client = await chat_run(body, request)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = chat_chunks(run, include_usage, body.return_token_ids)
            return _sse(chunks, run, lambda: done(run, client, "/v1/chat/completions"), metrics)
        try:
            await run_to_end(run, request)
        finally:
            done(run, client, "/v1/chat/completions")
        return chat_response(run, body.return_token_ids)

    @app.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> Any:
        try:
            chat_body = to_chat(body)
        except ValidationError as err:
            raise validation_error(RequestValidationError(err.errors())) from None
        run, client = await chat_run(chat_body, request)
        if body.stream:
            events = response_events(run, body)
            finish = lambda: done(run, client, "/v1/responses")  # noqa: E731
            return _sse(events, run, finish, metrics, responses=True)
        try:
            await run_to_end(run, request)
        finally:
            done(run, client, "/v1/responses")
        return response_body(run, body)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        authorize(request)
        check_model(body.model)
        try:
            prompt = await off_loop(completion_prompt, served.tokenizer, body)
        except PromptError as err:
            raise ApiError(400, str(err), param="prompt") from None
        run, client = await start(body, request, prompt, logprobs=bool(body.logprobs), tools=False)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = completion_chunks(run, include_usage)
            return _sse(chunks, run, lambda: done(run, client, "/v1/completions"), metrics)
        try:
            await run_to_end(run, request)
        finally:
            done(run, client, "/v1/completions")
        return completion_response(run)

    return app


# -- response bodies ------------------------------------------------------------------------------------


def _sse(
    chunks: AsyncIterator[str],
    run: Run,
    on_done: Callable[[], None],
    metrics: _Metrics,
    responses: bool = False,
) -> StreamingResponse:
    """The chunks as server-sent events, then `data: [DONE]` (not on the Responses API, whose stream
    ends with its `response.completed` event). A client that goes away cancels the stream (Starlette
    watches for the disconnect), which aborts the generations; an error after the stream began (the
    timeout) is sent as an event with OpenAI's error body (the Responses API's `error` event)."""

    async def body() -> AsyncIterator[str]:
        completed = False
        try:
            async for text in chunks:
                yield text
            completed = True
        except ApiError as err:
            error = {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}
            yield event({"type": "error", **error} if responses else {"error": error})
        finally:
            if not completed and run.cancel():
                metrics.aborted.inc()
            on_done()
        if not responses:
            yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
