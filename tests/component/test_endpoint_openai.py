"""The endpoint against the official `openai` client, on SmolLM2-135M-Instruct (the real model):
streamed deltas join to the non-streamed message, usage counts the templated prompt, a repeated
system prompt is served from the prefix cache, `top_k=1` is greedy, `n=4` gives four choices, log-probs
come in OpenAI's shape, and the completions route works the same way. Slow: the model loads once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from rlsched.config import EndpointConfig
from rlsched.serve.server import Running, local_served, start
from tests.helpers import leave_stream_early

pytestmark = pytest.mark.slow

MODEL = "smollm2"
SYSTEM = "You are a terse assistant for a small shop. You answer in one short sentence and never use lists."
QUESTION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[Running]:
    running = start(local_served(smollm2_dir, model_name=MODEL, max_batch=16), EndpointConfig(port=0))
    yield running
    running.stop()


def test_streamed_deltas_join_to_the_non_streamed_message(client: OpenAI) -> None:
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 48, "seed": 11, "temperature": 0.9}
    # both requests below then find the prompt's blocks in the prefix cache and prefill the same
    # rows: a prefill of the whole prompt rounds otherwise than one of its uncached tail on some CPUs
    # (an Intel Xeon's BLAS: docs/internals/engines.md), and at temperature 0.9 the draws part there
    client.chat.completions.create(**{**kw, "max_tokens": 1})
    whole = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert {c.id for c in chunks} == {whole.id.replace("chatcmpl-", "chatcmpl-")} or len(
        {c.id for c in chunks}
    ) == 1
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and whole.usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same prompt, a second time


def test_usage_counts_the_prompt_after_the_chat_template(client: OpenAI, server: Running) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5)
    ids = server.served.tokenizer.hf.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(ids) > len(SYSTEM.split())  # system prompt and control tokens
    assert reply.usage.completion_tokens == 5 or reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_top_k_1_is_greedy(client: OpenAI) -> None:
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 24}
    greedy = client.chat.completions.create(**kw, temperature=0)
    top1 = client.chat.completions.create(**kw, temperature=1.0, seed=123, extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy.choices[0].message.content


def test_n_4_gives_four_choices_and_a_seed_makes_them_repeatable(client: OpenAI, server: Running) -> None:
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 16, "n": 4, "seed": 7, "temperature": 1.0}
    first = client.chat.completions.create(**kw)
    again = client.chat.completions.create(**kw)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1  # each choice samples on its own (seed + index)
    one = client.chat.completions.create(**{**kw, "n": 1})
    assert first.usage is not None and one.usage is not None
    assert first.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt is counted once
    ids = client.chat.completions.create(**kw, extra_body={"return_token_ids": True})
    token_ids = [c.model_extra["token_ids"] for c in ids.choices]
    assert ids.usage is not None and ids.usage.completion_tokens == sum(map(len, token_ids))
    assert len(ids.model_extra["prompt_token_ids"]) == ids.usage.prompt_tokens
    tok = server.served.tokenizer
    assert [tok.decode(t, skip_special_tokens=True) for t in token_ids] == texts


def test_log_probs_come_in_openai_shape(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert content is not None and len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy takes the likeliest
        assert bytes(entry.bytes) == entry.token.encode()


def test_the_completions_route(client: OpenAI) -> None:
    kw = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(**kw)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert whole.choices[0].text == streamed and whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens <= 8


def test_a_client_that_disconnects_mid_generation_frees_its_row(client: OpenAI, server: Running) -> None:
    assert leave_stream_early(client, server.served.backend, MODEL, QUESTION, 4000) == (0, 0)


def test_a_repeated_system_prompt_is_served_from_the_prefix_cache(client: OpenAI) -> None:
    kw = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    first = client.chat.completions.create(
        **kw, messages=[QUESTION[0], {"role": "user", "content": "Hello!"}]
    )
    second = client.chat.completions.create(
        **kw, messages=[QUESTION[0], {"role": "user", "content": "Goodbye!"}]
    )
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 16  # at least the system prompt's whole blocks
    assert cached < second.usage.prompt_tokens
