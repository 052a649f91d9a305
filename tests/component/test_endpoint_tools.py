"""Tool calls from a real model through the `openai` client: a tiny Llama with SmolLM2-135M-Instruct's
tokenizer, served with the shipped tools template (configs/chat_templates/smollm2_tools.jinja), that
learns in the fixture (`tiny` and `learn_by_heart` of tests/agent_model.py) to answer one question
with a `<tool_call>`, another in prose, and to finish the call a named `tool_choice` opens on the
second. The call comes back parsed as `tool_calls` (streamed and not), an agent's next turn with the tool's
result renders, `tool_choice` none / named behave, and a call cut short is text with
`finish_reason: length`, never a 500. The tokens, template and parser are SmolLM2's; only the weights
are small (SmolLM2 itself took about a minute more here)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
RAIN = [{"role": "user", "content": "Is it raining in Paris?"}]
OPENED = '<tool_call>\n{"name": "get_weather", "arguments": '  # how a named tool_choice starts the reply


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from rlsched.rl.batching import pack
    from tests.agent_model import learn_by_heart, tiny

    tiny(smollm2_dir, made := tmp_path_factory.mktemp("tool-endpoint") / "tiny")
    ckpt = load_checkpoint(made, dtype=torch.float32)
    tok = ckpt.tokenizer
    tok.hf.chat_template = TEMPLATE.read_text()

    def rendered(messages: list[dict[str, str]]) -> str:
        return str(
            tok.hf.apply_chat_template(messages, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
        )

    taught = [  # (prompt, reply): the reply learned by heart
        (rendered(ASK), CALL),
        (rendered(RAIN), "I cannot tell from here.<|im_end|>"),  # asked this, it calls nothing
        (rendered(RAIN) + OPENED, '{"city": "Paris"}}\n</tool_call><|im_end|>'),  # unless made to
    ]
    batch = pack(
        [tok.encode(p) for p, _ in taught], [tok.encode(r) for _, r in taught], tok.pad_token_id or 0
    )
    learn_by_heart(ckpt.model, batch.input_ids, batch.attention_mask, batch.loss_mask > 0, batch.targets)
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
    ask: dict[str, Any] = {
        "model": MODEL,
        "messages": RAIN,
        "tools": [WEATHER],
        "temperature": 0,
        "max_tokens": 40,
    }
    unforced = client.chat.completions.create(**ask)
    assert unforced.choices[0].finish_reason == "stop" and unforced.choices[0].message.tool_calls is None
    reply = client.chat.completions.create(
        **ask, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_named_tool_choice_streamed_sends_no_call_text_as_content(client: OpenAI) -> None:
    """The reply starts inside the call the server opened, so none of it is content: it was streamed
    as content deltas (and a warning logged at the end) until the opened call was held back too."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=RAIN, tools=[WEATHER], tool_choice=named, temperature=0, max_tokens=40,
            stream=True,
        )
    )  # fmt: skip
    assert all(not (c.choices[0].delta.content or "") for c in chunks if c.choices)
    last = chunks[-1].choices[0]
    assert last.finish_reason == "tool_calls"
    [call] = last.delta.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


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


# -- trajectory capture ------------------------------------------------------------------------------------


def agent_loop(
    client: OpenAI, episode_id: str, turns: int = 3, **extra: Any
) -> list[tuple[list[int], list[int]]]:
    """A small agent that uses only the `openai` client: it asks, runs each tool call it gets (the
    weather is always the same), and sends the result back, until a reply calls no tool. Returns what
    each reply said it sampled (its prompt and token ids)."""
    messages: list[Any] = list(ASK)
    said = []
    for _ in range(turns):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[WEATHER],
            temperature=0,
            max_tokens=40,
            extra_body={"episode_id": episode_id, "return_token_ids": True, **extra},
        )
        choice = reply.choices[0]
        said.append((reply.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]))
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "tool_calls":
            break
        for call in choice.message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"})
    return said


