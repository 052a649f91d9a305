"""A rollout instance's join protocol without Ray: real weight service, real engine, real store.

An instance becomes READY only after the bytes it pulled match the published SHA-256, the engine's
checksum of what it loaded matches too, and the version is the one asked for; otherwise it never
serves. While generating, it saves each request's new tokens to the durable store.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import grpc
import pytest

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.model.checkpoint import checksum, load_checkpoint, to_bf16_bytes
from rlsched.policy.lifecycle import InstanceState
from rlsched.policy.retry import RetryPolicy
from rlsched.rollout.instance import Instance, JoinFailed, NotReady
from rlsched.store.partial import PartialStore
from rlsched.transfer import weights_pb2 as pb
from rlsched.transfer.service import WeightService
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def blobs() -> dict[int, bytes]:
    model = load_checkpoint(None).model
    first = to_bf16_bytes(model)
    for p in model.parameters():  # a second, different version
        p.data.mul_(1.01)
    return {1: first, 2: to_bf16_bytes(model)}


def instance(tmp_path: Path | None = None) -> Instance:
    store = str(tmp_path / "partial.sqlite") if tmp_path else None
    return Instance("rollout-t", None, max_batch=8, use_cache=True, seed=0, store_path=store, flush_s=0.0)


def test_join_pulls_loads_and_confirms_before_ready(service: WeightService, blobs: dict[int, bytes]) -> None:
    inst = instance()
    assert inst.state is InstanceState.ALLOCATED
    report = inst.join(service.address, 1)
    assert inst.state is InstanceState.READY and int(inst.engine.version) == 1
    assert report.nbytes == len(blobs[1]) and report.attempts == 1 and report.streams == 1
    assert report.transfer[0] <= report.transfer[1] <= report.load[1] <= report.confirm[1]
    assert "transfer" in report.line() and "load" in report.line() and "confirm" in report.line()
    again = inst.join(service.address, 2)  # READY -> TRANSFERRING for the next version
    assert again.version == 2 and inst.state is InstanceState.READY


class WrongVersion(WeightService):
    """Answers a manifest request for version 1 with version 2's manifest."""

    def GetManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.Manifest:
        return super().GetManifest(
            pb.ManifestRequest(version=2 if request.version == 1 else request.version), context
        )


class WrongChecksum(WeightService):
    """Publishes a whole-file SHA-256 that is not the bytes' own."""

    def GetManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.Manifest:
        m = pb.Manifest()
        m.CopyFrom(super().GetManifest(request, context))
        m.sha256 = checksum(b"something else")
        return m


@pytest.mark.parametrize(
    ("service_class", "problem"),
    [
        (WrongVersion, "sent version 2 when 1 was asked for"),
        (WrongChecksum, "do not match the published SHA-256"),
    ],
)
def test_a_version_or_checksum_mismatch_never_becomes_ready(
    blobs: dict[int, bytes], service_class: type[WeightService], problem: str
) -> None:
    svc = service_class(chunk_bytes=64 << 10)
    try:
        for v, blob in blobs.items():
            svc.publish(v, blob)
        inst = instance()
        with pytest.raises(JoinFailed, match=problem):
            inst.join(svc.address, 1, retry=RetryPolicy(1))
        assert inst.state is InstanceState.RELEASED
        with pytest.raises(NotReady):
            list(inst.generate([GenerationRequest(RequestId("x"), (1, 2, 3))]))
    finally:
        svc.close()


def test_a_version_that_is_not_published_is_a_clear_join_failure(service: WeightService) -> None:
    inst = instance()
    with pytest.raises(JoinFailed, match=r"cannot take version 7.*not held.*it holds: 1, 2"):
        inst.join(service.address, 7)
    assert inst.state is InstanceState.RELEASED


