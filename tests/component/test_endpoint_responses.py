"""`POST /v1/responses`, the Responses API's stateless subset, through the official `openai` client:
on the random-weight Llama with SmolLM2's tokenizer and tools template (`tests/agent_model.tiny`).
The stream is parsed by the client's own event types, in the documented order with consecutive
sequence numbers; a forced call is a `function_call` item that fits its schema, and the agent's next
turn (the call and its output sent back as items) renders; `text.format` gives JSON that validates;
what needs stored state is refused by name; and an `episode_id` captures the turn as a chat
completion's would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch
from openai import OpenAI

from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.serve.server import Running, served_from, start
from tests.helpers import CHAT_TOOLS_TEMPLATE, WEATHER_SCHEMA

pytestmark = pytest.mark.slow

MODEL = "random-tools"
WEATHER: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}
ASK = "What is the weather in Paris this week?"


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from tests.agent_model import tiny

    tiny(smollm2_dir, made := tmp_path_factory.mktemp("responses") / "tiny")
    ck = load_checkpoint(made, dtype=torch.float32)
    running = start(
        served_from(ck, chat_template=CHAT_TOOLS_TEMPLATE, model_name=MODEL), EndpointConfig(port=0)
    )
    yield running
    running.stop()


def test_a_text_response_has_its_message_and_usage(client: OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=ASK, instructions="Be brief.", max_output_tokens=12)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and r.output_text
    assert r.usage is not None
    assert r.usage.output_tokens == 12 or r.status == "completed"
    assert r.usage.input_tokens > 10
    if r.status == "incomplete":
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"


def test_the_stream_is_the_documented_events_in_order(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=16) as stream:
        events = list(stream)
    final = events[-1].response  # type: ignore[union-attr]  # completed, or incomplete at the budget
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{final.status}",
    ]
    assert "".join(d.delta for d in deltas) == final.output_text


def test_a_forced_call_is_a_function_call_item_and_the_next_turn_renders(client: OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=200,
    )  # fmt: skip
    assert r.status == "completed"
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": ASK},
            call.model_dump(exclude_none=True),  # as the Agents SDK sends the model's items back
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"},
        ],
        tools=[WEATHER],
        max_output_tokens=8,
    )
    assert follow.usage is not None and r.usage is not None
    assert follow.usage.input_tokens > r.usage.input_tokens  # the call and its output are in the prompt


def test_a_streamed_call_arrives_as_its_arguments_events(client: OpenAI) -> None:
    named = {"type": "function", "name": "get_weather"}
    with client.responses.stream(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice=named,
        max_output_tokens=200,  # type: ignore[arg-type]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    assert call.type == "function_call"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


def test_text_format_json_schema_validates(client: OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "weather", "schema": WEATHER_SCHEMA, "strict": True}
    r = client.responses.create(model=MODEL, input=ASK, text={"format": fmt}, max_output_tokens=200)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER_SCHEMA)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"store": True}, "store is refused: this server keeps no responses"),
        ({"previous_response_id": "resp_1"}, "previous_response_id is refused"),
        ({"reasoning": {"effort": "high"}}, "no separate reasoning channel"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"frobnicate": 1}, "unknown field 'frobnicate'"),
    ],
)
def test_what_needs_state_or_is_unknown_is_a_400_naming_it(
    client: OpenAI, extra: dict[str, Any], words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=ASK, extra_body=extra)
    assert words in str(err.value)


def test_an_episode_id_captures_the_turn(client: OpenAI, server: Running) -> None:
    r = client.responses.create(
        model=MODEL, input=ASK, max_output_tokens=6, extra_body={"episode_id": "resp-ep"}
    )
    record = httpx.get(f"{server.base_url}/episodes/resp-ep").json()
    [turn] = record["turns"]
    assert r.usage is not None and len(turn["token_ids"]) == r.usage.output_tokens
    assert len(turn["logprobs"]) == len(turn["token_ids"])
