"""The weight service on loopback: real gRPC, real TCP, real bytes; faults injected on the wire."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

from rlsched.transfer.client import Plane, TransferFailed, VersionNotFound, WeightClient
from rlsched.transfer.manifest import LATEST, Manifest
from rlsched.transfer.service import Faults, WeightService

CHUNK = 256 << 10
ROOT = Path(__file__).resolve().parents[2]


def weights(seed: int, mib: int = 4) -> bytes:
    rng = np.random.default_rng(seed)
    n = mib * 2**20 // (256 * 256 * 2)
    return save({f"layers.{i}.weight": rng.standard_normal((256, 256)).astype(np.float16) for i in range(n)})


@pytest.fixture
def service() -> Iterator[WeightService]:
    svc = WeightService(chunk_bytes=CHUNK)
    yield svc
    svc.close()


@pytest.mark.parametrize("plane", list(Plane))
def test_a_pull_delivers_every_byte_verified(service: WeightService, plane: Plane) -> None:
    blob = weights(0)
    service.publish(1, blob)
    with WeightClient(service.address) as client:
        pulled = client.pull(1, receiver="r0", plane=plane)
    s = pulled.stats
    assert pulled.blob == blob and s.confirmed and (s.streams, s.broken, s.corrupt) == (1, 0, 0)
    assert s.received == len(blob) and s.version == 1


@pytest.mark.parametrize("plane", list(Plane))
def test_a_cut_stream_resumes_from_the_last_verified_chunk(service: WeightService, plane: Plane) -> None:
    blob = weights(1)
    service.publish(1, blob)
    cut = 5 * CHUNK + CHUNK // 3  # five whole chunks and part of the sixth
    service.faults = Faults(cut_after_bytes=cut)
    with WeightClient(service.address) as client:
        pulled = client.pull(1, plane=plane)
    s = pulled.stats
    assert pulled.blob == blob and s.confirmed and (s.streams, s.broken) == (2, 1)
    # the second stream started at chunk 5, not at zero: only the partial chunk came twice
    resent = 5 * CHUNK
    first = cut if plane is Plane.TCP else 5 * CHUNK  # gRPC sends whole chunks only
    assert s.received == first + len(blob) - resent


@pytest.mark.parametrize("plane", list(Plane))
def test_a_corrupt_chunk_is_refused_and_fetched_again(service: WeightService, plane: Plane) -> None:
    blob = weights(2)
    service.publish(1, blob)
    service.faults = Faults(corrupt_chunk=7)
    with WeightClient(service.address) as client:
        pulled = client.pull(1, plane=plane)
    s = pulled.stats
    assert pulled.blob == blob and s.confirmed and s.corrupt == 1 and s.streams == 2


class AlwaysCorrupt(Faults):
    """A link that damages chunk 3 every time it passes."""

    def damage(self, piece: memoryview, offset: int, m: Manifest) -> memoryview:
        self.corrupt_chunk = 3
        return super().damage(piece, offset, m)


def test_a_chunk_that_never_arrives_intact_fails_the_pull_by_name(service: WeightService) -> None:
    service.publish(1, weights(3))
    service.faults = AlwaysCorrupt()
    with WeightClient(service.address) as client, pytest.raises(TransferFailed, match="verified nothing new"):
        client.pull(1, max_fruitless=3)


def test_a_version_that_is_not_held_is_refused_with_the_ones_that_are(service: WeightService) -> None:
    for v in (1, 2, 3):
        service.publish(v, weights(v, mib=1))
    with WeightClient(service.address) as client:
        with pytest.raises(VersionNotFound, match=r"version 1 is not held.*it holds: 2, 3"):
            client.pull(1)
        with pytest.raises(VersionNotFound, match="version 9"):
            client.manifest(9)
        assert client.manifest(LATEST).version == 3
    with pytest.raises(ValueError, match="not newer"):
        service.publish(3, weights(4, mib=1))


def test_version_0_is_a_version_like_any_other(service: WeightService) -> None:
    """Versions count from 0 (the job's start), so 0 cannot also mean "the latest": a slow joiner
    asking for 0 after 1 is published gets 0 (until f0a6d46 it got 1 and failed its version check)."""
    service.publish(0, weights(0, mib=1))
    service.publish(1, weights(1, mib=1))
    with WeightClient(service.address) as client:
        assert client.manifest(0).version == 0
        assert client.pull(0).stats.version == 0
        assert client.manifest(LATEST).version == 1


def test_no_version_published_yet_is_a_clear_refusal(service: WeightService) -> None:
    with WeightClient(service.address) as client, pytest.raises(VersionNotFound, match="none yet"):
        client.manifest(LATEST)


def test_a_receiver_slower_than_configured_is_reported_and_still_served() -> None:
    svc = WeightService(egress_bps=1e9, chunk_bytes=CHUNK, slow_lag_s=0.1)
    try:
        blob = weights(5, mib=32)  # several times what loopback's socket buffers hold
        svc.publish(1, blob)
        got = {"at": 0}

        def reads_at_160_mbit(at: int) -> None:  # the receiver's own limit, far below its 1 Gbit/s claim
            time.sleep(8 * (at - got["at"]) / 160e6)
            got["at"] = at

        with WeightClient(svc.address) as client:
            pulled = client.pull(1, receiver="slow-1", ingress_bps=1e9, on_progress=reads_at_160_mbit)
        assert pulled.blob == blob and pulled.stats.confirmed
        (slow,) = svc.shaper.slow
        assert slow.receiver == "slow-1" and slow.measured_bps < 0.5e9
        assert "slow-1 takes" in str(slow) and "Set its ingress rate" in str(slow)
    finally:
        svc.close()


def test_shaped_pulls_share_the_egress_max_min_fairly() -> None:
    """Two receivers behind a 0.4 Gbit/s egress, one capped at 0.1: it finishes at S/0.1, the other
    takes 0.3 until then (the model says so too; the benchmark measures it at scale)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlsched.policy.bandwidth import Flow, finish_times

    svc = WeightService(egress_bps=0.4e9, chunk_bytes=CHUNK)
    try:
        blob = weights(6, mib=8)
        svc.publish(1, blob)
        caps = {"fast": 1e9, "slow": 0.1e9}
        start = time.monotonic()

        def pull(name: str) -> float:
            with WeightClient(svc.address) as client:
                client.pull(1, receiver=name, ingress_bps=caps[name])
            return time.monotonic() - start

        with ThreadPoolExecutor(2) as pool:
            done = dict(zip(caps, pool.map(pull, caps), strict=True))
        model = finish_times([Flow(n, len(blob), c) for n, c in caps.items()], 0.4e9)
        for name in caps:
            assert done[name] == pytest.approx(model[name], rel=0.25, abs=0.05), (done, model)
        assert done["fast"] < done["slow"]
    finally:
        svc.close()


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is a dev extra")
def test_the_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    proto = "rlsched/transfer/weights.proto"
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
           f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", proto]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)
    for name in ("weights_pb2.py", "weights_pb2.pyi", "weights_pb2_grpc.py"):
        fresh = (tmp_path / "rlsched/transfer" / name).read_text()
        assert fresh == (ROOT / "rlsched/transfer" / name).read_text(), f"run `make proto`: {name} is stale"


# -- relays ------------------------------------------------------------------------------------------


class Relayed:
    """Receiver A pulls from the origin, slowly, and relays its copy through its own service; B pulls
    with A as its relay, starting once A has a few chunks."""

    def __init__(self, origin: WeightService, relay_faults: Faults | None = None) -> None:
        self.origin = origin
        self.relay = WeightService(chunk_bytes=CHUNK, faults=relay_faults)
        self.a: Any = None
        self.started = threading.Event()

    def pull_a(self) -> None:
        def progress(at: int) -> None:
            if at >= 4 * CHUNK:
                self.started.set()

        with WeightClient(self.origin.address) as client:
            try:
                self.a = client.pull(1, receiver="a", ingress_bps=120e6, on_progress=progress,
                                     on_assembly=self.relay.relay)  # fmt: skip
            except TransferFailed as err:
                self.a = err

    def pull_b(self, plane: Plane = Plane.TCP, **kw: Any) -> Any:
        thread = threading.Thread(target=self.pull_a, daemon=True)
        thread.start()
        assert self.started.wait(30)
        with WeightClient(self.origin.address) as client:
            pulled = client.pull(1, receiver="b", plane=plane, relays=[self.relay.address], **kw)
        thread.join(60)
        self.relay.close()
        return pulled


@pytest.mark.parametrize("plane", list(Plane))
def test_a_receiver_relays_what_it_has_verified_while_the_rest_arrives(
    service: WeightService, plane: Plane
) -> None:
    blob = weights(7)
    service.publish(1, blob)
    run = Relayed(service)
    b = run.pull_b(plane)
    assert b.blob == blob and b.stats.confirmed and run.a.stats.confirmed
    assert b.stats.sources == (run.relay.address,) and b.stats.left == ()  # every byte from the relay
    assert b.stats.data_finished >= run.a.stats.data_finished - 0.05  # it kept pace behind A's copy


def test_a_relay_killed_mid_transfer_leaves_its_receiver_to_finish_from_the_origin(
    service: WeightService,
) -> None:
    blob = weights(8)
    service.publish(1, blob)
    run = Relayed(service)

    def kill_relay_halfway(at: int) -> None:
        if at >= len(blob) // 2:
            run.relay.close()

    b = run.pull_b(on_progress=kill_relay_halfway)
    assert b.blob == blob and b.stats.confirmed
    assert b.stats.sources == (run.relay.address, service.address)
    assert len(b.stats.left) == 1 and "ended its stream early" in b.stats.left[0]
    assert b.stats.received < 1.3 * len(blob)  # resumed from the last verified chunk, not from zero


def test_a_relay_that_sends_a_corrupt_chunk_is_detected_and_left(service: WeightService) -> None:
    blob = weights(9)
    service.publish(1, blob)
    run = Relayed(service, relay_faults=Faults(corrupt_chunk=6))
    b = run.pull_b()
    assert b.blob == blob and b.stats.confirmed and b.stats.corrupt == 1
    assert b.stats.sources == (run.relay.address, service.address)
    assert "sent a corrupt chunk at byte 1572864" in b.stats.left[0]  # chunk 6 came from the origin


def test_a_relay_that_lacks_the_version_is_passed_over(service: WeightService) -> None:
    blob = weights(10)
    service.publish(1, blob)
    empty = WeightService(chunk_bytes=CHUNK)  # advertised as a relay, holds nothing
    try:
        with WeightClient(service.address) as client:
            b = client.pull(1, relays=[empty.address])
    finally:
        empty.close()
    assert b.blob == blob and b.stats.confirmed and b.stats.sources == (service.address,)
    assert "weight version 1 is not held by this service (it holds: none yet)" in b.stats.left[0]


def test_a_relay_that_expects_the_version_is_waited_for(service: WeightService) -> None:
    blob = weights(11)
    service.publish(1, blob)
    relay = WeightService(chunk_bytes=CHUNK)
    relay.expect(1)  # its own pull has not begun when the receiver behind it asks
    got: dict[str, Any] = {}

    def pull_b() -> None:
        with WeightClient(service.address) as client:
            got["b"] = client.pull(1, relays=[relay.address])

    thread = threading.Thread(target=pull_b)
    thread.start()
    time.sleep(0.3)
    try:
        with WeightClient(service.address) as client:
            client.pull(1, on_assembly=relay.relay)
        thread.join(30)
    finally:
        relay.close()
    assert got["b"].blob == blob and got["b"].stats.sources == (relay.address,)
