"""Reservations with backfill (`rlsched.policy.reservation`): a job past its maximum wait holds only
what it needs from when it will have it; the rest of the cluster carries on around it."""

from __future__ import annotations

from rlsched.policy.admission import admit
from rlsched.policy.cluster_model import (
    AdmissionParams,
    Admit,
    ClassParams,
    ClusterSnapshot,
    PendingJob,
    QueueParams,
    RunningJob,
    Wait,
)
from rlsched.policy.placement import Gang, Node, Strategy
from rlsched.policy.reservation import expected_end

CLASSES = {"training": ClassParams(100, grace_s=30, min_run_s=600, max_wait_s=300, walltime_s=7200)}
NODES = (
    Node("g1", {"GPU": 8, "CPU": 32}),
    Node("g2", {"GPU": 8, "CPU": 32}),
    Node("c1", {"CPU": 64}),
)
P = AdmissionParams(
    CLASSES,
    {"a": QueueParams(nominal={"GPU": 32, "CPU": 96}), "b": QueueParams(nominal={"CPU": 64})},
    overrun_grace_s=600,
)


def gpus(n: float, bundles: int = 1) -> tuple[Gang, ...]:
    return (Gang(tuple({"GPU": n, "CPU": 4} for _ in range(bundles)), Strategy.STRICT_SPREAD),)


def running(name: str, node: str, n: float, started: float, wall: float) -> RunningJob:
    return RunningJob(name, "a", "training", started, ((node, {"GPU": n, "CPU": 4}),), walltime_s=wall)


# a's 16-GPU gang has waited past its 300 s bound; the same class runs on both GPU nodes (nothing to
# preempt: equal priority, within its minimum run time); b has a CPU node of its own
BUSY = (running("r1", "g1", 8, 3000, 7000), running("r2", "g2", 4, 3000, 2000))
BIG = PendingJob("a/big", "a", "training", 0.0, gpus(8, 2))
NOW = 3500.0


def decide(*pending: PendingJob, run: tuple[RunningJob, ...] = BUSY, now: float = NOW) -> dict[str, object]:
    return {d.job: d for d in admit(ClusterSnapshot(NODES, run, pending), now, P)}


def test_a_starving_gang_reserves_what_it_needs_and_another_queue_is_not_held() -> None:
    cpu = PendingJob("b/cpu", "b", "training", 3400.0, (Gang(({"CPU": 16},)),))
    got = decide(BIG, cpu)
    big = got["a/big"]
    assert isinstance(big, Wait) and big.reserved_from == 10000.0  # when r1, the later of the two, ends
    assert "g1, g2 reserved for it from 6,500 s from now, when r1 is expected to end" in big.reason
    assert isinstance(got["b/cpu"], Admit)  # before reservations: "a job past its maximum wait goes first"


def test_a_job_that_ends_before_the_reservation_backfills_and_a_longer_one_waits_saying_why() -> None:
    long = PendingJob("a/long", "a", "training", 3400.0, gpus(4), walltime_s=36000)
    short = PendingJob("a/short", "a", "training", 3401.0, gpus(4), walltime_s=3600)
    got = decide(BIG, short, long)
    assert isinstance(got["a/short"], Admit) and got["a/short"].placements[0].nodes == ("g2",)
    assert isinstance(got["a/long"], Wait)
    assert "run past the start of a/big's reservation (in 6,500 s)" in got["a/long"].reason
    assert "with a walltime under 6,500 s it could start now" in got["a/long"].reason


def test_a_job_beside_the_reservation_starts_whatever_its_walltime() -> None:
    # the gang needs 4 of each GPU node's 32 CPUs: a CPU-only job that runs past the reservation's
    # start fits beside it on what will still be spare then
    beside = PendingJob("a/cpu", "a", "training", 3400.0, (Gang(({"CPU": 24},), Strategy.STRICT_PACK),))
    only_gpus = NODES[:2]
    got = {d.job: d for d in admit(ClusterSnapshot(only_gpus, BUSY, (BIG, beside)), NOW, P)}
    assert isinstance(got["a/big"], Wait) and got["a/big"].reserved_from == 10000.0
    assert isinstance(got["a/cpu"], Admit)


def test_an_overrun_keeps_the_start_for_a_grace_period_then_moves_it_a_grace_period_at_a_time() -> None:
    assert expected_end(0.0, 1000.0, 900.0, 600.0) == 1000.0
    assert expected_end(0.0, 1000.0, 1300.0, 600.0) == 1600.0  # overran: one grace period more
    assert expected_end(0.0, 1000.0, 1000.0, 600.0) == 1600.0  # still running at its end
    assert expected_end(0.0, 1000.0, 1600.0, 600.0) == 2200.0  # ran past that too: it moves again
    run = (running("r1", "g1", 8, 0.0, 1000.0), running("r2", "g2", 8, 0.0, 1000.0))
    for now, start in ((900.0, 1000.0), (1300.0, 1600.0), (1700.0, 2200.0)):
        big = decide(BIG, run=run, now=now)["a/big"]
        assert isinstance(big, Wait) and big.reserved_from == start, (now, big)


def test_reservations_of_two_starving_jobs_do_not_overlap() -> None:
    other = PendingJob("a/other", "a", "training", 1.0, gpus(8, 2))
    got = decide(BIG, other)
    first, second = got["a/big"], got["a/other"]
    assert isinstance(first, Wait) and isinstance(second, Wait)
    assert first.reserved_from == 10000.0
    assert second.reserved_from == 10000.0 + 7200.0  # after the first, by its class's walltime
