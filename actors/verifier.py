"""Verifier pool workers: one Ray actor per slot, each judging one sample at a time.

A worker runs a verifier in-process through `run_verifier`, so a crash comes back as an
`ExecutionFault` (to be retried), never as a zero reward; a verifier kind that does not exist, or a
sample without a reference, is an INPUT fault (not retried: it would judge the same way again).
The actor is threaded (two threads): one runs the verification, the other answers `heartbeat`, so
the controller can tell a busy worker from a lost one. Stopping a verification means killing the
worker (`ray.kill`): nothing short of ending the process stops arbitrary in-process code, and the
slot is reused only once the controller has seen the process end (its pending call fails, and on
the controller's own node its pid is gone).
A two-stage verifier (compile, then run on a GPU) is called one stage at a time when the pool has
GPU workers: `stage="cpu"` returns a `Prepared` payload, which a GPU worker (an actor holding one
GPU) takes with `stage="gpu"`. `delay_s` adds a fixed duration to every verification, for benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import ray

from rlsched.policy.timeouts import TimeoutParams
from verifiers.loading import VerifierSet, VerifierSpecError
from verifiers.protocol import (
    UNIT_REWARDS,
    ExecutionFault,
    FaultKind,
    Outcome,
    Prepared,
    RewardRange,
    Stage,
    TwoStageVerifier,
    VerifyRequest,
    is_two_stage,
    run_stage,
    run_verifier,
)
from verifiers.sandbox import SandboxPolicy


@dataclass(frozen=True)
class Heartbeat:
    worker_id: str
    node_id: str  # the Ray node it runs on
    pid: int
    sample_id: str | None  # what it is verifying now, if anything
    attempt: int
    elapsed_s: float  # how long it has been at it, on the worker's clock


@ray.remote(max_concurrency=2)
class VerifierWorker:
    def __init__(
        self,
        worker_id: str,
        kind: str = "exact_answer",
        delay_s: float = 0.0,
        sandbox: SandboxPolicy | None = None,
        rewards: RewardRange = UNIT_REWARDS,
        timeouts: TimeoutParams | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.delay_s = delay_s
        self.verifiers = VerifierSet(kind, sandbox, rewards, timeouts)
        self._lock = threading.Lock()
        self._current: tuple[str, int, float] | None = None

    def verify(
        self, request: VerifyRequest, kind: str | None = None, stage: Stage = "whole", payload: bytes = b""
    ) -> tuple[Outcome | Prepared, float, float]:
        """The outcome (or, for a two-stage verifier's CPU stage, what its GPU stage needs) and the
        span (start, end) of the work, on this node's monotonic clock."""
        start = time.monotonic()
        with self._lock:
            self._current = (request.sample_id, request.attempt, start)
        try:
            return self._judge(request, kind, stage, payload), start, time.monotonic()
        finally:
            with self._lock:
                self._current = None

    def _judge(
        self, request: VerifyRequest, kind: str | None, stage: Stage, payload: bytes
    ) -> Outcome | Prepared:
        try:
            verifier = self.verifiers.get(kind)
        except VerifierSpecError as err:
            return ExecutionFault(request.sample_id, FaultKind.INPUT, str(err), request.attempt)
        if self.delay_s:
            time.sleep(self.delay_s)
        rewards = self.verifiers.rewards
        if stage == "whole" or not is_two_stage(verifier):
            return run_verifier(verifier, request, rewards)
        two = cast(TwoStageVerifier, verifier)
        if stage == "cpu":
            return run_stage(verifier, request, lambda: two.prepare(request), rewards)
        return run_stage(verifier, request, lambda: two.run_prepared(request, payload), rewards)

    def heartbeat(self) -> Heartbeat:
        with self._lock:
            current = self._current
        node = ray.get_runtime_context().get_node_id()
        if current is None:
            return Heartbeat(self.worker_id, node, os.getpid(), None, 0, 0.0)
        sample, attempt, start = current
        return Heartbeat(self.worker_id, node, os.getpid(), sample, attempt, time.monotonic() - start)


def _exited(pid: int) -> bool:
    """No such process, or only its zombie (it has exited; its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def _await_exit(pid: int, limit_s: float = 10.0) -> None:
    """Wait until `pid` has exited (after SIGKILL: at once), polling every millisecond."""
    give_up = time.monotonic() + limit_s
    while not _exited(pid) and time.monotonic() < give_up:
        time.sleep(0.001)


@dataclass
class WorkerProcess:
    """The pool's handle on one worker actor and, on the controller's node, its process."""

    handle: Any
    pid: int | None = None  # from its first heartbeat, when it runs on the controller's node
    stopped: bool = False  # a kill was sent

    def kill_here(self) -> None:
        """SIGKILL its process when it runs on the controller's node (a no-op elsewhere, or if gone)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def end(self) -> None:
        """Make sure it is gone on this node before its slot is refilled."""
        if self.pid is not None:
            self.kill_here()
            _await_exit(self.pid)
