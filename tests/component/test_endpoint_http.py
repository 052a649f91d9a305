"""The endpoint's wire format, byte by byte, over raw HTTP (httpx), on the tiny Qwen2 (random weights):
the SSE framing of a stream, OpenAI-shaped 4xx errors for every kind of bad request, the API key,
the queue limit's 429, and a disconnected client's generation aborted with its row freed."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rlsched.config import EndpointConfig
from rlsched.serve.server import Running, local_served, start

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The tiny Qwen2 with a 4,096-token context (rotary positions go that far), so that a long
    generation outlasts what a test does while it runs."""
    ckpt = tmp_path_factory.mktemp("endpoint") / "qwen2"
    shutil.copytree(tiny_dirs["qwen2"], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    served = local_served(ckpt, model_name=MODEL, max_batch=8, dtype="float32")
    running = start(served, EndpointConfig(port=0, api_key="sekret", max_waiting=4, timeout_s=60))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: Running) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"http://{server.host}:{server.port}", headers={"Authorization": "Bearer sekret"}, timeout=60
    ) as client:
        yield client


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], **extra}


def error_of(resp: httpx.Response) -> dict[str, object]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return dict(body["error"])


def test_a_stream_is_framed_as_the_contract_says(http: httpx.Client) -> None:
    body = chat(stream=True, max_tokens=12, seed=5, ignore_eos=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = []
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event, event  # one data line per event
        chunks.append(json.loads(event.removeprefix("data: ")))
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["choices"][0]["delta"].get("content") for c in middle)  # empty deltas are skipped
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in [*middle, finish])
    whole = http.post("/v1/chat/completions", json=chat(max_tokens=12, seed=5, ignore_eos=True)).json()
    assert whole["choices"][0]["message"]["content"] == streamed


def test_without_include_usage_the_stream_ends_after_the_finish_reason(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", json=chat(stream=True, max_tokens=3)) as resp:
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "usage" not in last


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"model": "tiny", "messages": [', "not valid JSON"),
        (b"", "no JSON body"),
    ],
)
def test_a_body_that_is_not_json_is_a_400(http: httpx.Client, content: bytes, why: str) -> None:
    resp = http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert why in str(error_of(resp)["message"])


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (chat(frobnicate=1), "frobnicate", "unknown field"),
        (chat(logit_bias={"five": 1.0}), "logit_bias", "are token ids"),
        (chat(logit_bias={"5": 101}), "logit_bias", "[-100, 100]"),
        (chat(frequency_penalty=2.5), "frequency_penalty", "less than or equal to 2"),
        (chat(response_format={"type": "json_schema"}), "response_format", "needs json_schema"),
        (chat(response_format={"type": "yaml"}), "response_format.type", "Input should be"),
        (chat(temperature="hot"), "temperature", "valid number"),
        (chat(max_tokens=-3), "max_tokens", "greater than or equal to 1"),
        (chat(n="four"), "n", "valid integer"),
        ({"model": MODEL, "messages": []}, "messages", "at least 1"),
        ({"model": MODEL}, "messages", "missing"),
        (
            {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
            "messages.0.role",
            "Input should be",
        ),
        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages.0", "needs content"),
        (chat(max_tokens=10**6), "max_tokens", "at most 40"),
        (chat(tool_choice="required"), None, "no tools"),
        (chat(reference="42"), "reference", "send an episode_id too"),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(
    http: httpx.Client, body: dict[str, object], param: str | None, words: str
) -> None:
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    err = error_of(resp)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param
    assert words in str(err["message"])


def test_a_model_not_served_is_a_404_naming_the_one_that_is(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json={**chat(), "model": "gpt-9"})
    assert resp.status_code == 404
    err = error_of(resp)
    assert err["code"] == "model_not_found" and f"'{MODEL}'" in str(err["message"])


def test_no_or_a_wrong_key_is_a_401(server: Running) -> None:
    url = f"http://{server.host}:{server.port}/v1/chat/completions"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(url, json=chat(), headers=headers)
        assert resp.status_code == 401
        assert error_of(resp)["code"] == "invalid_api_key"
    assert httpx.get(f"http://{server.host}:{server.port}/health").status_code == 200  # health is open


def test_models_lists_the_served_model(http: httpx.Client) -> None:
    data = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == [MODEL] and data[0]["max_model_len"] > 0


def test_an_unknown_route_is_an_openai_shaped_404(http: httpx.Client) -> None:
    resp = http.get("/v1/nothing")
    assert resp.status_code == 404
    error_of(resp)


def test_past_the_queue_limit_new_requests_get_429_and_leaving_clients_free_everything(
    server: Running, http: httpx.Client
) -> None:
    """Eight streams take the eight rows, four more wait (max_waiting), the next is refused with
    Retry-After; then every client goes away: the running ones are aborted, the waiting ones
    withdrawn, and nothing is left running or waiting."""
    backend = server.served.backend
    long = chat(stream=True, max_tokens=3000, ignore_eos=True)
    with contextlib.ExitStack() as streams:
        for expect_running, expect_waiting in [(k, 0) for k in range(1, 9)] + [(8, k) for k in range(1, 5)]:
            resp = streams.enter_context(http.stream("POST", "/v1/chat/completions", json=long))
            assert resp.status_code == 200
            wait_for(lambda r=expect_running, w=expect_waiting: (backend.running, backend.waiting) == (r, w))
        refused = http.post("/v1/chat/completions", json=long)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert error_of(refused)["type"] == "rate_limit_error"
    wait_for(lambda: (backend.running, backend.waiting) == (0, 0))
    assert "rlsched_endpoint_aborted_total 12.0" in http.get("/metrics").text
    ok = http.post("/v1/chat/completions", json=chat(max_tokens=4))  # the engine serves on
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_client_past_its_concurrency_limit_gets_429_while_others_are_served(server: Running) -> None:
    """A second app over the same engine with `max_per_client` 2: a client (`user`) with two streams
    running is refused a third; another client is not."""
    other = start(server.served, EndpointConfig(port=0, api_key="sekret", max_per_client=2))
    try:
        base = f"http://{other.host}:{other.port}"
        with httpx.Client(base_url=base, headers={"Authorization": "Bearer sekret"}, timeout=60) as http2:
            long = chat(stream=True, max_tokens=3000, ignore_eos=True, user="alice")
            with contextlib.ExitStack() as streams:
                for _ in range(2):
                    streams.enter_context(http2.stream("POST", "/v1/chat/completions", json=long))
                refused = http2.post("/v1/chat/completions", json=chat(max_tokens=2, user="alice"))
                assert refused.status_code == 429 and "alice" in str(error_of(refused)["message"])
                assert (
                    http2.post("/v1/chat/completions", json=chat(max_tokens=2, user="bob")).status_code == 200
                )
            wait_for(lambda: server.served.backend.running == 0)
            assert (
                http2.post("/v1/chat/completions", json=chat(max_tokens=2, user="alice")).status_code == 200
            )
    finally:
        other.stop(close_backend=False)
