"""Constrained decoding through the endpoint and in the torch engine: a 2-layer Llama with random
weights and SmolLM2's tokenizer (`tests/agent_model.tiny`), served with the shipped tools template,
a model that never calls a tool by itself. Under `tool_choice: required` or a named function every
reply is a call that fits its tool's schema; under `response_format` every finished reply is JSON
that validates. The log-probs recorded are the model's distribution restricted to the grammar
(recomputed here from a full forward and xgrammar's own masks), a logit bias cannot push a token the
grammar forbids, and a constrained request resumes from saved tokens where it left off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch
from openai import OpenAI

from rlsched.config import EndpointConfig
from rlsched.engine.protocol import Constraint, GenerationRequest, RequestId, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import Checkpoint, load_checkpoint
from rlsched.serve.constraints import json_grammar
from rlsched.serve.server import Running, served_from, start
from tests.helpers import CHAT_TOOLS_TEMPLATE, WEATHER_SCHEMA

pytestmark = pytest.mark.slow

TEMPLATE = CHAT_TOOLS_TEMPLATE
MODEL = "random-tools"
WEATHER: Any = WEATHER_SCHEMA
ADD: Any = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris this week?"}]


@pytest.fixture(scope="module")
def random_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.agent_model import tiny

    tiny(smollm2_dir, made := tmp_path_factory.mktemp("constrained") / "tiny")
    return made


def _load(path: Path) -> Checkpoint:
    ck = load_checkpoint(path, dtype=torch.float32)
    ck.tokenizer.hf.chat_template = TEMPLATE.read_text()
    return ck


@pytest.fixture(scope="module")
def server(random_dir: Path) -> Iterator[Running]:
    served = served_from(_load(random_dir), chat_template=TEMPLATE, model_name=MODEL)
    running = start(served, EndpointConfig(port=0))
    yield running
    running.stop()


def _calls(reply: Any) -> list[tuple[str, Any]]:
    out = []
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        for call in choice.message.tool_calls:
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, SCHEMAS[call.function.name])
            out.append((call.function.name, args))
    return out


def test_the_model_never_calls_a_tool_by_itself(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, n=8, max_tokens=40, seed=1)
    assert all(c.message.tool_calls is None for c in reply.choices)


def test_forced_calls_fit_their_tools_schema_100_of_100(client: OpenAI) -> None:
    """25 replies each: `required` (parallel calls allowed, and not), and each tool named. A random
    model continues after a call as readily as it stops, so parallel calls get a budget that a run of
    them (about 35 tokens a call) does not reach."""
    replies = 0
    named_add = {"type": "function", "function": {"name": "add"}}
    named_weather = {"type": "function", "function": {"name": "get_weather"}}
    cases: list[tuple[Any, Any]] = [
        ("required", None),
        ("required", False),
        (named_add, None),
        (named_weather, False),
    ]
    for i, (choice, parallel) in enumerate(cases):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        budget = 2000 if parallel is None and choice == "required" else 300
        reply = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            n=25,
            max_tokens=budget,
            seed=i,
            **extra,
        )
        calls = _calls(reply)
        replies += len(reply.choices)
        if parallel is False or choice != "required":
            assert len(calls) == len(reply.choices)  # one call each
        else:
            assert len(calls) > len(reply.choices)  # some replies make several
        if isinstance(choice, dict):
            assert {name for name, _ in calls} == {choice["function"]["name"]}
    assert replies == 100


def test_a_json_schema_reply_validates_and_a_json_object_parses(client: OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format=fmt,
        n=10,
        max_tokens=200,
        seed=5,  # type: ignore[arg-type]
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), WEATHER)
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format={"type": "json_object"}, n=10, max_tokens=200, seed=6
    )
    finished = [c for c in reply.choices if c.finish_reason == "stop"]
    assert finished  # a random model's free-form object may run long; those that finish parse
    assert all(isinstance(json.loads(c.message.content), dict) for c in finished)


def test_a_schema_that_cannot_be_a_grammar_is_a_400_naming_response_format(server: Running) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    body = {
        "model": MODEL,
        "messages": ASK,
        "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}},
    }
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "response_format" and "'bad'" in error["message"]


# -- in the engine --------------------------------------------------------------------------------


def _masked_logprobs(
    ck: Checkpoint, constraint: Constraint, prompt: list[int], out: list[int]
) -> list[float]:
    """The reference: one forward over prompt + output, each position masked by xgrammar's own
    matcher advanced over the output so far, then normalised."""
    import xgrammar as xgr

    vocab = ck.model.get_input_embeddings().weight.shape[0]
    info = xgr.TokenizerInfo.from_huggingface(ck.tokenizer.hf, vocab_size=vocab)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(constraint.grammar))
    with torch.no_grad():
        logits = ck.model(torch.tensor([prompt + out[:-1]])).logits[0, len(prompt) - 1 :].float()
    mask = xgr.allocate_token_bitmask(1, vocab)
    lps = []
    for pos, tok in enumerate(out):
        matcher.fill_next_token_bitmask(mask)
        row = logits[pos : pos + 1].clone()
        xgr.apply_token_bitmask_inplace(row, mask)
        lps.append(float(row.log_softmax(-1)[0, tok]))
        matcher.accept_token(tok)
    return lps


def _one(engine: TorchRolloutEngine, prompt: list[int], params: SamplingParams, **kw: Any) -> Any:
    [sample] = engine.generate([GenerationRequest(RequestId("r"), tuple(prompt), params, **kw)])
    return sample


def test_recorded_logprobs_are_the_masked_distribution_and_a_bias_cannot_leave_the_grammar(
    random_dir: Path,
) -> None:
    ck = _load(random_dir)  # the reference's model; the engine runs its own copy
    engine = TorchRolloutEngine(_load(random_dir).model, ck.tokenizer, max_batch=4, seed=0)
    constraint = Constraint(str(json_grammar(WEATHER, "weather")), "weather")
    prompt = ck.tokenizer.encode("Weather as JSON:")
    letter = ck.tokenizer.encode("@")[0]  # nowhere in WEATHER's JSON
    stop = (ck.tokenizer.eos_token_id,)
    free = _one(engine, prompt, SamplingParams(temperature=0, max_tokens=3, logit_bias=((letter, 100.0),)))
    assert free.token_ids[0] == letter  # the bias decides where nothing masks it
    params = SamplingParams(
        temperature=1.0, seed=7, max_tokens=120, stop_token_ids=stop, constraint=constraint,
        logit_bias=((letter, 100.0),),
    )  # fmt: skip
    sample = _one(engine, prompt, params)
    assert letter not in sample.token_ids and sample.finish_reason.value == "stop"
    jsonschema.validate(json.loads(ck.tokenizer.decode(sample.token_ids[:-1])), WEATHER)
    want = _masked_logprobs(ck, constraint, prompt, list(sample.token_ids))
    assert sample.logprobs == pytest.approx(want, abs=1e-4)
    with torch.no_grad():
        raw = ck.model(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    assert sample.logprobs[0] > float(raw[sample.token_ids[0]]) + 0.1  # masked: more than the raw model's

    # resumed from its first 5 tokens (a reclaimed instance's saved output), it goes on the same way,
    # each resumed token's log-prob masked as it was when sampled
    greedy = SamplingParams(temperature=0, max_tokens=120, stop_token_ids=stop, constraint=constraint)
    whole = _one(engine, prompt, greedy)
    resumed = _one(engine, prompt, greedy, resume_ids=whole.token_ids[:5])
    assert resumed.token_ids == whole.token_ids
    assert resumed.logprobs == pytest.approx(whole.logprobs, abs=1e-4)


def test_constrained_rows_that_join_and_leave_a_running_batch_keep_their_grammar(random_dir: Path) -> None:
    """Three rows at a time, eight requests: constrained and free ones alternate, rows finish and
    newcomers take their places (the masks filled ahead, during the forward, follow their matchers,
    not the rows' positions); every constrained sample validates and reports its masked log-probs."""
    ck = _load(random_dir)
    engine = TorchRolloutEngine(_load(random_dir).model, ck.tokenizer, max_batch=3, seed=1)
    constraint = Constraint(str(json_grammar(WEATHER, "weather")), "weather")
    stop = (ck.tokenizer.eos_token_id,)
    reqs = [
        GenerationRequest(
            RequestId(f"r{i}"),
            tuple(ck.tokenizer.encode(f"Request {i}:")),
            SamplingParams(
                temperature=1.0, seed=i, max_tokens=80 if i % 2 == 0 else 3 + i, stop_token_ids=stop,
                constraint=constraint if i % 2 == 0 else None,
            ),
        )
        for i in range(8)
    ]  # fmt: skip
    samples = {s.request_id: s for s in engine.generate(reqs)}
    for req in reqs[::2]:
        s = samples[req.request_id]
        jsonschema.validate(json.loads(ck.tokenizer.decode(s.token_ids[:-1])), WEATHER)
        want = _masked_logprobs(ck, constraint, list(req.prompt_ids), list(s.token_ids))
        assert s.logprobs == pytest.approx(want, abs=1e-4)
