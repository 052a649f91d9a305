"""The environment core driven on Ray (`rlsched/bench/envs.py`): real sandboxed environments holding memory,
prepared, released and cancelled as each policy says, with the episode's files kept across rebuilds
and nothing left after the run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

from rlsched.bench.envs import EnvDriver, EnvHost, EnvKind, EpisodePlan
from rlsched.core.envs import EnvParams, EnvType
from rlsched.policy.environments import Capacity, EnvPolicy

pytestmark = pytest.mark.ray

KINDS = {
    "search": EnvKind(memory_mb=32, fetch_s=0.2, workspace_mb=1, tool_s=0.05),
    "shell": EnvKind(memory_mb=16, fetch_s=0.1, workspace_mb=1, tool_s=0.05),
}
TYPES = {k: EnvType(memory_gib=v.memory_mb / 1024, prepare_s=0.4) for k, v in KINDS.items()}
PLANS = [
    EpisodePlan("same", ("search", "search", "search"), (0.5, 0.5, 0.5)),
    EpisodePlan("switch", ("shell", "search", "shell"), (0.5, 0.5, 0.5)),
    EpisodePlan("late", ("shell", "shell"), (0.3, 0.3)),
]


@pytest.fixture(scope="module")
def host(ray_session: None) -> Iterator[Any]:
    handle = EnvHost.remote(KINDS)
    # created before any test starts: the actor's registration with the GCS is asynchronous, and
    # under load the isolation check's snapshot (tests/ray/conftest.py) was taken before it, so the
    # module's own host counted as left by the first test
    ray.get(handle.report.remote())
    yield handle
    ray.get(handle.shutdown.remote())
    ray.kill(handle)  # the cluster is shared with the other modules of tests/ray


def drive(host: Any, policy: EnvPolicy) -> Any:
    params = EnvParams(policy, TYPES, Capacity(cores=2, slots=2, memory_gib=8), lead_s=0.4)
    return EnvDriver(params, host, first_turn_s=0.5).run(PLANS)


@pytest.mark.parametrize("policy", list(EnvPolicy))
def test_every_policy_runs_every_episode_and_leaves_nothing(host: Any, policy: EnvPolicy) -> None:
    run = drive(host, policy)
    assert run.episodes == 3 and run.tool_calls == 8 and len(run.waits) == 8
    assert run.peak_envs <= (4 if policy is EnvPolicy.RESIDENT else 2 * 2)  # two episodes at once
    assert run.reserved_gib_s > 0
    # the episode's files: each call appends to its kind's calls.log, kept across rebuilds
    assert [a["calls"] for a in run.answers["same"]] == [1, 2, 3]
    assert [a["calls"] for a in run.answers["switch"]] == [1, 1, 2]
    report = ray.get(host.report.remote())
    assert report["live"] == [] and report["kept_files"] == 0 and report["sandbox_dirs"] == []
    if policy is EnvPolicy.RESIDENT:
        assert run.prepared == 6 and sum(w > 0 for w in run.waits) <= 3  # both kinds for each episode
    if policy is EnvPolicy.REBUILD:
        assert run.prepared == 8 and min(run.waits) > 0.05  # every call waits for its preparation
    if policy is EnvPolicy.PREWARM:
        # "the same kind as last time" is wrong for the switching episode's second and third calls
        assert run.predictions_right == 6 and run.misses == 2


def test_the_cgroups_measure_the_memory_the_environments_hold(host: Any) -> None:
    before = ray.get(host.report.remote())
    if before["measured_gib_s"] is None:
        pytest.skip("no memory cgroup to read on this machine")
    drive(host, EnvPolicy.RESIDENT)
    after = ray.get(host.report.remote())
    assert after["measured_gib_s"] > before["measured_gib_s"]
    assert after["measured_peak_gib"] >= 2 * (32 + 16) / 1024 * 0.8  # two episodes' data, resident