def test_generation_saves_new_tokens_to_the_store_under_its_attempt(
    service: WeightService, tmp_path: Path
) -> None:
    inst = instance(tmp_path)
    inst.join(service.address, 1)
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=1)
    reqs = [GenerationRequest(RequestId(f"1-0-{k}"), (5, 6, 7, 8), params) for k in range(2)]
    seen: dict[str, int] = {}
    store = PartialStore(tmp_path / "partial.sqlite")
    for sample in inst.generate(reqs, attempt=3):
        saved = store.saved(sample.request_id)
        seen[sample.request_id] = len(saved)
        assert saved.tokens == sample.token_ids[: len(saved)]  # a prefix of what it produced
    assert all(n > 0 for n in seen.values()) and inst.store_failures == 0


def test_routes_refilled_by_slot_join_the_running_rows_each_saved_under_its_own_attempt(
    service: WeightService, tmp_path: Path
) -> None:
    """A second route sent while the first runs (`refill` slot) joins its rows: its short request
    finishes while the first route's long ones still decode (as a batch of its own it would wait for
    them), and each request's tokens are saved under its route's attempt."""
    inst = instance(tmp_path)
    inst.join(service.address, 1)
    store = PartialStore(tmp_path / "partial.sqlite")
    long = SamplingParams(temperature=1.0, max_tokens=400, seed=1)
    first = [GenerationRequest(RequestId(f"a-{k}"), (5, 6, 7, 8), long) for k in range(2)]
    brief = SamplingParams(temperature=1.0, max_tokens=3, seed=2)
    short = GenerationRequest(RequestId("b-0"), (9, 10), brief)
    got: list[str] = []
    runner = threading.Thread(
        target=lambda: got.extend(x.request_id for x in inst.generate(first, 3, "slot"))
    )
    runner.start()
    wait_for(lambda: len(store.saved("a-0")) > 0, "the first route to run", timeout_s=60, every_s=0.01)
    (sample,) = inst.generate([short], 4, "slot")
    assert sample.request_id == "b-0" and runner.is_alive() and got == []  # a-0, a-1 still decode
    assert len(store.saved("b-0")) > 0  # under attempt 4: a write under another attempt is refused
    runner.join(timeout=120)
    assert sorted(got) == ["a-0", "a-1"] and inst.store_failures == 0
    assert inst._attempts == {}  # nothing left claimed here


def test_an_instance_that_starts_after_its_version_was_dropped_takes_the_newest(
    blobs: dict[int, bytes],
) -> None:
    """A slow-starting engine (vLLM takes about a minute here) asks for the version that was latest
    when it was granted; by then the service may keep only newer ones."""
    svc = WeightService(chunk_bytes=64 << 10, keep=1)
    try:
        for v, blob in blobs.items():  # version 1 is dropped when 2 is published
            svc.publish(v, blob)
        inst = instance()
        report = inst.join(svc.address, 1)
        assert report.version == 2 and int(inst.engine.version) == 2 and inst.state is InstanceState.READY
    finally:
        svc.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_an_instance_whose_engine_cannot_start_fails_its_join_with_the_reason(service: WeightService) -> None:
    """On a node without vLLM (a cluster joined with --address: the driver cannot check its nodes)."""
    inst = Instance("rollout-v", None, max_batch=8, use_cache=True, seed=0, engine="vllm")
    assert inst.status() == ("allocated", -1, 0)
    with pytest.raises(
        JoinFailed, match=r"cannot start its vllm engine: engine 'vllm' needs vLLM.*setup-vllm"
    ):
        inst.join(service.address, 1)
    assert inst.state is InstanceState.RELEASED


def test_each_pull_lands_in_a_buffer_made_ahead_and_the_next_one_is_made_after(
    service: WeightService, blobs: dict[int, bytes]
) -> None:
    inst = instance()  # a staged torch engine keeps each version's bytes as its weights
    first = inst._spare
    assert first is not None and len(first.take() or b"") == len(blobs[1])  # the size, from shapes alone
    inst.join(service.address, 1)
    assert inst._buffer is first.take()  # the pull used it: no page mapped while the bytes arrived
    assert inst._spare is not None and inst._spare is not first  # and the next one is on its way
    inst.join(service.address, 2)
    assert int(inst.engine.version) == 2 and bytes(inst._buffer or b"") == blobs[2]
