"""The weight service: the trainer's rank 0 holds each published version in memory and serves it to
rollout instances, paced to the link model.

Control plane (gRPC, `weights.proto`): `GetManifest` (tensor table, an XXH3 hash per chunk, the whole
SHA-256; NOT_FOUND names the versions held), `Pull` (the bytes from a resume offset as a stream of
chunk messages) and `OpenData` (a one-use ticket for the same bytes on the data plane: a raw TCP
stream that the receiver reads straight into its preallocated buffer). Both paths pace through one
`LinkShaper`, so every pull in flight shares the egress max-min fairly under each receiver's cap.

Why two paths: on this machine Python gRPC streaming of 1-4 MiB messages moved 0.13x of a raw TCP
socket on loopback (`docs/benchmarks.md`), limited by the receiver's CPU (every message is a new
bytes object to copy); the data plane reaches the socket's rate (`scripts/bench_weights.py`
measures both in one run).

Relays: a receiver may run a service of its own and `relay` the copy it is assembling. It sends
only the verified prefix, and a stream that catches up with the copy waits for the next chunk (it
ends if the copy stops growing for `RELAY_WAIT_S`). A version the relay `expect`s is waited for
rather than refused, and so, for `await_newer_s`, is any version newer than the relay holds: a
receiver behind it may ask before the relay's own pull has begun. The
receivers behind it check every chunk against the origin's manifest, so a relay cannot pass on
damage unnoticed (`WeightClient.pull`'s `relays`).

The service keeps the latest `keep` versions, so an instance that started pulling version v can
finish it after v+1 is published (the join protocol decides whether that is admissible).
`Faults` injects transport damage once (a cut stream, a flipped byte) for the fault tests and the
benchmark's fault run; it is off unless given.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc

from rlsched.transfer import weights_pb2 as pb
from rlsched.transfer import weights_pb2_grpc as pb_grpc
from rlsched.transfer.manifest import DEFAULT_CHUNK_BYTES, LATEST, Assembly, Buffer, Manifest, build_manifest
from rlsched.transfer.shaping import LinkShaper, Pace, SlowReceiver

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
PACE_QUANTUM = 256 << 10  # the data plane books and sends this much at a time
RELAY_WAIT_S = 30.0  # a relay's stream ends if its own copy does not grow for this long
TOKEN_BYTES = 16


@dataclass
class Faults:
    """Transport damage, each fault injected once: the next stream to open is cut after
    `cut_after_bytes` of its bytes; the next time chunk `corrupt_chunk` is sent, one of its bytes is
    flipped on the wire."""

    cut_after_bytes: int | None = None
    corrupt_chunk: int | None = None

    def take_cut(self) -> int | None:
        cut, self.cut_after_bytes = self.cut_after_bytes, None
        return cut

    def damage(self, piece: memoryview, offset: int, m: Manifest) -> memoryview:
        """`piece` (the bytes at `offset`), with the pending corruption applied if it falls in it:
        the middle byte of chunk `corrupt_chunk` is flipped."""
        if self.corrupt_chunk is None or not 0 <= self.corrupt_chunk < len(m.chunks):
            return piece
        target = m.chunks[self.corrupt_chunk]
        at = target.offset + target.length // 2 - offset
        if not 0 <= at < len(piece):
            return piece
        self.corrupt_chunk = None
        bad = bytearray(piece)
        bad[at] ^= 0xFF
        return memoryview(bad)


@dataclass(frozen=True)
class _Held:
    blob: bytes | Buffer
    manifest: Manifest
    pb: pb.Manifest
    assembly: Assembly | None = None  # a relayed copy: only its verified prefix may be sent


@dataclass(frozen=True)
class _Ticket:
    held: _Held
    offset: int
    receiver: str
    ingress_bps: float


def manifest_to_pb(m: Manifest) -> pb.Manifest:
    return pb.Manifest(
        version=m.version,
        nbytes=m.nbytes,
        sha256=m.sha256,
        chunk_bytes=m.chunk_bytes,
        chunk_xxh3=[c.xxh3 for c in m.chunks],
        tensors=[
            pb.Tensor(name=t.name, dtype=t.dtype, shape=list(t.shape), start=t.start, end=t.end)
            for t in m.tensors
        ],
    )


class WeightService(pb_grpc.WeightsServicer):
    """Holds published versions and serves them over gRPC and the TCP data plane."""

    def __init__(
        self,
        egress_bps: float | None = None,
        host: str = "127.0.0.1",
        keep: int = 2,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        faults: Faults | None = None,
        max_workers: int = 16,
        slow_lag_s: float = 0.5,
        await_newer_s: float = 0.0,
    ) -> None:
        """`await_newer_s` (a relay's): how long a request for a version newer than any held waits
        for this receiver's own pull of it to begin (the fleet points peers at a relay as it starts
        that pull; 0: refused at once, as the origin does)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.host, self.keep, self.chunk_bytes = host, keep, chunk_bytes
        self.faults = faults or Faults()
        self.slow_lag_s = slow_lag_s
        self.await_newer_s = await_newer_s
        self.shaper = LinkShaper(egress_bps, slow_lag_s=slow_lag_s, on_slow=self._on_slow)
        self._versions: OrderedDict[int, _Held] = OrderedDict()
        self._expected: set[int] = set()  # versions this relay will hold once its pull begins
        self._arrived = threading.Condition()
        self._tickets: dict[bytes, _Ticket] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=GRPC_OPTIONS)
        pb_grpc.add_WeightsServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{host}:0")
        self._data = socket.create_server((host, 0), backlog=64)
        self.data_port = self._data.getsockname()[1]
        self._closed = threading.Event()
        self._streams: set[socket.socket] = set()  # data-plane connections being served
        self._server.start()
        threading.Thread(target=self._accept_loop, name="weights-data", daemon=True).start()

    def reshape(self, egress_bps: float | None) -> None:
        """A new egress rate (None: unshaped) for the pulls that start from now on."""
        self.shaper = LinkShaper(egress_bps, slow_lag_s=self.slow_lag_s, on_slow=self._on_slow)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- publishing ---------------------------------------------------------------------------
    def publish(self, version: int, blob: bytes | bytearray) -> Manifest:
        """Hold `blob` as `version` (newer than any held) and drop versions beyond `keep`."""
        manifest = build_manifest(version, blob, self.chunk_bytes)
        self._hold(_Held(blob, manifest, manifest_to_pb(manifest)))
        return manifest

    def relay(self, assembly: Assembly) -> None:
        """Serve a copy that is still arriving (this service is a receiver's relay): its verified
        prefix at once, the rest as it is verified; a stream that catches up with it waits."""
        m = assembly.manifest
        self._hold(_Held(assembly.buffer, m, manifest_to_pb(m), assembly))

    def expect(self, version: int) -> None:
        """This relay is about to pull `version`: a stream that asks for it before the copy exists
        waits for it (up to `RELAY_WAIT_S`) instead of being told it is not held."""
        with self._lock:
            self._expected.add(version)

    def _hold(self, held: _Held) -> None:
        version = held.manifest.version
        with self._lock:
            if self._versions and version <= next(reversed(self._versions)):
                raise ValueError(f"version {version} is not newer than {next(reversed(self._versions))}")
            self._versions[version] = held
            self._expected.discard(version)
            while len(self._versions) > self.keep:
                self._versions.popitem(last=False)
        with self._arrived:
            self._arrived.notify_all()

    def _patience(self, version: int) -> float:
        """How long a request for `version` may wait for it to arrive (0: answer now)."""
        with self._lock:
            if version in self._versions or version == LATEST:
                return 0.0
            if version in self._expected:
                return RELAY_WAIT_S
            newest = next(reversed(self._versions)) if self._versions else -1
            return self.await_newer_s if version > newest else 0.0

    def _wait_expected(self, version: int) -> None:
        deadline = time.monotonic() + self._patience(version)
        with self._arrived:
            while True:
                with self._lock:
                    if version in self._versions:
                        return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._arrived.wait(left)

    def _ready(self, held: _Held, offset: int, want: int) -> int:
        """How far past `offset` (up to `want`) may be sent now: all of it for a published version;
        for a relayed copy its verified prefix, after waiting for at least the next chunk."""
        if held.assembly is None:
            return want
        first = min(offset + held.manifest.chunk_bytes, want)
        return min(held.assembly.wait_verified(first, RELAY_WAIT_S), want)

    @property
    def latest(self) -> int | None:
        with self._lock:
            return next(reversed(self._versions)) if self._versions else None

    def _held(self, version: int, context: grpc.ServicerContext) -> _Held:
        self._wait_expected(version)
        with self._lock:
            if version == LATEST and self._versions:
                version = next(reversed(self._versions))
            held = self._versions.get(version)
            have = ", ".join(str(v) for v in self._versions) or "none yet"
        if held is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"weight version {version} is not held by this service (it holds: {have}); "
                f"ask for one of those, or {LATEST} for the latest",
            )
        assert held is not None
        return held

    def _check_offset(self, held: _Held, offset: int, context: grpc.ServicerContext) -> None:
        if offset == held.manifest.nbytes:
            return
        if offset < 0 or offset > held.manifest.nbytes or offset % held.manifest.chunk_bytes:
            context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"offset {offset} is not a chunk boundary of version {held.manifest.version} "
                f"({held.manifest.nbytes} bytes in chunks of {held.manifest.chunk_bytes})",
            )

    # -- gRPC ---------------------------------------------------------------------------------
    def GetManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.Manifest:
        return self._held(request.version, context).pb

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.Chunk]:
        held = self._held(request.version, context)
        self._check_offset(held, request.offset, context)
        pace = self.shaper.open(request.receiver or context.peer(), request.ingress_bps)
        cut = self.faults.take_cut()
        try:
            view, size, sent = memoryview(held.blob), held.manifest.chunk_bytes, 0
            for offset in range(request.offset, held.manifest.nbytes, size):
                end = min(offset + size, held.manifest.nbytes)
                if self._ready(held, offset, end) < end:
                    return  # a relay whose copy stopped growing: the receiver goes elsewhere
                data = self.faults.damage(view[offset:end], offset, held.manifest)
                if cut is not None and sent + len(data) > cut:
                    return  # the stream ends short: the receiver resumes from its last chunk
                pace.take(len(data))
                sent += len(data)
                began = time.monotonic()
                yield pb.Chunk(offset=offset, data=bytes(data))
                pace.took(len(data), time.monotonic() - began)
        finally:
            pace.close()

    def OpenData(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.DataTicket:
        held = self._held(request.version, context)
        self._check_offset(held, request.offset, context)
        token = secrets.token_bytes(TOKEN_BYTES)
        with self._lock:
            self._tickets[token] = _Ticket(held, request.offset, request.receiver, request.ingress_bps)
        return pb.DataTicket(host=self.host, port=self.data_port, token=token)

    # -- data plane ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._data.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_data, args=(conn,), daemon=True).start()

    def _serve_data(self, conn: socket.socket) -> None:
        with self._lock:
            self._streams.add(conn)
        with conn:
            try:
                token = _recv_exact(conn, TOKEN_BYTES)
                with self._lock:
                    ticket = self._tickets.pop(token, None)
                if ticket is None:
                    log.warning("data plane: a connection presented an unknown ticket; closed")
                    return
                pace = self.shaper.open(ticket.receiver, ticket.ingress_bps)
                try:
                    self._send_from(conn, ticket, pace)
                finally:
                    pace.close()
            except OSError as err:  # the receiver went away: it resumes from its last verified chunk
                log.info("data plane: stream ended early: %s", err)
            finally:
                with self._lock:
                    self._streams.discard(conn)

    def _send_from(self, conn: socket.socket, ticket: _Ticket, pace: Pace) -> None:
        m = ticket.held.manifest
        view = memoryview(ticket.held.blob)
        cut = self.faults.take_cut()
        end = m.nbytes if cut is None else min(m.nbytes, ticket.offset + cut)
        # shaped: booked and sent a quantum at a time; unshaped: one sendall, as a raw socket would
        step = PACE_QUANTUM if self.shaper.paced(pace) else max(end - ticket.offset, 1)
        offset = ticket.offset
        while offset < end:
            upto = self._ready(ticket.held, offset, min(offset + step, end))
            if upto <= offset:
                return  # a relay whose copy stopped growing: closing makes the receiver go elsewhere
            piece = view[offset:upto]
            pace.take(len(piece))
            began = time.monotonic()
            conn.sendall(self.faults.damage(piece, offset, m))
            pace.took(len(piece), time.monotonic() - began)
            offset = upto

    def _on_slow(self, slow: SlowReceiver) -> None:
        log.warning("%s", slow)

    def close(self) -> None:
        """Stop serving, streams in flight included (their receivers resume elsewhere)."""
        self._closed.set()
        self._data.close()
        self._server.stop(grace=None)
        with self._lock:
            streams = list(self._streams)
        for conn in streams:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        piece = conn.recv(n - len(out))
        if not piece:
            raise OSError(f"connection closed after {len(out)} of {n} bytes")
        out += piece
    return bytes(out)
