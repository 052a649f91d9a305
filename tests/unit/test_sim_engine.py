"""The event core: order by (time, priority, seq), cancellation, the clock protocol, determinism."""

from __future__ import annotations

import pytest

from rlsched.sim.engine import Simulator


def test_events_run_by_time_then_priority_then_schedule_order() -> None:
    sim = Simulator(seed=0)
    seen: list[str] = []
    sim.at(2.0, lambda: seen.append("t2"))
    sim.at(1.0, lambda: seen.append("t1-late"), priority=5)
    sim.at(1.0, lambda: seen.append("t1-a"))
    sim.at(1.0, lambda: seen.append("t1-b"))
    sim.at(0.5, lambda: sim.after(0.5, lambda: seen.append("t1-scheduled-later")))
    assert sim.run() == 6
    assert seen == ["t1-a", "t1-b", "t1-scheduled-later", "t1-late", "t2"]
    assert sim.clock() == 2.0


def test_cancel_until_and_bad_times() -> None:
    sim = Simulator(seed=0)
    seen: list[int] = []
    handle = sim.at(1.0, lambda: seen.append(1))
    sim.at(3.0, lambda: seen.append(3))
    handle.cancel()
    assert sim.run(until=2.0) == 0 and sim.now == 2.0 and sim.pending == 1
    sim.run()
    assert seen == [3]
    with pytest.raises(ValueError, match="before now"):
        sim.at(1.0, lambda: None)
    with pytest.raises(ValueError, match="non-negative"):
        sim.after(-1.0, lambda: None)


def _toy_run(seed: int) -> list[str]:
    """Jobs with random service times on two servers: a decision per dispatch."""
    sim = Simulator(seed)
    free = ["s0", "s1"]
    queue: list[int] = []

    def dispatch() -> None:
        while free and queue:
            job, server = queue.pop(0), free.pop(0)
            service = float(sim.rng.exponential(1.0))
            sim.record(f"job {job} -> {server} for {service:.6f}")
            sim.after(service, lambda s=server: (free.append(s), dispatch()))

    for job in range(200):
        sim.at(float(sim.rng.uniform(0, 50)), lambda j=job: (queue.append(j), dispatch()))
    sim.run()
    return sim.decisions


def test_same_seed_same_decision_log_byte_for_byte() -> None:
    a, b = _toy_run(7), _toy_run(7)
    assert "\n".join(a).encode() == "\n".join(b).encode() and len(a) == 200
    assert _toy_run(8) != a
