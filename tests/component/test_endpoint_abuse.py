"""The endpoint under hostile input (issue 41): what a client sends is data, never code or poison.

On the tiny Qwen2 (random weights), served as a job whose verifier runs references (`code`) would
serve it: a non-finite or out-of-range reward is refused with a 4xx and not recorded, and a client's
`reference` is refused before it can reach that verifier."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlsched.config import EndpointConfig
from rlsched.serve.server import Running, local_served, start
from verifiers.loading import load_verifier
from verifiers.protocol import client_reference_refusal

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    ckpt = tmp_path_factory.mktemp("abuse") / "qwen2"
    shutil.copytree(tiny_dirs["qwen2"], ckpt)
    served = local_served(ckpt, model_name=MODEL, max_batch=4, dtype="float32")
    served.reference_refusal = client_reference_refusal(load_verifier("code"))  # as a `code` job's is
    running = start(served, EndpointConfig(port=0, timeout_s=60))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=60) as client:
        yield client


def chat(episode_id: str, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "hello there"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 3, "episode_id": episode_id, **extra}


@pytest.mark.parametrize("reward", ["NaN", "Infinity", "-Infinity", "1e308", "-0.5", "1.5"])
def test_a_reward_that_is_not_a_finite_number_in_range_is_refused_and_not_recorded(
    http: httpx.Client, reward: str
) -> None:
    """Finding 3: `POST /v1/episodes/ID/reward` took NaN and 1e308 with 200, and one update on them
    made every weight NaN."""
    episode = f"poison-{reward}"
    assert http.post("/v1/chat/completions", json=chat(episode)).status_code == 200
    raw = '{"reward": ' + reward + "}"  # as a client's JSON encoder writes it (Python's allows NaN)
    resp = http.post(
        f"/v1/episodes/{episode}/reward", content=raw, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422, resp.text
    message = resp.json()["error"]["message"]
    assert "it was not recorded" in message and ("finite" in message or "reward range [0, 1]" in message)
    assert http.get(f"/v1/episodes/{episode}").json()["reward"] is None
    ok = http.post(f"/v1/episodes/{episode}/reward", json={"reward": 0.5})
    assert ok.status_code == 200 and ok.json()["reward"] == 0.5


def test_a_client_reference_never_reaches_a_verifier_that_runs_it(
    http: httpx.Client, server: Running
) -> None:
    """Finding 2: a turn's `reference` of tests, once its episode ended, ran on the host under the
    `code` verifier."""
    hostile = json.dumps({"tests": ["import os; os.system('touch /tmp/pwned')"]})
    resp = http.post("/v1/chat/completions", json=chat("ref-1", reference=hostile))
    assert resp.status_code == 403, resp.text
    error = resp.json()["error"]
    assert error["param"] == "reference" and error["type"] == "permission_error"
    assert "'code' runs what a reference holds" in error["message"]
    assert server.served.episodes.to_judge() == []  # nothing was recorded to hand to the verifier
    assert http.get("/v1/episodes/ref-1").status_code == 404  # the refused turn started no episode


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("seed", str(2**64)),
        ("seed", str(-(2**63) - 1)),
        ("top_k", str(2**40)),
        ("repetition_penalty", "Infinity"),
        ("temperature", "NaN"),
    ],
)
def test_sampling_parameters_out_of_range_are_a_400_and_the_engine_serves_on(
    http: httpx.Client, field: str, raw: str
) -> None:
    """Finding 4: `"seed": 2**64` raised inside the engine's thread, and every later request got 503."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    body = body[:-1] + f', "{field}": {raw}}}'
    resp = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field
    ok = http.post("/v1/chat/completions", json={**chat("after"), "seed": 2**63 - 1, "n": 2})
    assert ok.status_code == 200, ok.text


def test_a_lone_surrogate_is_a_400_naming_where(http: httpx.Client) -> None:
    raw = '{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a \\ud800 b"}]}'
    resp = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "messages.0.content holds a lone surrogate" in resp.json()["error"]["message"]


