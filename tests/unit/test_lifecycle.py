"""Every lifecycle table: every state is reachable from the first, every edge works, others raise."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import pytest

from rlsched.policy.lifecycle import (
    ENV_TRANSITIONS,
    INSTANCE_TRANSITIONS,
    JOB_TRANSITIONS,
    SLOT_TRANSITIONS,
    TRAINER_TRANSITIONS,
    VERIFY_TRANSITIONS,
    VERSION_TRANSITIONS,
    EnvState,
    IllegalTransition,
    InstanceState,
    JobState,
    SlotState,
    TrainerPhase,
    VerifyState,
    VersionState,
    env_transition,
    job_transition,
    slot_transition,
    trainer_transition,
    transition,
    verify_transition,
    version_transition,
)

TABLES: list[tuple[type[StrEnum], dict[Any, frozenset[Any]], Callable[[Any, Any], Any]]] = [
    (InstanceState, INSTANCE_TRANSITIONS, transition),
    (SlotState, SLOT_TRANSITIONS, slot_transition),
    (VerifyState, VERIFY_TRANSITIONS, verify_transition),
    (JobState, JOB_TRANSITIONS, job_transition),
    (VersionState, VERSION_TRANSITIONS, version_transition),
    (TrainerPhase, TRAINER_TRANSITIONS, trainer_transition),
    (EnvState, ENV_TRANSITIONS, env_transition),
]


@pytest.mark.parametrize(("states", "table", "_move"), TABLES, ids=lambda t: getattr(t, "__name__", ""))
def test_table_covers_every_state_and_all_reachable_from_the_first(
    states: type[StrEnum], table: dict[Any, frozenset[Any]], _move: object
) -> None:
    assert set(table) == set(states)
    first = next(iter(states))
    seen, frontier = {first}, [first]
    while frontier:
        for nxt in table[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(states)


@pytest.mark.parametrize(
    ("src", "table", "move"),
    [pytest.param(s, t, m, id=f"{type(s).__name__}.{s.name}") for states, t, m in TABLES for s in states],
)
def test_every_edge_and_every_non_edge(
    src: StrEnum, table: dict[Any, frozenset[Any]], move: Callable[[Any, Any], Any]
) -> None:
    for dst in type(src):
        if dst in table[src]:
            assert move(src, dst) is dst
        else:
            with pytest.raises(IllegalTransition, match=f"from {src} to {dst}"):
                move(src, dst)


def test_the_object_store_path() -> None:
    s = InstanceState.REQUESTED
    for nxt in (
        "allocated",
        "loading",
        "confirming",
        "ready",
        "loading",
        "confirming",
        "ready",
        "draining",
        "released",
    ):
        s = transition(s, InstanceState(nxt))
    assert s is InstanceState.RELEASED


@pytest.mark.parametrize(
    "path",
    [
        "requested preparing ready busy idle busy idle released",  # resident
        "requested preparing ready busy idle pausing paused resuming ready busy idle released",  # paused
        "requested preparing ready busy ready busy idle released",  # reset after a call
        "requested preparing released",  # a wrong pre-warm, cancelled at once
        "requested preparing failed released",  # a failed preparation: a fault, and nothing left
        "requested preparing ready busy failed released",  # a call that broke its environment
        "requested preparing ready busy idle pausing paused resuming failed released",
    ],
)
def test_the_environment_paths_the_policies_take(path: str) -> None:
    states = [EnvState(s) for s in path.split()]
    current = states[0]
    for nxt in states[1:]:
        current = env_transition(current, nxt)
    assert current is EnvState.RELEASED and not ENV_TRANSITIONS[current]
