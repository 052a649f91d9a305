"""The OpenAI endpoint over a real Ray rollout fleet (`actors.endpoint`): two instances that joined a
published checkpoint over the weight link, an endpoint actor routing to them, the official client.

The tiny Qwen2 with a 4,096-token context. The weight updates here are real versions published on
the fleet's weight service and pulled by an instance (`join`), as the job's reloads are; which
instance a reload leaves behind is the routing policy's `hold_back`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import torch
from openai import OpenAI

from actors.endpoint_serve import FleetServer, serve_fleet
from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes
from rlsched.policy.routing import InstanceView, hold_back
from rlsched.rl.episodes import episode_batch
from tests.helpers import ONE_OF_EACH, JobEndpoint, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

MODEL = "tiny"
HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def checkpoint(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("fleet-endpoint") / "qwen2"
    shutil.copytree(tiny_dirs["qwen2"], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return ckpt


@pytest.fixture(scope="module")
def fleet(ray_session: None, checkpoint: Path) -> Iterator[FleetServer]:
    cfg = EndpointConfig(port=0, model_name=MODEL, timeout_s=120)
    server = serve_fleet(checkpoint, cfg, instances=2, max_batch=8, dtype="float32", max_staleness=1)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(fleet: FleetServer) -> OpenAI:
    return OpenAI(base_url=fleet.base_url, api_key="unused", max_retries=0, timeout=120)


def routed(fleet: FleetServer) -> tuple[dict[str, int], int]:
    return ray.get(fleet.endpoint.routed.remote())  # type: ignore[no-any-return]


def episode(fleet: FleetServer, episode_id: str) -> dict[str, Any]:
    response = httpx.get(f"{fleet.base_url}/episodes/{episode_id}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def turn(client: OpenAI, episode_id: str, messages: list[dict[str, str]]) -> Any:
    """One turn that leaves its episode open: it stops at max_tokens, not at an end of turn."""
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0,  # type: ignore[arg-type]
        extra_body={"episode_id": episode_id, "ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip


def publish(fleet: FleetServer, checkpoint: Path, version: int) -> None:
    """A new version on the fleet's weight service: the checkpoint's weights, moved."""
    model = load_checkpoint(checkpoint).model
    torch.manual_seed(version)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    fleet.service.publish(version, to_bf16_bytes(model))


def views(fleet: FleetServer) -> list[InstanceView]:
    rows = ray.get([h.status.remote() for h in fleet.instances.values()])
    named = zip(fleet.instances, rows, strict=True)
    return [InstanceView(name, state == "ready", version) for name, (state, version, _) in named]


def test_the_openai_client_streams_through_the_fleet(fleet: FleetServer, client: OpenAI) -> None:
    assert [r.version for r in fleet.reports] == [0, 0]  # both joined the published checkpoint
    ask = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "seed": 7, "temperature": 0.8}
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content and whole.usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1
    four = client.chat.completions.create(**{**ask, "n": 4})  # type: ignore[call-overload]
    assert len(four.choices) == 4
    counts, mixed = routed(fleet)
    assert sum(counts.values()) == 6 and set(counts) == set(fleet.instances) and mixed == 0  # n=4: both serve


def test_a_client_that_leaves_frees_its_row_on_the_instance(fleet: FleetServer, client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
    )
    for _, _chunk in zip(range(5), stream, strict=False):
        pass
    stream.close()
    wait_for(lambda: ray.get(fleet.endpoint.load.remote()) == (0, 0), "the endpoint to let go", 60)
    rows = wait_for(
        lambda: all(ray.get(h.streams.remote()) == (0, 0) for h in fleet.instances.values()),
        "every instance to free its rows", 60,
    )  # fmt: skip
    assert rows


def test_an_update_mid_episode_does_not_mix_versions(
    fleet: FleetServer, client: OpenAI, checkpoint: Path
) -> None:
    """Turn 1 at version 0; version 1 is published and the reload leaves the episode's instance at
    0 (`hold_back`, max_staleness 1); turn 2 runs there, and the captured ids are what it sampled.
    Then version 2: version 0 is no longer admissible, turn 3 runs at 2 and the episode is mixed,
    left out of the training batch and counted."""
    first = turn(client, "pinned", HELLO)
    record = episode(fleet, "pinned")
    assert record["versions"] == [0] and record["ended"] is None
    assert record["turns"][0]["token_ids"] == first.choices[0].token_ids  # type: ignore[attr-defined]

    counts_before, _ = routed(fleet)
    served_by = {n: c for n, c in counts_before.items()}
    publish(fleet, checkpoint, 1)
    held = hold_back(views(fleet), {0: served_by}, new_version=1, max_staleness=1)
    assert len(held) == 1
    (keep,) = held
    moving = [h for n, h in fleet.instances.items() if n not in held]
    assert [r.version for r in ray.get([h.join.remote(fleet.service.address, 1) for h in moving])] == [1]
    fleet.sync(1)

    history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content or ""}]
    second = turn(client, "pinned", [*history, {"role": "user", "content": "More."}])
    record = episode(fleet, "pinned")
    assert record["versions"] == [0] and record["mixed"] is False and record["stitched"] is True
    assert record["turns"][1]["token_ids"] == second.choices[0].token_ids  # type: ignore[attr-defined]
    counts, mixed = routed(fleet)
    assert counts[keep] == counts_before.get(keep, 0) + 1 and mixed == 0

    fresh = turn(client, "fresh", HELLO)  # a new episode may start at either admissible version
    assert fresh.choices[0].finish_reason == "length"

    publish(fleet, checkpoint, 2)
    assert [r.version for r in ray.get([h.join.remote(fleet.service.address, 2) for h in moving])] == [2]
    fleet.sync(2)  # version 0 is now two behind: not admissible
    history = [*history, {"role": "user", "content": "More."}]
    history.append({"role": "assistant", "content": second.choices[0].message.content or ""})
    turn(client, "pinned", [*history, {"role": "user", "content": "Again."}])
    record = episode(fleet, "pinned")
    assert record["versions"] == [0, 2] and record["mixed"] is True
    _, mixed = routed(fleet)
    assert mixed == 1

    assert httpx.post(f"{fleet.base_url}/episodes/pinned/end", timeout=30).status_code == 200
    assert httpx.post(f"{fleet.base_url}/episodes/pinned/reward", json={"reward": 1}, timeout=30).is_success
    taken = ray.get(fleet.endpoint.take_ready.remote())
    assert [e.id for e in taken] == ["pinned"] and ray.get(fleet.endpoint.take_ready.remote()) == []
    batch = episode_batch(taken)
    assert batch.mixed == ["pinned"] and batch.items == []  # dropped and counted
    assert len(episode_batch(taken, keep_mixed=True).items) == 1  # or trained, per the job's config


def test_a_job_serves_its_fleet_pins_episodes_and_trains_on_them(ray_session: None) -> None:
    """`rollout.endpoint.enabled`: the job starts the endpoint over its own fleet and prints where.
    Two episodes of one group rewarded by the client, and one with a reference that the job's
    verifier pool judges, join iteration 1's batch; an open episode begun at version 0
    keeps its instance there through the reload to 1 (max_staleness 1), and is mixed once version 2
    leaves 0 behind."""
    from actors.controller import JobController
    from rlsched.config import load_config

    cfg = load_config(
        None,
        [
            "grpo.prompts_per_step=4", "task.eval_size=64", "eval.curve_size=32", "rollout.max_staleness=1",
            "rollout.endpoint.enabled=true", "rollout.endpoint.port=0",
            "trainer.ranks=1", "verifier.workers=1",  # two instances: one is held back at version 0
        ],
    )  # fmt: skip
    lines: list[str] = []
    controller = JobController(cfg, log=lines.append)
    try:
        (line,) = [x for x in lines if x.startswith("endpoint: ")]
        base_url = line.split(" at ")[1].split()[0]
        job = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        model = job.models.list().data[0].id
        ask: dict[str, Any] = {"model": model, "messages": HELLO, "max_tokens": 4, "temperature": 1.0}
        for k, reward in enumerate((1.0, 0.0)):
            job.chat.completions.create(**ask, extra_body={"episode_id": f"g-{k}", "group_id": "g"})
            assert httpx.post(f"{base_url}/episodes/g-{k}/end", timeout=30).is_success
            assert httpx.post(
                f"{base_url}/episodes/g-{k}/reward", json={"reward": reward}, timeout=30
            ).is_success
        judged = {**ask, "extra_body": {"episode_id": "judged", "reference": "7", "ignore_eos": True}}
        job.chat.completions.create(**judged)  # ended by the client, rewarded by the job's verifier
        assert httpx.post(f"{base_url}/episodes/judged/end", timeout=30).is_success
        keep_open = {**ask, "extra_body": {"episode_id": "open", "ignore_eos": True}}
        first = job.chat.completions.create(**keep_open)
        assert first.choices[0].finish_reason == "length"

        record = controller.run_iteration(1)
        assert record.extra["endpoint"] == {
            "episodes": 3, "episodes_trained": 3, "episodes_mixed_dropped": 0, "episodes_not_stitched": 0,
            "episodes_stale_dropped": 0, "episodes_judged": 1, "episodes_unjudged": 0,
        }  # fmt: skip
        assert record.used == 4 * cfg.grpo.group_size + 3, lines
        assert any("stays at v0 for the endpoint's episodes" in x for x in lines), lines
        history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content or ""}]
        history.append({"role": "user", "content": "More."})
        job.chat.completions.create(**{**keep_open, "messages": history})
        opened = httpx.get(f"{base_url}/episodes/open", timeout=30).json()
        assert opened["versions"] == [0] and opened["mixed"] is False

        controller.run_iteration(2)  # version 0 is now two behind: nothing may hold it
        job.chat.completions.create(**{**keep_open, "messages": [*history, {"role": "user", "content": "?"}]})
        opened = httpx.get(f"{base_url}/episodes/open", timeout=30).json()
        assert opened["versions"][0] == 0 and opened["versions"][-1] == 2 and opened["mixed"] is True
    finally:
        controller.shutdown()


def test_an_async_job_trains_its_endpoints_episodes_within_the_pipelines_bound(ray_session: None) -> None:
    """`schedule.mode: async` (k = 1) with `rollout.endpoint.enabled`: the endpoint serves while the
    pipeline generates ahead. A group the client rewarded before step 1 joins step 1's batch. An episode
    sampled at v0 and rewarded only once the job has trained two steps is dropped as stale by the
    pipeline's bound (its oldest turn, v0, is past it), exactly as a sample of v0 would be, and counted."""
    from actors.controller import JobController
    from rlsched.config import load_config

    cfg = load_config(
        None,
        [
            "schedule.mode=async", "rollout.max_staleness=1", "grpo.prompts_per_step=4", "task.eval_size=64",
            "eval.curve_size=32", "rollout.endpoint.enabled=true", "rollout.endpoint.port=0", *ONE_OF_EACH,
        ],
    )  # fmt: skip
    lines: list[str] = []
    controller = JobController(cfg, log=lines.append)
    try:
        job = JobEndpoint(lines)
        for episode, group, reward in (("g-0", "g", 1.0), ("g-1", "g", 0.0), ("late", "l", None)):
            job.episode(episode, group, reward)
        first = controller.run_iteration(1).extra["endpoint"]
        assert (first["episodes"], first["episodes_trained"], first["episodes_stale_dropped"]) == (2, 2, 0)
        controller.run_iteration(2)
        assert job.get("late")["versions"] == [0]
        job.reward("late", 1.0)
        counts = [controller.run_iteration(step).extra["endpoint"] for step in (3, 4)]
        assert sum(c["episodes_stale_dropped"] for c in counts) == 1, counts
        assert sum(c["episodes_trained"] for c in counts) == 0
    finally:
        controller.shutdown()