def test_a_body_over_the_cap_is_refused_unread_and_health_stays_quick(http: httpx.Client) -> None:
    """Finding 5: a 20 MB body held the event loop (and `/health`) for 41 s."""
    import time

    big = json.dumps(chat("big")).replace("hello there", "x" * (20 << 20))
    start = time.monotonic()
    resp = http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "limit of 8 MB (--max-body-mb)" in resp.json()["error"]["message"]
    assert time.monotonic() - start < 5.0

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        data = big.encode()
        for at in range(0, len(data), 1 << 20):
            yield data[at : at + (1 << 20)]

    chunked = http.post(
        "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413
    start = time.monotonic()
    assert http.get("/health").status_code == 200 and time.monotonic() - start < 0.5


def test_one_failing_request_fails_alone_and_the_engine_serves_on(tiny_dirs: dict[str, Path]) -> None:
    """Finding 4's other half: a request that fails in the engine fails alone; the requests beside
    it and after it are served (the fault is injected into one request's admission)."""
    import threading

    from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, SamplingParams
    from rlsched.engine.stream_server import StreamServer

    served = local_served(tiny_dirs["qwen2"], model_name=MODEL, max_batch=2, dtype="float32")
    engine = served.backend.engine  # type: ignore[attr-defined]
    server = StreamServer(engine)
    real = engine._new_row

    def poisoned(req: GenerationRequest) -> object:
        if req.request_id == "poison":
            raise RuntimeError("a fault in one request's admission")
        return real(req)

    engine._new_row = poisoned
    got: dict[str, object] = {}
    done = threading.Event()

    def deliver_to(rid: str) -> object:
        def deliver(event: object) -> None:
            if isinstance(event, Sample | BaseException):
                got[rid] = event
                if len(got) == 2:
                    done.set()

        return deliver

    params = SamplingParams(max_tokens=3, seed=1)
    server.submit(GenerationRequest(RequestId("poison"), (5, 6, 7), params), 0, deliver_to("poison"))  # type: ignore[arg-type]
    assert done.wait(0) is False
    server.submit(GenerationRequest(RequestId("fine"), (5, 6, 8), params), 0, deliver_to("fine"))  # type: ignore[arg-type]
    assert done.wait(60), got
    assert isinstance(got["poison"], RuntimeError) and "one request's admission" in str(got["poison"])
    assert isinstance(got["fine"], Sample) and len(got["fine"].token_ids) == 3  # admitted beside it
    after: list[object] = []
    finished = threading.Event()
    server.submit(
        GenerationRequest(RequestId("after"), (5, 6, 9), params), 0,
        lambda e: (after.append(e), finished.set()) if isinstance(e, Sample | BaseException) else None,  # type: ignore[arg-type,func-returns-value]
    )  # fmt: skip
    assert finished.wait(60) and isinstance(after[0], Sample)
    server.close()


def test_a_failed_serving_loop_fails_what_it_ran_and_a_fresh_loop_serves_the_rest(
    tiny_dirs: dict[str, Path],
) -> None:
    """Before, one failure marked the engine failed and every later request got 503 until a restart."""
    import threading

    from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, SamplingParams
    from rlsched.engine.stream_server import StreamServer

    served = local_served(tiny_dirs["qwen2"], model_name=MODEL, max_batch=2, dtype="float32")
    engine = served.backend.engine  # type: ignore[attr-defined]
    server = StreamServer(engine)
    real, calls = engine._decode, []

    def decode_once_broken(live: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a fault in a decoding step")
        return real(live)

    engine._decode = decode_once_broken
    outcomes: dict[str, object] = {}
    ended = {name: threading.Event() for name in ("first", "second")}

    def deliver_to(name: str) -> object:
        def deliver(event: object) -> None:
            if isinstance(event, Sample | BaseException):
                outcomes[name] = event
                ended[name].set()

        return deliver

    params = SamplingParams(max_tokens=3, seed=2)
    server.submit(GenerationRequest(RequestId("first"), (5, 6, 7), params), 0, deliver_to("first"))  # type: ignore[arg-type]
    assert ended["first"].wait(60) and isinstance(outcomes["first"], RuntimeError)
    server.submit(GenerationRequest(RequestId("second"), (5, 6, 7), params), 0, deliver_to("second"))  # type: ignore[arg-type]
    assert ended["second"].wait(60) and isinstance(outcomes["second"], Sample)
    assert server.failures == 1
    server.close()
