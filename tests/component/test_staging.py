"""Loading while the bytes arrive: the torch engine stages each verified tensor and swaps the version
in at once; instances relay what they pull to their peers. Real weight services, real engines."""

from __future__ import annotations

import threading

import pytest
import torch

from rlsched.engine.protocol import WeightVersion
from rlsched.engine.staging import ModelStage, StagingError, stream_into, tensor_of
from rlsched.model.checkpoint import checksum, load_checkpoint, published_state, to_bf16_bytes
from rlsched.policy.lifecycle import InstanceState
from rlsched.rollout.instance import Instance
from rlsched.transfer.manifest import Assembly, build_manifest
from rlsched.transfer.service import WeightService


@pytest.fixture(scope="module")
def blobs() -> dict[int, bytes]:
    model = load_checkpoint(None).model
    first = to_bf16_bytes(model)
    for p in model.parameters():
        p.data.add_(0.01 * torch.randn_like(p))
    return {1: first, 2: to_bf16_bytes(model)}


def instance(name: str) -> Instance:
    return Instance(name, None, max_batch=8, use_cache=True, seed=0)


def weights_of(inst: Instance) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in published_state(inst.engine.model).items()}  # type: ignore[attr-defined]


def test_a_staged_join_holds_exactly_what_a_whole_load_holds(
    service: WeightService, blobs: dict[int, bytes]
) -> None:
    staged = instance("staged")
    report = staged.join(service.address, 2)
    assert report.staged and "after staging while it arrived" in report.line()
    assert staged.state is InstanceState.READY and int(staged.engine.version) == 2
    whole = instance("whole")
    assert whole.engine.load_weights(blobs[2], WeightVersion(2)) == checksum(blobs[2])
    a, b = weights_of(staged), weights_of(whole)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    back = staged.join(service.address, 1)  # a fresh buffer: the live weights are never written over
    assert back.staged and int(staged.engine.version) == 1
    whole.engine.load_weights(blobs[1], WeightVersion(1))
    a, b = weights_of(staged), weights_of(whole)
    assert all(torch.equal(a[k], b[k]) for k in a)
    model = staged.engine.model  # type: ignore[attr-defined]
    if model.config.tie_word_embeddings:  # the head still shares the embedding's new tensor
        assert (
            model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        )


def test_the_stage_swaps_nothing_until_every_tensor_is_in_and_refuses_strangers(
    blobs: dict[int, bytes],
) -> None:
    model = load_checkpoint(None).model
    before = {k: v.clone() for k, v in published_state(model).items()}
    swapped: list[bool] = []
    stage = ModelStage(model, threading.Lock(), lambda: swapped.append(True))
    m = build_manifest(2, blobs[2])
    first = m.tensors[0]
    stage.put(first.name, tensor_of(bytearray(blobs[2]), first))
    with pytest.raises(StagingError, match=r"lacks \d+ tensor"):
        stage.commit()
    now = published_state(model)
    assert not swapped and all(torch.equal(now[k], before[k]) for k in before)  # nothing moved
    with pytest.raises(StagingError, match="not one of the model's weights"):
        stage.put("model.layers.99.mlp.weight", torch.zeros(2))
    with pytest.raises(StagingError, match="shape"):
        stage.put(first.name, torch.zeros(3, 3))


def test_staging_follows_the_verified_prefix_and_stops_when_the_pull_is_abandoned(
    blobs: dict[int, bytes],
) -> None:
    m = build_manifest(2, blobs[2], chunk_bytes=64 << 10)
    assembly = Assembly(m)
    got: list[str] = []

    class Recorder:
        def put(self, name: str, tensor: torch.Tensor) -> None:
            got.append(name)

        def commit(self) -> None: ...

    out: dict[str, object] = {}
    thread = threading.Thread(target=lambda: out.update(sha=stream_into(Recorder(), assembly, wait_s=30)))
    thread.start()
    half = len(m.chunks) // 2
    for c in m.chunks[:half]:
        assembly.accept(c.offset, blobs[2][c.offset : c.offset + c.length])
    while assembly.wait_verified(m.chunks[half].offset, 0.1) < m.chunks[half].offset:
        pass
    ready = [t.name for t in m.tensors if t.end <= assembly.verified_bytes]
    deadline = threading.Event()
    while len(got) < len(ready) and not deadline.wait(0.01):
        pass
    assert got == ready  # every fully verified tensor, and not one more
    for c in m.chunks[half:]:
        assembly.accept(c.offset, blobs[2][c.offset : c.offset + c.length])
    thread.join(30)
    assert out["sha"] == m.sha256 and got == [t.name for t in m.tensors]

    abandoned = Assembly(m)
    errors: list[BaseException] = []

    def stage_it() -> None:
        try:
            stream_into(Recorder(), abandoned, wait_s=30)
        except StagingError as err:
            errors.append(err)

    t = threading.Thread(target=stage_it)
    t.start()
    abandoned.abandon()
    t.join(30)
    assert len(errors) == 1 and "abandoned" in str(errors[0])


def test_a_peer_pulls_through_a_relaying_instance_and_both_confirm(
    service: WeightService, blobs: dict[int, bytes]
) -> None:
    relay = instance("relay")
    relay_address = relay.start_relay()
    behind = instance("behind")
    reports = {}
    first = threading.Thread(target=lambda: reports.update(relay=relay.join(service.address, 2)))
    first.start()
    reports["behind"] = behind.join(service.address, 2, relays=[relay_address])
    first.join(60)
    assert reports["relay"].sources == (service.address,)
    assert reports["behind"].sources[0] == relay_address  # the peer delivered first
    assert reports["behind"].relayed and ", from relay" in reports["behind"].line({relay_address: "relay"})
    assert not reports["relay"].relayed
    assert int(behind.engine.version) == 2 and behind.state is InstanceState.READY
    assert relay.release() == "released"
