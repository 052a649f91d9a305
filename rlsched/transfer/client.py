"""Pulling one weight version from the weight service into a verified, preallocated buffer.

`pull` asks for the manifest, then streams the bytes (over the TCP data plane by default, or as
gRPC messages) into an `Assembly` that checks each chunk's XXH3 hash as it completes. A stream that
breaks (closed early, reset, stalled past `stall_s`) is reopened from the end of the last verified
chunk; a chunk that fails its check ends the stream and is fetched again from its start. After
`max_fruitless` streams in a row that verify nothing new, the pull fails with `TransferFailed`.
The result says how many streams it took, how many bytes were refetched, and whether the whole
SHA-256 matched: an instance may load a version only if `confirmed`.

On the data plane, the socket reads straight into the buffer (4 MiB per call, MSG_WAITALL) and a
second thread verifies chunks behind it, so checking costs the reader little throughput.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from rlsched.transfer import weights_pb2 as pb
from rlsched.transfer import weights_pb2_grpc as pb_grpc
from rlsched.transfer.manifest import (
    LATEST,
    Accepted,
    Assembly,
    Buffer,
    ChunkInfo,
    Manifest,
    TensorInfo,
    blank,
)
from rlsched.transfer.plane import Plane
from rlsched.transfer.service import GRPC_OPTIONS

RECV_BYTES = 4 << 20


class VersionNotFound(LookupError):
    """The service does not hold the version asked for (its message lists the ones it holds)."""


class TransferFailed(RuntimeError):
    """Streams kept breaking or corrupting without progress."""


@dataclass(frozen=True)
class PullStats:
    version: int
    plane: Plane
    nbytes: int
    received: int  # bytes that arrived, refetched ones included
    streams: int
    broken: int  # streams that ended before the last byte
    corrupt: int  # chunks that failed their check and were fetched again
    started: float  # time.monotonic() on the receiver, when the pull began (manifest included)
    data_started: float  # when the first data stream was opened
    data_finished: float  # when the last chunk was verified
    finished: float  # after the whole checksum was confirmed
    confirmed: bool  # every chunk verified and the whole SHA-256 equal to the manifest's
    data_cpu_s: float  # this process's CPU time from the first stream to the last verified chunk
    sources: tuple[str, ...] = ()  # the services that delivered verified bytes, in order
    left: tuple[str, ...] = ()  # relays given up, each with why

    @property
    def seconds(self) -> float:
        """The data transfer alone: first stream opened to last chunk verified."""
        return self.data_finished - self.data_started

    @property
    def gbps(self) -> float:
        return 8.0 * self.nbytes / max(self.seconds, 1e-9) / 1e9


@dataclass(frozen=True)
class Pulled:
    assembly: Assembly
    stats: PullStats

    @property
    def blob(self) -> bytes:
        return bytes(self.assembly.buffer)


def manifest_from_pb(m: pb.Manifest) -> Manifest:
    chunks = tuple(
        ChunkInfo(o, min(m.chunk_bytes, m.nbytes - o), digest)
        for o, digest in zip(range(0, m.nbytes, m.chunk_bytes), m.chunk_xxh3, strict=True)
    )
    tensors = tuple(TensorInfo(t.name, t.dtype, tuple(t.shape), t.start, t.end) for t in m.tensors)
    return Manifest(m.version, m.nbytes, m.sha256, m.chunk_bytes, chunks, tensors)


class WeightClient:
    def __init__(self, address: str, connect_timeout_s: float = 10.0) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._stub = pb_grpc.WeightsStub(self._channel)
        self._timeout = connect_timeout_s

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> WeightClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def manifest(self, version: int = LATEST) -> Manifest:
        """The manifest of `version` (`LATEST`: the newest held); VersionNotFound if it is not held."""
        try:
            reply = self._stub.GetManifest(pb.ManifestRequest(version=version), timeout=self._timeout)
        except grpc.RpcError as err:
            raise _typed(err) from None
        return manifest_from_pb(reply)

    def pull(
        self,
        version: int = 0,
        receiver: str = "",
        ingress_bps: float = 0.0,
        plane: Plane = Plane.TCP,
        max_fruitless: int = 3,
        stall_s: float = 30.0,
        on_progress: Callable[[int], None] | None = None,
        buffer: Buffer | None = None,
        relays: Sequence[str] = (),
        on_assembly: Callable[[Assembly], None] | None = None,
        allocate: Callable[[int], Buffer] = blank,
    ) -> Pulled:
        """Every byte of `version`, verified; see the module docstring for faults. `buffer`: receive
        into this one if it has the version's size (reuse the previous version's). `relays`: peers to
        pull from first, in order, each until its stream ends; the rest comes from this service
        (the origin, whose manifest every chunk is checked against). `on_assembly` gets the copy
        before the first byte arrives (a receiver that relays starts serving it there). `allocate`
        makes the buffer where `buffer` does not fit."""
        started = time.monotonic()
        manifest = self.manifest(version)
        assembly = Assembly(manifest, buffer, allocate)
        if on_assembly is not None:
            on_assembly(assembly)
        request = pb.PullRequest(version=manifest.version, receiver=receiver, ingress_bps=ingress_bps)
        run = _Run(plane, stall_s, on_progress)
        data_started, cpu = time.monotonic(), time.process_time()
        try:
            for relay in relays:
                if assembly.complete:
                    break
                with WeightClient(relay, self._timeout) as peer:
                    run.fill(peer._stub, relay, assembly, request, patience=1)
            if not assembly.complete:
                run.fill(self._stub, self.address, assembly, request, patience=max_fruitless)
        except BaseException:
            assembly.abandon()
            raise
        data_finished, cpu = time.monotonic(), time.process_time() - cpu
        confirmed = assembly.confirm()
        stats = PullStats(
            manifest.version,
            plane,
            manifest.nbytes,
            run.received,
            run.streams,
            run.broken,
            run.corrupt,
            started,
            data_started,
            data_finished,
            time.monotonic(),
            confirmed,
            cpu,
            tuple(run.sources),
            tuple(run.left),
        )
        return Pulled(assembly, stats)


class _Run:
    """One pull's streams, from one source after another, and what they did."""

    def __init__(self, plane: Plane, stall_s: float, on_progress: Callable[[int], None] | None) -> None:
        self.stream = _tcp_stream if plane is Plane.TCP else _grpc_stream
        self.stall_s, self.on_progress = stall_s, on_progress
        self.streams = self.broken = self.corrupt = self.received = 0
        self.sources: list[str] = []  # the sources that delivered verified bytes, in order
        self.left: list[str] = []  # "relay: why" for each relay given up

    def fill(
        self,
        stub: pb_grpc.WeightsStub,
        source: str,
        assembly: Assembly,
        request: pb.PullRequest,
        patience: int,
    ) -> None:
        """Stream from `source` until the copy is complete or `patience` streams in a row verified
        nothing new; a relay (patience 1) is left at its first stream that ends short, and the
        origin's failure is a `TransferFailed`."""
        fruitless = 0
        while not assembly.complete:
            if fruitless >= patience:
                why = (
                    f"{fruitless} streams in a row verified nothing new (at byte {assembly.resume_offset} of "
                    f"{assembly.manifest.nbytes}; {self.broken} broken, {self.corrupt} corrupt chunks)"
                )
                if patience == 1:
                    self.left.append(f"{source}: {why}")
                    return
                raise TransferFailed(
                    f"version {assembly.manifest.version} from {source}: {why}; is the sender alive?"
                )
            before = assembly.verified
            request.offset = assembly.resume_offset
            try:
                end = self.stream(stub, assembly, request, self.stall_s, self.on_progress)
            except grpc.RpcError as err:
                typed = _typed(err)
                if isinstance(typed, VersionNotFound):
                    if patience > 1:
                        raise typed from None
                    self.left.append(f"{source}: {typed}")  # a relay that lacks the version
                    return
                end = _End(0, broken=True)
            self.streams += 1
            self.received += end.received
            self.broken += end.broken
            self.corrupt += end.corrupt
            if assembly.verified > before and (not self.sources or self.sources[-1] != source):
                self.sources.append(source)
            if patience == 1 and not assembly.complete:  # a relay that broke or sent damage: leave it
                what = "sent a corrupt chunk" if end.corrupt else "ended its stream early"
                self.left.append(f"{source}: {what} at byte {assembly.resume_offset}")
                return
            fruitless = fruitless + 1 if assembly.verified == before else 0


