"""Lifecycles as state machines: one Enum and one transition table each, and one `transition()`.

A rollout instance: REQUESTED -> ALLOCATED -> (TRANSFERRING ->) LOADING -> CONFIRMING -> READY ->
DRAINING -> RELEASED, and PREEMPTED from any live state. Only READY instances receive requests. In the
Ray job of today weights arrive through the object store, so ALLOCATED goes straight to LOADING; the
elastic-instance issue adds the gRPC pull through TRANSFERRING.
"""

from __future__ import annotations

from enum import StrEnum


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
        }
    ),
    _S.TRANSFERRING: frozenset(
        {
            _S.LOADING,  # all bytes arrived and their checksums matched
            _S.TRANSFERRING,  # a newer version was published mid-pull: restart at that version
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
            _S.LOADING,  # mismatch: load again
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


class IllegalTransition(ValueError):
    """A lifecycle edge that the table does not allow: a bug in the caller."""


def transition(current: InstanceState, target: InstanceState) -> InstanceState:
    if target not in INSTANCE_TRANSITIONS[current]:
        allowed = ", ".join(sorted(INSTANCE_TRANSITIONS[current])) or "nothing (terminal)"
        raise IllegalTransition(
            f"instance cannot go from {current} to {target}; from {current} it may go to {allowed}"
        )
    return target
