"""Tool calls from a real model through the `openai` client: SmolLM2-135M-Instruct, served with the
shipped tools template (configs/chat_templates/smollm2_tools.jinja), fine-tuned in the fixture for
four steps to answer one question with a `<tool_call>`. The call comes back parsed as `tool_calls`
(streamed and not), an agent's next turn with the tool's result renders, `tool_choice` none / named
behave, and a call cut short is text with `finish_reason: length`, never a 500. Slow: about 30 s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from openai import OpenAI

from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.serve.server import Running, served_from, start

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "configs" / "chat_templates" / "smollm2_tools.jinja"
MODEL = "smollm2-tools"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[Running]:
    ckpt = load_checkpoint(smollm2_dir, dtype=torch.float32)
    tok = ckpt.tokenizer
    tok.hf.chat_template = TEMPLATE.read_text()
    prompt = tok.encode(
        tok.hf.apply_chat_template(ASK, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    )
    ids = torch.tensor([prompt + tok.encode(CALL)])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # the loss is on the reply only
    model = ckpt.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for _ in range(4):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    running = start(served_from(ckpt, chat_template=TEMPLATE, model_name=MODEL), EndpointConfig(port=0))
    yield running
    running.stop()


def test_the_call_comes_back_as_tool_calls(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")


def test_streamed_the_call_arrives_with_the_finish_reason(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, stream=True)
    )
    assert all(
        not (c.choices[0].delta.content or "").strip() for c in chunks
    )  # no call text leaks as content
    last = chunks[-1].choices[0]
    assert last.finish_reason == "tool_calls"
    [call] = last.delta.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_the_agents_next_turn_with_the_tools_result_renders(client: OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_unset=False),  # as agents append it
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=30
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage is not None and second.usage.prompt_tokens > first.usage.prompt_tokens


def test_tool_choice_none_leaves_the_tools_out(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=30
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_named_tool_choice_opens_a_call_to_it(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is it raining in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=40,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_call_cut_short_is_text_not_an_error(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=6
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content is not None and choice.message.content.startswith("<tool_call>")


def test_tools_against_a_template_that_cannot_render_them_are_a_400(
    smollm2_dir: Path, client: OpenAI
) -> None:
    from openai import BadRequestError

    from rlsched.serve.server import local_served

    plain = start(
        local_served(smollm2_dir, model_name="plain", prefix_cache_tokens=0), EndpointConfig(port=0)
    )
    try:
        other = OpenAI(base_url=plain.base_url, api_key="unused", max_retries=0)
        with pytest.raises(BadRequestError, match="chat template does not describe tool calls"):
            other.chat.completions.create(model="plain", messages=ASK, tools=[WEATHER])
    finally:
        plain.stop()
