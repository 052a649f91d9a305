"""Lifecycles as state machines: one Enum and one transition table each, and a checked transition.

A rollout instance: REQUESTED -> ALLOCATED -> TRANSFERRING -> LOADING -> CONFIRMING -> READY ->
DRAINING -> RELEASED, and PREEMPTED from any live state. Only READY instances receive requests. Each
new version goes READY -> TRANSFERRING again (pulled over the weight link, `rlsched.rollout.instance`); a
version that fails confirmation is pulled again, and an instance that cannot confirm one, or whose
engine cannot start, is RELEASED without ever serving.

A verifier worker slot: STARTING -> IDLE <-> BUSY; a busy worker that must stop (timeout,
preemption, silence) is STOPPING until its exit is observed, then GONE; one that dies on its own goes
straight to GONE. Only IDLE slots are offered to the dispatch policy.

A verification task: QUEUED -> RUNNING -> SETTLED (its outcome is kept) or HANDED_ON (a two-stage
verifier's CPU stage prepared it for the GPU stage); a run whose worker must be killed is STOPPING
until the exit is observed; a retried fault or a preempted run goes back to QUEUED with attempt + 1.

A job on the cluster: PENDING -> RUNNING -> DONE, PREEMPTED or CANCELLED (see `JOB_TRANSITIONS`).

An iteration: GENERATING (requests out, samples arriving and verified as they come) -> JUDGING
(every sample is in; verifications still run) -> UPDATING -> PUBLISHING -> RELOADING (the
instances take the new version) -> COMMITTED (its record may be written; the next one may start).

A pipelined (`async`) iteration's trainer lane: IDLE -> UPDATING -> PUBLISHING -> IDLE, or
UPDATING -> UPDATED (stepped, its publish waiting for the reload of the version before) -> PUBLISHING.

An agent episode's execution environment: REQUESTED -> PREPARING -> READY <-> BUSY, BUSY -> IDLE
(the model thinks) -> BUSY; IDLE -> PAUSING -> PAUSED -> RESUMING -> READY where pausing pays;
RELEASED from any live state (the episode ended, a rebuild policy let it go with its files kept, a
pre-warm prediction was wrong), FAILED from PREPARING, BUSY or RESUMING, and a failed one is then
RELEASED too: nothing of it outlives the episode.

A weight version: PUBLISHED (held by the weight service) -> CONFIRMED (an instance loaded it and its
checksum matched) -> RETIRED (a newer version put it past the staleness bound: nothing may be
generated with it any more). A version superseded before any instance confirmed it retires directly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class InstanceState(StrEnum):
    REQUESTED = "requested"
    ALLOCATED = "allocated"
    TRANSFERRING = "transferring"
    LOADING = "loading"
    CONFIRMING = "confirming"
    READY = "ready"
    DRAINING = "draining"
    RELEASED = "released"
    PREEMPTED = "preempted"


_S = InstanceState
INSTANCE_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    _S.REQUESTED: frozenset(
        {
            _S.ALLOCATED,  # the scheduler placed it (a Ray actor exists)
            _S.RELEASED,  # the request was withdrawn before placement
        }
    ),
    _S.ALLOCATED: frozenset(
        {
            _S.TRANSFERRING,  # pulls the current version over the weight link (elastic issue)
            _S.LOADING,  # weights handed over in-process (object store)
            _S.PREEMPTED,
            _S.RELEASED,  # its engine could not start (e.g. no vLLM on its node): it never served
        }
    ),
    _S.TRANSFERRING: frozenset(
        {
            _S.LOADING,  # all bytes arrived and their checksums matched
            _S.TRANSFERRING,  # a newer version was published mid-pull: restart at that version
            _S.RELEASED,  # the version cannot be had (not held, the link keeps failing)
            _S.PREEMPTED,
        }
    ),
    _S.LOADING: frozenset(
        {
            _S.CONFIRMING,  # the engine took the tensors
            _S.PREEMPTED,
        }
    ),
    _S.CONFIRMING: frozenset(
        {
            _S.READY,  # the engine's checksum equals the published one
            _S.TRANSFERRING,  # mismatch: pull again
            _S.RELEASED,  # still a mismatch after the last pull: never served
            _S.PREEMPTED,
        }
    ),
    _S.READY: frozenset(
        {
            _S.LOADING,  # a new version is handed over between iterations
            _S.TRANSFERRING,  # a new version must be pulled
            _S.DRAINING,  # asked to leave: finish or save what runs, take nothing new
            _S.PREEMPTED,
        }
    ),
    _S.DRAINING: frozenset(
        {
            _S.RELEASED,  # every request finished or was saved
            _S.PREEMPTED,
        }
    ),
    _S.RELEASED: frozenset(),  # terminal
    _S.PREEMPTED: frozenset({_S.RELEASED}),  # reclaimed; its saved outputs resume elsewhere
}


class Leave(StrEnum):
    """How an instance leaves the fleet."""

    PREEMPTED = "preempted"  # abrupt: the actor is killed; its requests resume elsewhere from saved tokens
    DRAINING = "draining"  # takes nothing new, finishes what it runs, then leaves


class SlotState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    GONE = "gone"


_W = SlotState
SLOT_TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    _W.STARTING: frozenset({_W.IDLE, _W.GONE}),  # answered its first call, or never started
    _W.IDLE: frozenset({_W.BUSY, _W.GONE}),
    _W.BUSY: frozenset(
        {
            _W.IDLE,  # its outcome came back
            _W.STOPPING,  # timed out, preempted or silent: the kill is sent
            _W.GONE,  # its process died on its own, and the failed call was observed
        }
    ),
    _W.STOPPING: frozenset({_W.GONE}),  # the exit was observed: only now may the slot be refilled
    _W.GONE: frozenset(),
}


class VerifyState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    SETTLED = "settled"
    HANDED_ON = "handed_on"


_V = VerifyState
VERIFY_TRANSITIONS: dict[VerifyState, frozenset[VerifyState]] = {
    _V.QUEUED: frozenset({_V.RUNNING}),  # the dispatch policy gave it a worker (and a gang's others)
    _V.RUNNING: frozenset(
        {
            _V.SETTLED,  # a verdict, a fault not to retry, or the worker died with no retries left
            _V.HANDED_ON,  # the CPU stage's Prepared: the GPU stage takes it as a new task
            _V.QUEUED,  # a retryable fault (or its worker died) with retries left: attempt + 1
            _V.STOPPING,  # past its timeout, its worker silent, or preempted: the kill is sent
        }
    ),
    _V.STOPPING: frozenset(
        {
            _V.QUEUED,  # preempted (never counts as a retry), or a timeout with retries left
            _V.SETTLED,  # a timeout or a lost worker with no retries left; or it answered in time
            _V.HANDED_ON,  # it answered with Prepared just before the kill landed
        }
    ),
    _V.SETTLED: frozenset(),  # terminal: a late answer of any attempt changes nothing
    _V.HANDED_ON: frozenset(),  # terminal for this stage
}


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    PREEMPTED = "preempted"  # evicted as a whole, or its driver gone, and nobody brings it back
    CANCELLED = "cancelled"
    FAILED = "failed"  # its driver failed and nobody brings it back
    PARKED = "parked"  # it failed more times than the scheduler requeues (the reason says why)


_J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _J.PENDING: frozenset(
        {
            _J.RUNNING,  # admitted: its gangs placed all at once
            _J.CANCELLED,  # `rlsched cancel`, or its driver gave up waiting
            _J.PARKED,  # its supervised driver failed once too often while it waited
        }
    ),
    _J.RUNNING: frozenset(
        {
            _J.DONE,  # its driver finished
            _J.PREEMPTED,  # its grace period after an eviction ended, or its driver is gone
            _J.CANCELLED,  # cancelled while running: its driver stopped when told
            _J.PENDING,  # a placement group failed, or a supervised job was requeued (preempted, failed)
            _J.FAILED,  # its driver failed, unsupervised
            _J.PARKED,  # its supervised driver failed once too often
        }
    ),
    _J.DONE: frozenset(),
    _J.PREEMPTED: frozenset(),
    _J.CANCELLED: frozenset(),
    _J.FAILED: frozenset(),
    _J.PARKED: frozenset(),
}


class TrainerPhase(StrEnum):
    """The training group's lane in a pipelined (`async`) iteration, beside the generating fleet."""

    IDLE = "idle"
    UPDATING = "updating"
    UPDATED = "updated"  # stepped; its publish waits for the reload of the version before
    PUBLISHING = "publishing"


