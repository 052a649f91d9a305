"""Many jobs on one cluster in virtual time: the admission policy over a trace."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.cluster_model import AdmissionParams, ClassParams, PendingJob, QueueParams
from rlsched.policy.placement import Gang, Node, Strategy
from rlsched.sim.cluster import ClusterSim, TraceClass, TraceJob, jain, summarise, synthetic_trace

NODES = [Node(f"n{i}", {"GPU": 8.0, "CPU": 64.0}) for i in range(8)]
PARAMS = AdmissionParams(
    {
        "training": ClassParams(100, grace_s=60, min_run_s=1800, max_wait_s=6 * 3600),
        "batch": ClassParams(10, grace_s=30),
    },
    {
        "train": QueueParams(cohort="c", nominal={"GPU": 64.0, "CPU": 512.0}),
        "spot": QueueParams(cohort="c", nominal={}),
    },
)
TRAIN = TraceClass("training", "train", rate_per_h=0.6, devices=(8, 16, 32), mean_work_s=3 * 3600, sigma=0.8)
BATCH = TraceClass("batch", "spot", rate_per_h=40, devices=(1, 2, 4), mean_work_s=1800)


def run(classes: list[TraceClass], seed: int = 3) -> dict[str, float]:
    return summarise(
        ClusterSim(NODES, PARAMS, synthetic_trace(classes, hours=12, seed=seed), ["GPU"]).simulate()
    )


def test_preemptible_borrowers_fill_idle_devices_without_starving_the_gangs() -> None:
    alone, shared = run([TRAIN]), run([TRAIN, BATCH])
    assert alone["unfinished"] == alone["preemptions"] == 0  # every job of the trace finished
    # a borrower evicted for a gang ends, as on the runtime (requeueing is the durability work's)
    assert shared["unfinished"] == shared["preemptions"] > 0
    assert shared["allocation"] > alone["allocation"] + 0.15
    assert shared["training_wait_max_s"] <= 6 * 3600  # the class's maximum wait held
    assert shared["training_completion_mean_s"] <= 1.1 * alone["training_completion_mean_s"]


def test_the_same_seed_gives_the_same_run() -> None:
    assert run([TRAIN, BATCH], seed=5) == run([TRAIN, BATCH], seed=5)


def test_jains_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0 and jain([1.0, 0.0]) == 0.5 and jain([0.0, 0.0]) == 1.0


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Node], AdmissionParams, list[TraceJob]]:
    nodes = [Node(f"n{i}", {"GPU": 8.0, "CPU": 32.0}) for i in range(draw(st.integers(1, 4)))]
    gpus = 8.0 * len(nodes)
    split = draw(st.integers(0, 4)) / 4
    queues = {
        "a": QueueParams(cohort="c", nominal={"GPU": gpus * split, "CPU": 32.0 * len(nodes) * split}),
        "b": QueueParams(
            cohort="c", nominal={"GPU": gpus * (1 - split), "CPU": 32.0 * len(nodes) * (1 - split)}
        ),
        "spot": QueueParams(cohort="c", nominal={}),
    }
    classes = {
        "high": ClassParams(100, grace_s=draw(st.sampled_from([0.0, 30.0])), min_run_s=60, max_wait_s=3600),
        "low": ClassParams(10, grace_s=30, min_run_s=draw(st.sampled_from([0.0, 300.0]))),
    }
    jobs = []
    for i in range(draw(st.integers(1, 12))):
        strategy = draw(st.sampled_from(list(Strategy)))
        most = {Strategy.STRICT_PACK: 2, Strategy.STRICT_SPREAD: len(nodes)}.get(strategy, 2 * len(nodes))
        n = draw(st.integers(1, most))  # bundles of 4 GPUs that the empty cluster can place
        gang = Gang(tuple({"GPU": 4.0, "CPU": 4.0} for _ in range(n)), strategy)
        job = PendingJob(
            f"j{i}", draw(st.sampled_from(["a", "b", "spot"])), draw(st.sampled_from(["high", "low"])),
            float(draw(st.integers(0, 7200))), (gang,),
        )  # fmt: skip
        jobs.append(TraceJob(job, float(draw(st.integers(60, 7200))), save_every_s=300.0))
    return nodes, AdmissionParams(classes, queues), sorted(jobs, key=lambda t: t.job.submitted)


@settings(max_examples=150, deadline=None)
@given(traces())
def test_every_trace_ends_with_every_job_done_or_preempted_once_and_no_churn(world: tuple) -> None:
    """Random clusters and traces in which every job fits the empty cluster: the simulation stops by
    itself (no endless cycle of evictions) and every job finishes, or ends once evicted."""
    nodes, params, trace = world
    sim = ClusterSim(nodes, params, trace, ["GPU"])
    sim.sim.run(max_events=200 * len(trace))
    assert sim.sim.pending == 0, "still evicting and admitting after 200 events per job"
    ended = sum(j.preempted for j in sim.jobs.values())  # an evicted job ends, once
    assert all(j.preempted <= 1 for j in sim.jobs.values())
    assert sim.simulate().unfinished == ended


def test_capacity_a_queue_reclaims_goes_to_it_not_back_to_the_borrower() -> None:
    """Queue b reclaims 4 of its 8 nominal GPUs from a borrower of queue a (higher priority); once the
    borrower is gone, b's job starts: the borrower does not take the capacity back (it would be
    evicted again at every reclaim and never finish, as before nominal-quota jobs were ordered first)."""
    nodes = [Node("n0", {"GPU": 8.0, "CPU": 32.0})]
    params = AdmissionParams(
        {"high": ClassParams(100, grace_s=0.0, min_run_s=60), "low": ClassParams(10, grace_s=30)},
        {
            "a": QueueParams(cohort="c", nominal={"GPU": 0.0, "CPU": 0.0}),
            "b": QueueParams(cohort="c", nominal={"GPU": 8.0, "CPU": 32.0}),
        },
    )
    one = Gang(({"GPU": 4.0, "CPU": 4.0},))
    spec = [("a0", "a", "high", 0.0, 600.0), ("a1", "a", "high", 0.0, 601.0), ("b0", "b", "low", 10.0, 60.0)]
    trace = [TraceJob(PendingJob(n, q, c, t, (one,)), w, 300.0) for n, q, c, t, w in spec]
    sim = ClusterSim(nodes, params, trace, ["GPU"])
    sim.sim.run(max_events=1000)  # before, the borrowers took it back and were evicted every 60 s
    assert sim.sim.pending == 0 and sim.simulate().unfinished == 1  # the evicted borrower ended
    assert sorted(j.preempted for j in sim.jobs.values()) == [0, 0, 1]  # one borrower, once
    assert sim.jobs["b0"].first_start == 60.0  # as soon as the borrowers had run their minimum 60 s


def test_an_evicted_elastic_part_comes_back_when_the_preemptor_is_done() -> None:
    nodes = [Node("n0", {"GPU": 8.0, "CPU": 32.0})]
    params = AdmissionParams(
        {"high": ClassParams(100), "low": ClassParams(10, grace_s=5.0)},
        {"q": QueueParams(nominal={"GPU": 8.0, "CPU": 32.0})},
    )
    part = {"GPU": 4.0, "CPU": 1.0}
    low = PendingJob("rl", "q", "low", 0.0, (Gang(({"GPU": 4.0, "CPU": 1.0},)),), elastic=(part,))
    high = PendingJob("eval", "q", "high", 100.0, (Gang(({"GPU": 4.0, "CPU": 1.0},)),))
    sim = ClusterSim(nodes, params, [TraceJob(low, 1000.0), TraceJob(high, 200.0)], ["GPU"])
    run = sim.simulate()
    assert run.preemptions == 1 and run.grown == 1 and run.unfinished == 0
    assert sim.jobs["eval"].first_start == 105.0  # after the part's 5 s grace
    assert sim.jobs["rl"].preempted == 0  # only its elastic part left, and came back