def episode(server: Running, episode_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{server.base_url}/episodes/{episode_id}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_an_agent_loop_is_captured_token_for_token_with_no_gap(client: OpenAI, server: Running) -> None:
    said = agent_loop(client, "loop-1")
    assert len(said) >= 2  # a tool call, then at least one more turn
    record = episode(server, "loop-1")
    turns = record["turns"]
    assert [(t["prompt_ids"], t["token_ids"]) for t in turns] == said  # exactly what the engine sampled
    for before, after in itertools.pairwise(turns):
        history = before["prompt_ids"] + before["token_ids"]
        assert after["prompt_ids"][: len(history)] == history  # each turn extends the last: no gap
        assert after["extends"]
    assert record["stitched"] and not record["mixed"]
    assert all(len(t["logprobs"]) == len(t["token_ids"]) for t in turns)
    assert turns[0]["called_tool"] and turns[0]["finish_reason"] == "tool_calls"


def test_a_client_that_edits_the_history_is_recorded_not_hidden(client: OpenAI, server: Running) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, extra_body={"episode_id": "edited"}
    )
    call = first.choices[0].message.tool_calls[0]
    forged = {
        "role": "assistant",
        "content": "I will check the weather in Rome.",  # not what the model said
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    }
    tool = {"role": "tool", "tool_call_id": call.id, "content": "25 C"}
    client.chat.completions.create(
        model=MODEL, messages=[*ASK, forged, tool], tools=[WEATHER], temperature=0, max_tokens=8,
        extra_body={"episode_id": "edited"},
    )  # fmt: skip
    record = episode(server, "edited")
    second = record["turns"][1]
    assert second["extends"] is False and second["diverged_at"] is not None
    assert second["diverged_at"] >= len(record["turns"][0]["prompt_ids"])  # the edit is in the reply
    assert record["stitched"] is False


def test_a_weight_update_mid_episode_is_marked_mixed(client: OpenAI, server: Running) -> None:
    """One engine cannot keep an episode on its version (the fleet pins it there; this engine has no
    peer), so an update between two turns must show: the episode says which versions sampled it."""
    from rlsched.engine.protocol import WeightVersion
    from rlsched.model.checkpoint import published_state, state_bytes

    engine = server.served.backend.engine  # type: ignore[attr-defined]
    client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, extra_body={"episode_id": "mixed"}
    )
    before = int(engine.version)
    engine.load_weights(state_bytes(published_state(engine.model)), WeightVersion(before + 1))
    agent_messages = [*ASK, {"role": "user", "content": "And tomorrow?"}]
    client.chat.completions.create(
        model=MODEL, messages=agent_messages, temperature=0, max_tokens=4, extra_body={"episode_id": "mixed"}
    )
    record = episode(server, "mixed")
    assert record["versions"] == [before, before + 1] and record["mixed"] is True


def test_rewarded_episodes_are_a_training_batch(client: OpenAI, server: Running) -> None:
    """Two episodes in one group, rewarded by the client, become two train items the GRPO update
    takes: the loss only on sampled tokens, the advantages opposite."""
    import copy

    from rlsched.config import GRPOConfig
    from rlsched.rl.episodes import episode_batch
    from rlsched.rl.update import grpo_update

    for k, reward in enumerate((1.0, 0.0)):
        agent_loop(client, f"grpo-{k}", group_id="grpo")
        base = server.base_url
        assert httpx.post(f"{base}/episodes/grpo-{k}/end").status_code == 200
        assert (
            httpx.post(f"{base}/episodes/grpo-{k}/reward", json={"reward": reward}).json()["reward"] == reward
        )
    assert httpx.post(f"{server.base_url}/episodes/grpo-0/reward", json={"reward": 2}).status_code == 409
    ready = [e for e in server.served.episodes.ready() if e.group_id == "grpo"]
    batch = episode_batch(ready)
    assert batch.episode_ids == ["grpo-0", "grpo-1"] and not batch.not_stitched
    adv = [i.advantage for i in batch.items]
    assert adv[0] > 0 > adv[1]
    for item, ep in zip(batch.items, ready, strict=True):
        sampled = sum(len(t.token_ids) for t in ep.turns)
        assert item.trained_tokens == sampled < len(item.token_ids)  # tool results are masked
    policy = copy.deepcopy(server.served.backend.engine.model)  # type: ignore[attr-defined]
    policy.set_attn_implementation("sdpa")  # the engine's copy attends through its own slot cache
    stats = grpo_update(policy, torch.optim.AdamW(policy.parameters(), lr=1e-6), batch.items, GRPOConfig())
    assert torch.isfinite(torch.tensor(stats.loss))


def test_episode_routes_refuse_what_they_cannot_do(server: Running) -> None:
    base = server.base_url
    assert httpx.get(f"{base}/episodes/nope").status_code == 404
    assert httpx.post(f"{base}/episodes/nope/reward", json={"reward": 1}).status_code == 404
    resp = httpx.post(f"{base}/episodes/loop-1/reward", json={"reward": "great"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "reward"
    listing = httpx.get(f"{base}/episodes").json()
    assert {"loop-1", "edited"} <= {e["id"] for e in listing["data"]}