_T = TrainerPhase
TRAINER_TRANSITIONS: dict[TrainerPhase, frozenset[TrainerPhase]] = {
    _T.IDLE: frozenset({_T.UPDATING}),  # a batch of judged groups waits in the buffer
    _T.UPDATING: frozenset({_T.UPDATED, _T.PUBLISHING}),  # stepped (publishing at once if no reload runs)
    _T.UPDATED: frozenset({_T.PUBLISHING}),  # the previous version's reload finished
    _T.PUBLISHING: frozenset({_T.IDLE}),  # the weight service holds it; the instances reload meanwhile
}


class VersionState(StrEnum):
    PUBLISHED = "published"
    CONFIRMED = "confirmed"
    RETIRED = "retired"


_P = VersionState
VERSION_TRANSITIONS: dict[VersionState, frozenset[VersionState]] = {
    _P.PUBLISHED: frozenset(
        {
            _P.CONFIRMED,  # the first instance loaded it and confirmed its checksum
            _P.RETIRED,  # newer versions put it past the staleness bound before anyone confirmed it
        }
    ),
    _P.CONFIRMED: frozenset({_P.RETIRED}),  # past the staleness bound: no request is routed to it
    _P.RETIRED: frozenset(),  # terminal: an instance still holding it pulls the latest first
}


