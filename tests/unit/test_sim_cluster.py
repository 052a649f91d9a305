"""Many jobs on one cluster in virtual time: the admission policy over a trace."""

from __future__ import annotations

from rlsched.policy.admission import AdmissionParams, ClassParams, QueueParams
from rlsched.policy.placement import Node
from rlsched.sim.cluster import ClusterSim, TraceClass, jain, summarise, synthetic_trace

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
    assert alone["unfinished"] == shared["unfinished"] == 0  # every job of the trace finished
    assert shared["allocation"] > alone["allocation"] + 0.15
    assert shared["training_wait_max_s"] <= 6 * 3600  # the class's maximum wait held
    assert shared["training_completion_mean_s"] <= 1.1 * alone["training_completion_mean_s"]


def test_the_same_seed_gives_the_same_run() -> None:
    assert run([TRAIN, BATCH], seed=5) == run([TRAIN, BATCH], seed=5)


def test_jains_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0 and jain([1.0, 0.0]) == 0.5 and jain([0.0, 0.0]) == 1.0
