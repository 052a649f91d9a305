"""Rollout instances: each holds a rollout engine, follows the instance lifecycle, takes its weights
over the weight link, and streams every finished sample back the moment it exists.

Joining (and taking each new version): ALLOCATED/READY -> TRANSFERRING (pull the version from the
trainer's weight service, every chunk verified) -> LOADING (the engine takes the tensors) ->
CONFIRMING (the engine's checksum of what it loaded against the published SHA-256, and the version
against the one asked for) -> READY. Each step is a span in the returned `JoinReport`. A mismatch
never reaches READY: the instance pulls again as its retry policy says (`weights.pull_retries`,
`rlsched.policy.retry`), then gives up (RELEASED) with `JoinFailed`. Requests sent to an instance
that is not READY are refused (`NotReady`).

A job's route (`generate`) runs as a batch of its own on the engine (`refill` batch), or, refilled
slot by slot, joins the rows the instance already runs: on torch through the same continuous-batching
server as the endpoint's streams (`rlsched.engine.stream_server`), on vLLM as requests of its one
async engine. While it generates, the instance saves each running request's new tokens to the
durable store every `flush_s` (`rlsched.store`), under the attempt its route was given; a reclaimed
instance's requests then resume elsewhere from what was saved. A store that fails mid-run is logged
once and generation goes on (the requests would restart instead of resuming).

Every engine serves every kind of demand: the endpoint's streams (`stream`: torch's continuous batch
through `StreamServer`, vLLM's through `VllmStreams`), and a multi-turn job's routes of episodes
(`episodes`: one loop of rounds per instance, `rlsched.rl.episode_server`, whose turns are requests
like any other).

`Instance` is a plain class (component tests and the weight benchmark drive it without Ray);
`actors.rollout.RolloutInstance` is its actor.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlsched.config import EngineKind
from rlsched.engine.prefix_cache import BLOCK
from rlsched.engine.protocol import (
    GenerationRequest,
    Partial,
    RequestId,
    RolloutEngine,
    Sample,
    SamplingParams,
    WeightVersion,
)
from rlsched.engine.staging import StagingError
from rlsched.engine.stream_server import Event, StreamServer, Withdrawn
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.model.checkpoint import BASE_CHECKPOINT, load_checkpoint, published_nbytes
from rlsched.policy.lifecycle import InstanceState, transition
from rlsched.policy.retry import RetryPolicy
from rlsched.policy.routing import Refill
from rlsched.policy.versions import SwapKV
from rlsched.rl.agent import AgentRollout, AgentSpec
from rlsched.rl.episode_runs import EpisodeRun, EpisodeTask
from rlsched.rl.episode_server import EpisodeServer
from rlsched.rl.task import TaskProblem
from rlsched.rollout.pull_buffers import Spare, StagedLoad
from rlsched.store.partial import Chunk, PartialStore, StoreError
from rlsched.transfer.client import PullStats, TransferFailed, VersionNotFound, WeightClient
from rlsched.transfer.manifest import LATEST, Assembly, Buffer, blank
from rlsched.transfer.plane import Plane
from rlsched.transfer.service import WeightService

if TYPE_CHECKING:
    from rlsched.engine.vllm import VllmStreams

log = logging.getLogger(__name__)

PULL_RETRY = RetryPolicy(1)  # `weights.pull_retries`' default: one pull more
RELAY_AWAIT_S = 10.0  # a peer that asks this instance's relay for a version it has not begun waits


class NotReady(RuntimeError):
    """Requests sent to an instance that is not READY: a controller bug, never silently served."""


class JoinFailed(RuntimeError):
    """The instance could not take a version it could confirm; it never served it."""


@dataclass(frozen=True)
class JoinReport:
    instance: str
    version: int
    transfer: tuple[float, float]  # monotonic start and end on the instance's node
    load: tuple[float, float]
    confirm: tuple[float, float]
    nbytes: int
    streams: int
    broken: int
    corrupt: int
    attempts: int  # pulls it took to confirm (1 unless a mismatch forced another)
    staged: bool = False  # loaded tensor by tensor while the bytes arrived (load: the rest, swap)
    sources: tuple[str, ...] = ()  # the services (relays, then the origin) that delivered bytes
    relayed: bool = False  # a peer delivered some of it

    @property
    def transfer_s(self) -> float:
        return self.transfer[1] - self.transfer[0]

    @property
    def gbps(self) -> float:
        return 8.0 * self.nbytes / max(self.transfer_s, 1e-9) / 1e9

    def line(self, names: dict[str, str] | None = None) -> str:
        """One log line; `names` labels the services that delivered (address -> name; the trainer
        if not named)."""
        load_s = self.load[1] - self.load[0]
        confirm_s = self.confirm[1] - self.confirm[0]
        label = names or {}
        sources = " then ".join(label.get(s, "the trainer") for s in self.sources)
        return (
            f"{self.instance} joined at v{self.version}: transfer {self.transfer_s:.2f} s "
            f"({self.nbytes / 1e6:.1f} MB at {self.gbps:.3f} Gbit/s, {self.streams} stream(s)"
            f"{', from ' + sources if self.relayed else ''}), "
            f"load {load_s:.3f} s{' after staging while it arrived' if self.staged else ''}, "
            f"confirm {confirm_s:.3f} s"
        )


def _append(chunks: Sequence[Chunk], attempt: int, store: PartialStore) -> int:
    return store.append(chunks, attempt, time.time())


def _torch_engine(
    path: Path | None,
    max_batch: int,
    use_cache: bool,
    seed: int,
    dtype: str,
    prefix_cache_tokens: int,
    swap_kv: SwapKV = SwapKV.RECOMPUTE,
    batch_invariant: bool = False,
) -> RolloutEngine:
    ckpt = load_checkpoint(path, dtype=engine_dtype(dtype))
    return TorchRolloutEngine(
        ckpt.model, ckpt.tokenizer, max_batch=max_batch, use_cache=use_cache, seed=seed,
        prefix_cache_blocks=-(-prefix_cache_tokens // BLOCK), swap_kv=swap_kv,
        batch_invariant=batch_invariant,
    )  # fmt: skip


def _vllm_engine(path: Path | None, max_batch: int, seed: int) -> RolloutEngine:
    from rlsched.engine.vllm import VllmRolloutEngine  # vLLM is optional: imported only when chosen

    return VllmRolloutEngine(path or BASE_CHECKPOINT, max_batch=max_batch, seed=seed)


class Instance:
    def __init__(
        self,
        instance_id: str,
        checkpoint: str | None,
        max_batch: int,
        use_cache: bool,
        seed: int,
        store_path: str | None = None,
        flush_s: float = 0.25,
        engine: str = "torch",
        dtype: str = "auto",
        stage: bool = True,
        prefix_cache_tokens: int = 0,
        swap_kv: str = "recompute",
        batch_invariant: bool = False,
    ) -> None:
        """`stage`: load each version while it arrives where the engine can (False: after the whole
        file is in, the sequential baseline). `prefix_cache_tokens`: keys and values a torch engine
        keeps for requests that share a prefix (the endpoint's multi-turn episodes); 0: none.
        `swap_kv`: a version swapped in under running requests recomputes their keys and values, or
        keeps them (`rlsched.policy.versions.SwapKV`). `batch_invariant`: the torch engine's
        `engine.batch_invariant`."""
        torch.set_num_threads(1)
        self.instance_id = instance_id
        self.state = transition(InstanceState.REQUESTED, InstanceState.ALLOCATED)
        path = Path(checkpoint) if checkpoint else None
        self.unavailable: str | None = None  # why the engine could not start: `join` reports it
        try:
            self.engine: RolloutEngine = (
                _vllm_engine(path, max_batch, seed)
                if EngineKind(engine) is EngineKind.VLLM
                else _torch_engine(
                    path,
                    max_batch,
                    use_cache,
                    seed,
                    dtype,
                    prefix_cache_tokens,
                    SwapKV(swap_kv),
                    batch_invariant,
                )
            )
        except Exception as err:  # noqa: BLE001 - e.g. no vLLM on this node; a typed JoinFailed later
            self.unavailable = f"cannot start its {engine} engine: {err}"
        self.store = PartialStore(Path(store_path)) if store_path else None
        self.stage = stage
        self.flush_s = flush_s
        self._buffer: Buffer | None = None  # reused from one version to the next
        self.relay: WeightService | None = None  # serves what it pulls to peers (`start_relay`)
        self._spare: Spare | None = None  # the next pull's buffer, where each version needs its own
        self._attempts: dict[str, int] = {}  # a job's request running here -> its route's attempt
        self.store_failures = 0
        self._streams: StreamServer | VllmStreams | None = None  # the endpoint's requests, made on the first
        self._streams_lock = threading.Lock()
        self._mux: dict[str, queue.SimpleQueue[tuple[str, Event] | None]] = {}  # by endpoint (`mux`)
        self._agent: AgentRollout | None = None  # a multi-turn job's episodes, made on the first
        self._episodes: EpisodeServer | None = None  # ... and their loop of rounds
        self._prepare_spare(background=False)  # part of starting: the first pull finds it made

    def _to(self, target: InstanceState) -> None:
        self.state = transition(self.state, target)

    # -- weights --------------------------------------------------------------------------------
    def start_relay(self, upload_bps: float = 0.0) -> str:
        """Serve every version this instance pulls to the peers the fleet points at it, at most at
        `upload_bps` (0: unshaped); returns the relay's address. Idempotent."""
        if self.relay is None:
            self.relay = WeightService(egress_bps=upload_bps or None, keep=1, await_newer_s=RELAY_AWAIT_S)
            self._prepare_spare()
        return self.relay.address

    def _fresh(self) -> bool:
        """Whether each version needs a buffer of its own: a staged torch engine keeps the bytes as
        its weights, and a relay's peers may still be reading the last version's."""
        return self.relay is not None or (self.stage and isinstance(self.engine, TorchRolloutEngine))

    def _prepare_spare(self, nbytes: int | None = None, background: bool = True) -> None:
        """Make the next pull's buffer ahead, on a thread while the instance is idle or generating
        (`nbytes`: the last version's size; first, the size a version of the engine's model has)."""
        if self._spare is not None or self.unavailable is not None or not self._fresh():
            return
        if nbytes is None and isinstance(self.engine, TorchRolloutEngine):
            nbytes = published_nbytes(self.engine.model)
        if nbytes:
            self._spare = Spare(nbytes, self._allocate, background)

    def join(
        self,
        address: str,
        version: int,
        ingress_bps: float = 0.0,
        plane: str = "tcp",
        retry: RetryPolicy = PULL_RETRY,
        relays: Sequence[str] = (),
    ) -> JoinReport:
        """Take `version` (or a newer one, if it is gone) from the weight service at `address`, from
        the peers in `relays` first; READY only once it is confirmed. An engine that stages (the
        torch engine) loads each tensor as its bytes are verified and swaps the version in at once."""
        if self.unavailable is not None:
            self._to(InstanceState.RELEASED)
            raise JoinFailed(f"{self.instance_id}: {self.unavailable}")
        if self.relay is not None:
            self.relay.expect(version)  # a peer behind it may ask before its own pull begins
        failures = 0
        while True:
            self._to(InstanceState.TRANSFERRING)
            t0 = time.monotonic()
            staged = StagedLoad(self.engine if self.stage else None)
            try:
                stats, buffer, published, version = self._pull(
                    address, version, ingress_bps, Plane(plane), relays, staged.begin
                )
            except JoinFailed:
                staged.cancel()
                raise
            t1 = time.monotonic()
            self._to(InstanceState.LOADING)
            loaded = self._load(staged, buffer, version, stats.confirmed)
            t2 = time.monotonic()
            self._to(InstanceState.CONFIRMING)
            problem = self._mismatch(stats, published, loaded, version)
            t3 = time.monotonic()
            if problem is None:
                self._to(InstanceState.READY)
                self._prepare_spare(stats.nbytes)
                return JoinReport(
                    self.instance_id, version, (t0, t1), (t1, t2), (t2, t3), stats.nbytes, stats.streams,
                    stats.broken, stats.corrupt, failures + 1, staged.staged, stats.sources,
                    any(src != address for src in stats.sources),
                )  # fmt: skip
            failures += 1
            wait = retry.after(failures)
            log.warning("%s: %s (pull %d of %s)", self.instance_id, problem, failures, retry.attempts)
            if wait is None:
                break
            time.sleep(wait)
        self._to(InstanceState.RELEASED)
        raise JoinFailed(
            f"{self.instance_id}: gave up on version {version} after {failures} pulls: {problem}"
        )

    def _load(self, staged: StagedLoad, buffer: Buffer, version: int, confirmed: bool) -> str | StagingError:
        """The checksum of what the engine now holds: the staged copy swapped in (only if the pull
        confirmed the whole version), or the whole buffer loaded at once; why a staged version
        could not be swapped in, as a value."""
        if staged.staged:
            if not confirmed:  # `_mismatch` reports the pull; nothing is swapped in
                staged.cancel()
                return StagingError("the pull did not confirm")
            try:
                return staged.commit()
            except StagingError as err:
                return err
        return self.engine.load_weights(buffer, WeightVersion(version))

    def _pull(
        self,
        address: str,
        version: int,
        ingress_bps: float,
        plane: Plane,
        relays: Sequence[str],
        on_assembly: Callable[[Assembly], None],
    ) -> tuple[PullStats, Buffer, str, int]:
        """Pull `version`; if the service no longer holds it (the instance took longer to start than
        the service keeps versions, as a vLLM engine may), the newest it holds instead. Returns the
        version finally asked for with what came back."""

        def began(assembly: Assembly) -> None:
            if self.relay is not None:
                self.relay.relay(assembly)
            on_assembly(assembly)

        buffer = self._take_spare() if self._fresh() else self._buffer
        try:
            with WeightClient(address) as client:
                pull = partial(
                    client.pull, receiver=self.instance_id, ingress_bps=ingress_bps, plane=plane,
                    buffer=buffer, relays=relays, on_assembly=began, allocate=self._allocate,
                )  # fmt: skip
                try:
                    pulled = pull(version)
                except VersionNotFound:
                    newest = client.manifest(LATEST).version
                    if newest <= version:
                        raise
                    log.info("%s: version %d is gone; taking %d", self.instance_id, version, newest)
                    pulled, version = pull(newest), newest
        except (VersionNotFound, TransferFailed) as err:
            self._to(InstanceState.RELEASED)
            raise JoinFailed(f"{self.instance_id}: cannot take version {version}: {err}") from None
        self._buffer = pulled.assembly.buffer
        return pulled.stats, pulled.assembly.buffer, pulled.assembly.manifest.sha256, version

    def _allocate(self, nbytes: int) -> Buffer:
        """A buffer to pull into: the engine's own where it loads from one without a copy (unless
        it cannot make one, say /dev/shm is too small: then a private one, and the load copies)."""
        try:
            own = self.engine.pull_buffer(nbytes) if nbytes else None
        except OSError as err:
            log.warning(
                "%s: no pull buffer from the engine (%s); pulling into private memory", self.instance_id, err
            )
            own = None
        return own if own is not None else blank(nbytes)

    def _take_spare(self) -> Buffer | None:
        spare, self._spare = self._spare, None
        return spare.take() if spare is not None else None

    @staticmethod
    def _mismatch(stats: PullStats, published: str, loaded: str | StagingError, version: int) -> str | None:
        if stats.version != version:
            return f"the service sent version {stats.version} when {version} was asked for"
        if not stats.confirmed:
            return "the bytes received do not match the published SHA-256"
        if isinstance(loaded, StagingError):
            return f"the engine did not take the version (not loaded: {loaded})"
        if loaded != published:
            return f"the engine loaded checksum {loaded[:12]}, the published one is {published[:12]}"
        return None

    # -- generation -----------------------------------------------------------------------------
    def generate(
        self, requests: Sequence[GenerationRequest], attempt: int = 1, refill: str = "batch"
    ) -> Iterator[Sample]:
        """A route of the job's requests, each sample yielded as it finishes: a batch of its own
        (`refill` batch), or rows beside the others running here (slot)."""
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        ids = [r.request_id for r in requests]
        sink = None
        if self.store is not None:
            self._save(lambda s: s.claim(ids, attempt, self.instance_id, time.time()))
            self._attempts.update(dict.fromkeys(ids, attempt))
            sink = self._save_partials
        try:
            if Refill(refill) is Refill.SLOT and isinstance(self.engine, TorchRolloutEngine):
                yield from self._rows(requests)
            else:  # vLLM's one async engine runs concurrent routes side by side by itself
                yield from self.engine.generate(requests, on_partial=sink, partial_every_s=self.flush_s)
        finally:
            for rid in ids:
                if self._attempts.get(rid) == attempt:
                    del self._attempts[rid]

    def _rows(self, requests: Sequence[GenerationRequest]) -> Iterator[Sample]:
        """`requests` as rows of the instance's continuous batch (the endpoint's server): each sample
        as it finishes; closed early, the rest are withdrawn or aborted."""
        server = self._stream_server()
        done: queue.SimpleQueue[Event] = queue.SimpleQueue()
        for req in requests:
            server.engine.check(req)  # all or nothing, as a batch of its own
        left = {r.request_id for r in requests}
        for req in requests:
            server.submit(req, 0, lambda e: None if isinstance(e, list) else done.put(e))
        try:
            while left:
                event = done.get()
                if isinstance(event, Withdrawn):  # cancelled before a row took it: it never arrives
                    left.discard(RequestId(str(event)))
                    continue
                if isinstance(event, BaseException):
                    raise event
                assert isinstance(event, Sample)
                left.discard(event.request_id)
                yield event
        finally:
            for rid in left:
                server.cancel(RequestId(rid))

    def _save_partials(self, partials: Sequence[Partial]) -> None:
        """The new tokens of the job's requests, each under its route's attempt (the endpoint's
        streams are not saved)."""
        by_attempt: dict[int, list[Chunk]] = {}
        for p in partials:
            attempt = self._attempts.get(p.request_id)
            if attempt is not None:
                chunk = Chunk(p.request_id, p.start, p.token_ids, p.logprobs)
                by_attempt.setdefault(attempt, []).append(chunk)
        for attempt, chunks in by_attempt.items():
            self._save(partial(_append, chunks, attempt))

    def _save(self, write: Callable[[PartialStore], object]) -> None:
        """A store that fails mid-run must never stop generation: log once, count, go on."""
        assert self.store is not None
        try:
            write(self.store)
        except (StoreError, sqlite3.Error, OSError) as err:
            self.store_failures += 1
            if self.store_failures == 1:
                log.error(
                    "%s: the partial-output store failed (%s); generating unsaved", self.instance_id, err
                )

    def complete(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        """All samples at once (evaluation, where nothing overlaps)."""
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        return list(self.engine.generate(requests))

    def abort(self, request_id: str) -> None:
        self.engine.abort(RequestId(request_id))

    def status(self) -> tuple[str, int, int]:
        version = -1 if self.unavailable is not None else int(self.engine.version)
        return str(self.state), version, self.store_failures

    # -- a multi-turn job's episodes -------------------------------------------------------------
    def episodes(self, spec: AgentSpec, tasks: Sequence[EpisodeTask]) -> Iterator[EpisodeRun]:
        """A route of a multi-turn job's episodes (the fleet core routes them as any request): they
        join this instance's one loop of rounds (`rlsched.rl.episode_server`), each with its
        environments sandboxed on this node and every round journaled where `spec` says (one that an
        earlier instance left under way resumes from its last committed round); each comes back as it
        ends."""
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        ended: queue.SimpleQueue[EpisodeRun | BaseException] = queue.SimpleQueue()
        with self._streams_lock:
            if self._episodes is None:
                self._episodes = EpisodeServer(self._rollout_agent(spec))
        self._episodes.submit(tasks, ended.put)
        for _ in tasks:
            item = ended.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    def run_episodes(
        self,
        spec: AgentSpec,
        problems: Sequence[TaskProblem],
        places: Sequence[int],
        group_size: int,
        prefix: str,
        params: SamplingParams | None = None,
    ) -> list[EpisodeRun]:
        """An evaluation's episodes `PREFIX-PLACE-MEMBER` of `problems` (their `places`), run to their
        end with `params` (greedy), outside the rounds of the job's routes and not journaled."""
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        return self._rollout_agent(spec).run(problems, group_size, prefix, params, indices=places)

    def _rollout_agent(self, spec: AgentSpec) -> AgentRollout:
        """The episodes' runner on this engine (a turn is a request like any other): on torch its
        rounds' turns join the instance's continuous batch beside the endpoint's streams and the job's
        slot-refilled routes (`rows_engine`); vLLM batches whatever comes by itself."""
        if self._agent is None:
            engine = self.rows_engine() if isinstance(self.engine, TorchRolloutEngine) else self.engine
            self._agent = spec.rollout(engine, self.engine.tokenizer)
        return self._agent

    def rows_engine(self) -> _RowsEngine:
        """This torch instance's continuous batch as an engine (`rlsched.rl.agent.TurnEngine`)."""
        return _RowsEngine(self.engine.context_length, self._rows)

    # -- the endpoint's streams -----------------------------------------------------------------
    def describe(self) -> tuple[int, int]:
        """The engine's context length and how many sequences it generates at once."""
        if self.unavailable is not None:
            raise JoinFailed(f"{self.instance_id}: {self.unavailable}")
        return self.engine.context_length, self.engine.max_batch

    def mux(self, reader: str) -> Iterator[list[tuple[str, Event]]]:
        """The OpenAI endpoint's requests here, on one stream for all of them (`reader`: the endpoint
        that reads it, one per endpoint): each message is every event that came since the last, with
        its request's id (each step's tokens, then the sample; the exception a request failed with;
        `Withdrawn` for one withdrawn before it ran). One message a decoding step for the whole batch,
        not one per request. It ends when the instance is released."""
        box = self._mux_box(reader)
        while True:
            batch = [box.get()]
            while not box.empty():
                batch.append(box.get())
            items = [b for b in batch if b is not None]
            if items:
                yield items
            if len(items) < len(batch):
                return

    def submit_stream(self, request: GenerationRequest, priority: int, reader: str) -> None:
        """One request of the OpenAI endpoint: it joins the running batch (continuous batching, lowest
        `priority` first) and its events go to `reader`'s stream (`mux`)."""
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        box, rid = self._mux_box(reader), str(request.request_id)
        self._stream_server().submit(request, priority, lambda event: box.put((rid, event)))

    def _mux_box(self, reader: str) -> queue.SimpleQueue[tuple[str, Event] | None]:
        """`reader`'s events, made by whichever comes first: its stream or its first request."""
        with self._streams_lock:
            return self._mux.setdefault(reader, queue.SimpleQueue())

    def streams(self) -> tuple[int, int]:
        """The endpoint's requests here that hold an engine row, and those that wait for one."""
        return (0, 0) if self._streams is None else (self._streams.running, self._streams.waiting)

    def cancel(self, request_id: str) -> None:
        """The endpoint's client went away: withdraw or abort its request."""
        if self._streams is not None:
            self._streams.cancel(RequestId(request_id))

    def _stream_server(self) -> StreamServer | VllmStreams:
        with self._streams_lock:
            if self._streams is None:
                if isinstance(self.engine, TorchRolloutEngine):
                    sink = self._save_partials if self.store is not None else None
                    self._streams = StreamServer(self.engine, sink, self.flush_s)
                else:  # vLLM batches and schedules the requests itself
                    from rlsched.engine.vllm import VllmRolloutEngine, VllmStreams

                    assert isinstance(self.engine, VllmRolloutEngine)
                    self._streams = VllmStreams(self.engine)
            return self._streams

    def drain(self) -> str:
        if self.state is InstanceState.READY:
            self._to(InstanceState.DRAINING)
        return str(self.state)

    def release(self) -> str:
        if self.state is InstanceState.READY:
            self._to(InstanceState.DRAINING)
        if self._streams is not None:
            self._streams.close()
        with self._streams_lock:
            for box in self._mux.values():
                box.put(None)  # each endpoint's stream ends
        if self._episodes is not None:
            self._episodes.stop()
        if self._agent is not None:
            self._agent.close()
        if self.state is not InstanceState.RELEASED:
            self._to(InstanceState.RELEASED)
        if self.unavailable is None:
            self.engine.shutdown()  # vLLM's engine processes go now, not when the actor is killed
        if self.relay is not None:
            self.relay.close()
        return str(self.state)


@dataclass(frozen=True)
class _RowsEngine:
    """`Instance.rows_engine`: requests generated as rows of the instance's continuous batch."""

    context_length: int
    rows: Callable[[Sequence[GenerationRequest]], Iterator[Sample]]

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Sample]:
        return self.rows(requests)
