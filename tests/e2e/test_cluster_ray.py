"""Many jobs on one multi-node Ray cluster under the cluster scheduler (`actors/cluster.py`).

Three Ray nodes on this machine (`ray.cluster_utils.Cluster`): a head, a node with two H100s and a
node with two A100s (custom resources; labels name them). The scheduler starts with
`rlsched admin start configs/admin/lab.yaml`; an RL job (`configs/jobs/shared.yaml`, low priority)
runs with `rlsched run --queue research --priority low`: its STRICT_PACK training gang lands on the
H100 node, its elastic rollout instance on the A100 node. A high-priority job that needs an A100
preempts that elastic instance, whose requests resume elsewhere from their saved tokens; when the
high-priority job ends, the instance is granted again, joins and serves. Jobs that cannot be placed
wait with their real blocker in `rlsched queue`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any, cast

import pytest

from tests.helpers import ROOT, rlsched, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from actors.cluster import NAMESPACE, JobSpec
    from actors.cluster_client import find_scheduler
    from actors.scale import inbox_name
    from rlsched.policy.placement import Gang, Strategy

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "labels": {"rlsched/name": "head"}}
    )
    cluster.add_node(num_cpus=4, resources={"H100": 2}, labels={"rlsched/name": "h100-node"})
    cluster.add_node(num_cpus=4, resources={"A100": 2}, labels={"rlsched/name": "a100-node"})
    address = cluster.address
    out = tmp_path_factory.mktemp("runs") / "shared"
    job: subprocess.Popen[str] | None = None
    seen: dict[str, Any] = {"address": address, "out": out}
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        started = rlsched("admin", "start", "configs/admin/lab.yaml", "--address", address)
        assert started.returncode == 0, started.stderr
        scheduler = find_scheduler()
        ray.get(scheduler.record.remote())  # every event and decision, for the replay below
        run = [
            "run",
            "configs/jobs/shared.yaml",
            "--address",
            address,
            "--out",
            str(out),
            "--set",
            "grpo.steps=4",
        ]
        job = subprocess.Popen(
            [sys.executable, "-m", "rlsched.cli", *run, "--queue", "research", "--priority", "low"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        )  # fmt: skip

        def fleet() -> dict[str, Any]:
            """The job's fleet as `rlsched scale shared --json` shows it, asked from this driver: the
            command, polled, took most of a core from the job (a Ray driver connecting each time)."""
            try:
                inbox = ray.get_actor(inbox_name("shared"), namespace=NAMESPACE)
            except ValueError:  # the job has not opened its inbox yet
                return {}
            return cast(dict[str, Any], ray.get(inbox.status.remote(), timeout=30)).get("instances", {})

        def status() -> dict[str, Any]:
            return ray.get(scheduler.status.remote())

        wait_for(lambda: fleet().get("elastic-0", {}).get("state") == "ready", "elastic-0 to serve")
        shown = rlsched("scale", "shared", "--json", "--address", address)  # what a user sees
        seen["scale_shown"] = json.loads(shown.stdout or "{}").get("instances", {})
        seen["status_before"] = status()
        seen["nodes"] = {n["Labels"].get("rlsched/name"): n["NodeID"] for n in ray.nodes() if n["Alive"]}
        # jobs that cannot start now, each for its own reason
        blocked = [
            JobSpec("needs-b200", "research", "low", (Gang(({"B200": 1.0, "CPU": 1.0},)),)),
            JobSpec("needs-h100", "research", "low", (Gang(({"H100": 1.0, "CPU": 1.0},)),)),
            JobSpec("needs-3-cpus", "research", "low", (Gang(({"CPU": 3.0},), Strategy.STRICT_PACK),)),
        ]
        for spec in blocked:
            assert ray.get(scheduler.submit.remote(spec)) == ""
        # a high-priority evaluation job that needs an A100: only the elastic instance can make room
        evaluation = JobSpec("eval", "research", "high", (Gang(({"A100": 1.0, "CPU": 1.0},)),))
        asked = time.monotonic()
        assert ray.get(scheduler.submit.remote(evaluation)) == ""
        view = wait_for(
            lambda: (v := ray.get(scheduler.poll.remote("eval")))["state"] == "running" and v, "eval to start"
        )
        seen["eval_wait_s"] = time.monotonic() - asked
        print(f"eval admitted {seen['eval_wait_s']:.1f} s after it asked (grace 10 s)")
        (pg,) = view["gangs"]
        seen["eval_nodes"] = set(ray.util.placement_group_table(pg)["bundles_to_node_id"].values())
        seen["queue"] = rlsched("queue", "--address", address)
        seen["status_during"] = status()
        time.sleep(3.0)  # the evaluation "runs"
        ray.get(scheduler.finished.remote("eval"))
        wait_for(lambda: fleet().get("elastic-1", {}).get("state") == "ready", "elastic-1 to serve again")
        for spec in blocked:
            assert ray.get(scheduler.cancel.remote(spec.name)) == ""
        stdout, _ = job.communicate(timeout=600)
        seen["stdout"], seen["rc"] = stdout, job.returncode
        seen["status_after"] = status()
        seen["trace"] = ray.get(scheduler.trace.remote())
        stopped = rlsched("admin", "stop", "--address", address)
        assert stopped.returncode == 0, stopped.stderr
        seen["pgs_left"] = [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            seen["stdout"] = job.communicate()[0]
        ray.shutdown()
        cluster.shutdown()
    assert seen["rc"] == 0, seen["stdout"][-4000:]
    return seen


def test_the_strict_pack_gang_lands_on_one_node_of_the_right_type(shared: dict[str, Any]) -> None:
    job = shared["status_before"]["jobs"]["shared"]
    assert job["state"] == "running" and job["queue"] == "research" and job["priority"] == "low"
    assert job["elastic"] == {"elastic-0": "a100-node"}
    # the training gang (2 x H100) and the workers' gang (an A100 instance and a verifier worker)
    assert set(job["nodes"]) <= {"h100-node", "a100-node", "head"} and "h100-node" in job["nodes"]
    assert "registered with the cluster scheduler as shared" in shared["stdout"]
    assert shared["scale_shown"]["elastic-0"]["state"] == "ready"  # `rlsched scale --json --address`


def test_a_high_priority_job_takes_the_elastic_instance_which_resumes_when_room_returns(
    shared: dict[str, Any],
) -> None:
    assert shared["eval_nodes"] == {shared["nodes"]["a100-node"]}
    assert shared["eval_wait_s"] < 10.0 + 5.0  # within the low class's 10 s grace (plus cycles)
    out = shared["stdout"]
    m = re.search(
        r"elastic-0 preempted \(the cluster scheduler reclaims it for eval: .*\): (\d+) request", out
    )
    assert m, out[-3000:]
    requeued = int(m.group(1))
    assert "elastic-1 granted by the cluster scheduler" in out
    assert re.search(r"elastic-1 joined at v\d+: transfer", out)
    trace = json.loads((shared["out"] / "timeline.json").read_text())
    ev = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    resumed = [e for e in ev if e["cat"] == "resume"]
    # one reclaimed within a store flush of its dispatch has nothing saved and restarts from zero,
    # without a resume span: at most one span per requeued request
    assert len(resumed) <= requeued
    for r in resumed:  # from the tokens elastic-0 had saved, not from scratch
        assert r["args"]["from"] == "elastic-0" and 0 < r["args"]["resumed_from"] <= r["args"]["saved"]
    assert any(e["cat"] == "generate" and e["args"]["lane"] == "elastic-1" for e in ev)  # it served
    rows = [json.loads(x) for x in (shared["out"] / "metrics.jsonl").read_text().splitlines()]
    assert all(r["samples"] == r["used"] == 128 for r in rows) and len(rows) == 4
    assert rows[-1]["extra"]["fleet"]["duplicates_dropped"] == 0


def test_rlsched_queue_names_the_real_blocker(shared: dict[str, Any]) -> None:
    q = shared["queue"]
    assert q.returncode == 0, q.stderr
    text = " ".join(q.stdout.split())
    assert "needs-b200" in text and "no node has B200 (the cluster has: A100, CPU, H100)" in text
    assert "needs-h100 queue research low" in text and "over its nominal quota of 2 H100" in text
    assert "needs 3 CPU on one node; h100-node has only 2 free CPU; head has only 2 free CPU" in text
    during = shared["status_during"]["jobs"]
    assert during["eval"]["state"] == "running" and during["eval"]["nodes"] == ["a100-node"]


def test_everything_is_released_at_the_end(shared: dict[str, Any]) -> None:
    after = shared["status_after"]["jobs"]
    assert after["shared"]["state"] == "done" and after["eval"]["state"] == "done"
    assert {after[j]["state"] for j in ("needs-b200", "needs-h100", "needs-3-cpus")} == {"cancelled"}
    assert shared["pgs_left"] == []


def test_the_schedulers_recorded_run_replayed_in_virtual_time_makes_the_same_decisions(
    shared: dict[str, Any],
) -> None:
    """Every event the Ray scheduler fed its core (submissions, polls' answers, cycles with the
    inventory it saw, finishes), replayed through the simulator, gives the same effects."""
    from rlsched.core.cluster_io import CreatePlacementGroup, JobEnded, RemovePlacementGroup
    from rlsched.sim.replay import compare, replay

    trace = shared["trace"]
    replayed = replay(trace)
    assert compare(trace, replayed) == []
    kinds = {type(e) for _, effects in trace.steps for e in effects}
    assert {CreatePlacementGroup, RemovePlacementGroup, JobEnded} <= kinds
    print(f"cluster trace: {replayed.events} events, {replayed.effects} effects, all equal on replay")