def test_a_job_started_again_after_a_crash_takes_back_its_endpoints_episodes(
    ray_session: None, tmp_path: Path
) -> None:
    """The job's endpoint journals its episodes in the run's `episodes.sqlite`. After a crash (the
    endpoint killed with the job), the resumed job's endpoint takes back the open episode, which the
    agent continues by its id as if nothing had happened, and the rewarded episode iteration 1 had
    taken: no checkpoint held iteration 1, so it runs again and trains on it again."""
    from actors.controller import JobController
    from rlsched.config import load_config
    from rlsched.job.durability import Start

    cfg = load_config(
        None,
        ["grpo.prompts_per_step=4", "task.eval_size=64", "eval.curve_size=32",
         "rollout.endpoint.enabled=true", "rollout.endpoint.port=0", *ONE_OF_EACH],
    )  # fmt: skip

    def endpoint_of(lines: list[str]) -> tuple[str, OpenAI, str]:
        (line,) = [x for x in lines if x.startswith("endpoint: ") and " at http" in x]
        base_url = line.split(" at ")[1].split()[0]
        client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        return base_url, client, client.models.list().data[0].id

    lines: list[str] = []
    before = JobController(cfg, log=lines.append, out_dir=tmp_path)
    try:
        base_url, client, model = endpoint_of(lines)
        ask: dict[str, Any] = {"model": model, "messages": HELLO, "max_tokens": 4, "temperature": 1.0}
        client.chat.completions.create(**ask, extra_body={"episode_id": "done"})
        assert httpx.post(f"{base_url}/episodes/done/reward", json={"reward": 1.0}, timeout=30).is_success
        first = client.chat.completions.create(**ask, extra_body={"episode_id": "open", "ignore_eos": True})
        assert before.run_iteration(1).extra["endpoint"]["episodes_trained"] == 1  # "done"
    finally:
        assert before.endpoint is not None
        ray.kill(before.endpoint.handle)  # the crash: the endpoint goes without a word
        before.endpoint = None
        before.shutdown()

    lines = []
    after = JobController(cfg, log=lines.append, out_dir=tmp_path, start=Start())  # no checkpoint yet
    try:
        assert any("endpoint: 2 episode(s) of the earlier run taken back" in x for x in lines), lines
        base_url, client, model = endpoint_of(lines)
        history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content or ""}]
        history.append({"role": "user", "content": "More."})
        client.chat.completions.create(
            **{**ask, "model": model, "messages": history},
            extra_body={"episode_id": "open", "ignore_eos": True},
        )
        opened = httpx.get(f"{base_url}/episodes/open", timeout=30).json()
        assert len(opened["turns"]) == 2 and opened["stitched"] is True  # continued, token for token
        assert after.run_iteration(1).extra["endpoint"]["episodes_trained"] == 1  # "done", again
        assert ("episode/done", "episode") in after.consumed
    finally:
        after.shutdown()
