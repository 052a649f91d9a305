"""The rollout-instance lifecycle: every state is reachable, every edge in the table works, others raise."""

from __future__ import annotations

import pytest

from rlsched.policy.lifecycle import INSTANCE_TRANSITIONS, IllegalTransition, InstanceState, transition


def test_table_covers_every_state_and_all_reachable_from_requested() -> None:
    assert set(INSTANCE_TRANSITIONS) == set(InstanceState)
    seen, frontier = {InstanceState.REQUESTED}, [InstanceState.REQUESTED]
    while frontier:
        for nxt in INSTANCE_TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(InstanceState)


@pytest.mark.parametrize("src", list(InstanceState))
def test_every_edge_and_every_non_edge(src: InstanceState) -> None:
    for dst in InstanceState:
        if dst in INSTANCE_TRANSITIONS[src]:
            assert transition(src, dst) is dst
        else:
            with pytest.raises(IllegalTransition, match=f"from {src} to {dst}"):
                transition(src, dst)


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