@dataclass(frozen=True)
class _End:
    received: int
    broken: bool = False
    corrupt: bool = False


def _typed(err: grpc.RpcError) -> Exception:
    code = err.code() if isinstance(err, grpc.Call) else None
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    if code is grpc.StatusCode.NOT_FOUND:
        return VersionNotFound(details)
    return TransferFailed(f"weight service: {code}: {details}")


def _grpc_stream(
    stub: pb_grpc.WeightsStub,
    assembly: Assembly,
    request: pb.PullRequest,
    stall_s: float,
    on_progress: Callable[[int], None] | None,
) -> _End:
    call = stub.Pull(request)
    received = 0
    try:
        for chunk in call:
            received += len(chunk.data)
            outcome = assembly.accept(chunk.offset, chunk.data)
            if outcome is not Accepted.OK:
                call.cancel()
                return _End(
                    received, corrupt=outcome is Accepted.CORRUPT, broken=outcome is not Accepted.CORRUPT
                )
            if on_progress is not None:
                on_progress(assembly.resume_offset)
    except grpc.RpcError as err:
        if isinstance(err, grpc.Call) and err.code() is grpc.StatusCode.NOT_FOUND:
            raise
        return _End(received, broken=True)
    return _End(received, broken=not assembly.complete)


def _tcp_stream(
    stub: pb_grpc.WeightsStub,
    assembly: Assembly,
    request: pb.PullRequest,
    stall_s: float,
    on_progress: Callable[[int], None] | None,
) -> _End:
    ticket = stub.OpenData(request)
    verifier = _Verifier(assembly)
    nbytes = assembly.manifest.nbytes
    at = start = assembly.resume_offset
    view = memoryview(assembly.buffer)
    try:
        with socket.create_connection((ticket.host, ticket.port), timeout=stall_s) as sock:
            sock.sendall(ticket.token)
            while at < nbytes and not verifier.failed:
                # MSG_WAITALL: one call per 4 MiB instead of one per socket-buffer's worth
                n = sock.recv_into(view[at:], min(RECV_BYTES, nbytes - at), socket.MSG_WAITALL)
                if n == 0:
                    break
                at += n
                verifier.arrived(at)
                if on_progress is not None:
                    on_progress(at)
    except OSError:  # reset, refused or stalled past stall_s: resume from the last verified chunk
        pass
    verifier.stop()
    return _End(at - start, broken=not verifier.failed and not assembly.complete, corrupt=verifier.failed)


class _Verifier:
    """Verifies chunks behind the socket reader, on its own thread."""

    def __init__(self, assembly: Assembly) -> None:
        self.assembly = assembly
        self.failed = False
        self._next = assembly.verified  # the next chunk handed over for checking
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="weights-verify", daemon=True)
        self._thread.start()

    def arrived(self, upto: int) -> None:
        chunks = self.assembly.manifest.chunks
        while self._next < len(chunks) and _end(chunks[self._next]) <= upto:
            self._queue.put(self._next)
            self._next += 1

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (index := self._queue.get()) is not None:
            if not self.failed and self.assembly.verify_next() is not Accepted.OK:
                self.failed = True
            del index


def _end(chunk: ChunkInfo) -> int:
    return chunk.offset + chunk.length