class EnvState(StrEnum):
    REQUESTED = "requested"
    PREPARING = "preparing"
    READY = "ready"
    BUSY = "busy"
    IDLE = "idle"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    RELEASED = "released"
    FAILED = "failed"


_E = EnvState
ENV_TRANSITIONS: dict[EnvState, frozenset[EnvState]] = {
    _E.REQUESTED: frozenset(
        {
            _E.PREPARING,  # admitted: its memory, CPU and slot reservation fits beside the others
            _E.RELEASED,  # withdrawn before it began (its episode ended, or a pre-warm was cancelled)
        }
    ),
    _E.PREPARING: frozenset(
        {
            _E.READY,  # its workspace is materialized and its process started
            _E.FAILED,  # preparation failed: an execution fault, retried, never a zero reward
            _E.RELEASED,  # cancelled while preparing (a wrong tool-type prediction, the episode ended)
        }
    ),
    _E.READY: frozenset(
        {
            _E.BUSY,  # a tool call runs in it
            _E.RELEASED,  # the episode ended, or its pre-warmed call never came
        }
    ),
    _E.BUSY: frozenset(
        {
            _E.READY,  # the call ended and the tool put its workspace back as prepared
            _E.IDLE,  # the call ended; the model thinks about its observation
            _E.FAILED,  # the call broke the environment (its process died, or a hang was killed)
            _E.RELEASED,  # the episode ended mid-call (a limit): the call is killed
        }
    ),
    _E.IDLE: frozenset(
        {
            _E.BUSY,  # the next tool call of its episode
            _E.PAUSING,  # pausing pays over the expected gap: price x memory x gap > save + restore
            _E.RELEASED,  # released with its files kept outside (rebuild, prewarm), or the episode ended
        }
    ),
    _E.PAUSING: frozenset(
        {
            _E.PAUSED,  # its memory is saved outside; what it held is free
            _E.RELEASED,  # the episode ended while it was saved
        }
    ),
    _E.PAUSED: frozenset(
        {
            _E.RESUMING,  # the next call is expected: restored ahead of it
            _E.RELEASED,  # the episode ended while it was paused
        }
    ),
    _E.RESUMING: frozenset(
        {
            _E.READY,  # restored as it was
            _E.FAILED,  # the restore failed: prepared again, as an execution fault
            _E.RELEASED,  # the episode ended while it was restored
        }
    ),
    _E.RELEASED: frozenset(),  # terminal: its process, workspace and reservation are gone
    _E.FAILED: frozenset({_E.RELEASED}),  # what is left of it is removed
}


class IllegalTransition(ValueError):
    """A lifecycle edge that the table does not allow: a bug in the caller."""


S = TypeVar("S", InstanceState, SlotState, VerifyState, JobState, VersionState, TrainerPhase, EnvState)


def _checked(table: dict[S, frozenset[S]], what: str, current: S, target: S) -> S:
    if target not in table[current]:
        allowed = ", ".join(sorted(table[current])) or "nothing (terminal)"
        raise IllegalTransition(
            f"{what} cannot go from {current} to {target}; from {current} it may go to {allowed}"
        )
    return target


def transition(current: InstanceState, target: InstanceState) -> InstanceState:
    return _checked(INSTANCE_TRANSITIONS, "instance", current, target)


def slot_transition(current: SlotState, target: SlotState) -> SlotState:
    return _checked(SLOT_TRANSITIONS, "verifier slot", current, target)


def verify_transition(current: VerifyState, target: VerifyState) -> VerifyState:
    return _checked(VERIFY_TRANSITIONS, "verification", current, target)


def job_transition(current: JobState, target: JobState) -> JobState:
    return _checked(JOB_TRANSITIONS, "job", current, target)


def version_transition(current: VersionState, target: VersionState) -> VersionState:
    return _checked(VERSION_TRANSITIONS, "weight version", current, target)


def trainer_transition(current: TrainerPhase, target: TrainerPhase) -> TrainerPhase:
    return _checked(TRAINER_TRANSITIONS, "trainer", current, target)


def env_transition(current: EnvState, target: EnvState) -> EnvState:
    return _checked(ENV_TRANSITIONS, "environment", current, target)
