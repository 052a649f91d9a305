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


def test_a_walltime_overrun_moves_the_reservation_a_grace_period_at_a_time() -> None:
    """One node; a batch job declares 1,000 s and runs 2,500 s. A gang past its 300 s maximum wait
    reserves the node from the job's expected end; while the job overruns, the reservation holds
    for one grace period (600 s), then moves a grace period later each time; the gang starts the
    moment the job really ends. Meanwhile a job that fits beside the reservation starts at once,
    and one that ends before it, but one that would run past it on its capacity waits."""
    node = [Node("g", {"GPU": 8.0, "CPU": 64.0})]
    params = AdmissionParams(
        {
            "training": ClassParams(100, max_wait_s=300, walltime_s=3600),
            "batch": ClassParams(10, min_run_s=10**6, walltime_s=3600),  # never preempted here
        },
        {"q": QueueParams(nominal={"GPU": 16.0, "CPU": 128.0})},  # quota enough: the node is not
        overrun_grace_s=600,
    )

    def job(name: str, cls: str, at: float, gpus: float, cpus: float, wall: float | None) -> PendingJob:
        return PendingJob(name, "q", cls, at, (Gang(({"GPU": gpus, "CPU": cpus},)),), walltime_s=wall)

    trace = [
        TraceJob(job("long", "batch", 0.0, 8, 8, 1000.0), 2500.0),
        TraceJob(job("gang", "training", 10.0, 8, 32, None), 100.0),
        TraceJob(job("beside", "batch", 400.0, 0, 24, None), 5000.0),  # within the 32 CPUs left spare
        TraceJob(job("too-long", "batch", 401.0, 0, 20, 7200.0), 100.0),  # free now, not spare then
        TraceJob(job("short", "batch", 402.0, 0, 20, 500.0), 100.0),  # ends before the reservation
    ]
    sim = ClusterSim(node, params, trace, ["GPU"])
    run = sim.simulate()
    assert [(t, start) for t, j, start in run.reservations if j == "gang"] == [
        (310.0, 1000.0),  # past its bound at 310 s: from the job's expected end
        (1000.0, 1600.0),  # it overran: one grace period more
        (1600.0, 2200.0),
        (2200.0, 2800.0),
    ]
    assert sim.jobs["gang"].first_start == 2500.0  # when "long" really ended
    gang = [(iv.start, iv.end, iv.devices, iv.done) for iv in run.intervals if iv.job == "gang"]
    assert gang == [(2500.0, 2600.0, 8.0, True)]  # what the Gantt strip of `--out` draws
    assert sim.jobs["beside"].first_start == 400.0  # beside the reservation: at once
    assert sim.jobs["short"].first_start == 402.0  # backfilled: it ends before the reservation
    assert sim.jobs["too-long"].first_start == 2600.0  # once the gang is done, not before it


def test_the_head_of_line_scenario_a_reservation_holds_nothing_of_another_queue() -> None:
    """configs/scenarios/head_of_line.yaml (docs/cluster.md): with the gangs' maximum wait, queue b's
    CPU jobs on a node of their own wait exactly as long as without it, and the gangs wait less."""
    from pathlib import Path

    from rlsched.sim.cluster_scenario import load_cluster_scenario, run_cluster_scenario

    scenario = Path(__file__).parents[2] / "configs/scenarios/head_of_line.yaml"
    summary = run_cluster_scenario(load_cluster_scenario(scenario), 1)
    free, bound = summary["results"]["no maximum wait"], summary["results"]["maximum wait 300 s"]
    assert bound["bounds"]["training"] == 300 and free["bounds"]["training"] is None  # the overlay
    for k in ("cpu_wait_mean_s", "cpu_wait_max_s"):
        assert bound[k] == free[k]
    assert bound["training_wait_max_s"] < 0.7 * free["training_wait_max_s"]
