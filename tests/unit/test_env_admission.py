"""Admission of agent episodes by the resource that binds, Little's law's forecast, and memory-seconds
as admission counts them (SPEC section 9's cluster: 48 cores, 320 model slots, 358 GiB with a 2 GiB
template kept)."""

from __future__ import annotations

import pytest

from rlsched.policy.environments import (
    Admitted,
    Capacity,
    MemoryLedger,
    Pending,
    Reservation,
    admit,
    steady_state,
)

CLUSTER = Capacity(cores=48, slots=320, memory_gib=358, template_gib=2)
EPISODE = Reservation(memory_gib=2, cpu=0.1, slots=0.9)  # a 30 s task: 1 core 10% of it, a slot 90%


def test_littles_law_names_memory_as_the_binding_resource_at_ten_tasks_a_second() -> None:
    s = steady_state(10, 30, EPISODE, CLUSTER)
    assert s.episodes == 300 and s.demand.memory_gib == 600
    assert s.binding == "memory" and s.utilisation["memory"] == pytest.approx(600 / 356)
    assert s.utilisation["cpu"] == pytest.approx(30 / 48) and s.utilisation["slots"] == pytest.approx(
        270 / 320
    )
    assert s.max_rate == pytest.approx(356 / 60)  # 178 environments of 30 s: 5.9 tasks/s


def test_episodes_are_admitted_while_they_fit_then_wait_naming_the_resource() -> None:
    held = Reservation()
    admitted = 0
    while isinstance(
        verdict := admit(EPISODE, held, CLUSTER, steady_state(10, 30, EPISODE, CLUSTER)), Admitted
    ):
        held, admitted = verdict.held, admitted + 1
    assert admitted == 178
    assert isinstance(verdict, Pending) and verdict.resource == "memory"
    assert verdict.reason.startswith("GiB of environment memory: 356 of 356 reserved, the episode needs 2")
    assert "300 episodes would need 600 (169%)" in verdict.reason


def test_the_fullest_short_resource_binds() -> None:
    slots_bound = admit(Reservation(1, 0, 10), Reservation(0, 0, 315), CLUSTER)
    assert isinstance(slots_bound, Pending) and slots_bound.resource == "slots"
    both = admit(Reservation(10, 10, 0), Reservation(350, 47, 0), CLUSTER)
    assert isinstance(both, Pending) and both.resource == "cpu"  # 57/48 is fuller than 360/356


def test_memory_seconds_are_reserved_gib_times_seconds_held() -> None:
    ledger = MemoryLedger()
    ledger.reserve("a", 2, at=0.0)
    ledger.reserve("b", 0.5, at=1.0)
    assert ledger.held_gib() == 2.5 and ledger.peak_gib == 2.5
    assert ledger.release("a", at=30.0) == 60.0
    assert ledger.release("b", at=7.0) == 3.0
    assert ledger.gib_s == 63.0 and ledger.held_gib() == 0
    with pytest.raises(ValueError, match="holds a reservation already"):
        ledger.reserve("c", 1, 0.0) or ledger.reserve("c", 1, 0.0)
