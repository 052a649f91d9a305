"""Elastic rollout instances on a real Ray cluster, as a user runs them (`configs/jobs/elastic.yaml`):
one instance joins during iteration 2 over a slow link, one is reclaimed mid-generation in
iteration 3. Every sample completes exactly once, reclaimed requests resume from their saved tokens,
and no update uses a sample from an inadmissible version. The run records its fleet's core
(`run.record_fleet`), and the simulator, replaying every event the Ray driver fed the core at its
recorded time, makes the same decisions, one for one."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlsched.core.fleet_io import (
    Accepted,
    CutSaved,
    Joined,
    KillInstance,
    Left,
    ReadSaved,
    ReloadDone,
    Route,
    StartInstance,
    StartPull,
)
from rlsched.sim.replay import compare, replay
from rlsched.store.traces import load_trace
from tests.helpers import ROOT, Printed, committed, rlsched, spans, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The job runs as a user runs it; while it runs, `rlsched scale` adds an instance during
    iteration 3 and, once it has joined (the job prints it), removes it again (it drains)."""
    out = tmp_path_factory.mktemp("runs") / "elastic"
    job = subprocess.Popen(
        [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/elastic.yaml", "--out", str(out),
         "--set", "run.record_fleet=true",
         # all four iterations are checked: the default time budget (180 s) would end the run early
         # on a slower CPU (likely the 3 iterations of 4 seen on an AVX2-only machine)
         "--set", "grpo.time_budget_s=1800"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    printed = Printed(job)
    try:
        wait_for(lambda: committed(out) >= 2, "iteration 2 to commit")
        added = rlsched("scale", "elastic", "--add", "1")
        assert added.returncode == 0, added.stderr
        printed.wait_for_line(r"^scaled-1 joined at v", "scaled-1 to be READY", timeout_s=120)
        removed = rlsched("scale", "elastic", "--remove", "scaled-1")
        assert removed.returncode == 0, removed.stderr
        stdout, stderr = printed.finish(timeout_s=600)
    finally:
        job.kill()
    assert job.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), out


def test_the_joiner_pulls_over_its_slow_link_and_serves_mid_iteration(elastic_run) -> None:
    proc, out = elastic_run
    line = next(x for x in proc.stdout.splitlines() if x.startswith("transient-1 joined"))
    transfer_s = float(re.search(r"transfer ([0-9.]+) s", line).group(1))
    assert transfer_s >= 2.0 and "load" in line and "confirm" in line  # the breakdown is printed
    assert re.search(r", from (rollout-0|transient-0)", line)  # weights.relay: a peer that holds it fed it
    ev = spans(out)
    (join,) = [e for e in ev if e["cat"] == "join" and e["name"] == "join transient-1"]
    assert join["args"]["iteration"] == 2
    served = [e for e in ev if e["cat"] == "generate" and e["args"]["lane"] == "transient-1"]
    assert any(e["args"]["iteration"] == 2 for e in served)  # it did not wait for the next update
    first_served = min(e["ts"] + e["dur"] for e in served)
    assert first_served > join["ts"] + join["dur"]  # only after it was READY


def test_every_sample_completes_exactly_once_at_an_admissible_version(elastic_run) -> None:
    _, out = elastic_run
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    gen = [e for e in spans(out) if e["cat"] == "generate"]
    for r in rows:
        assert r["samples"] == r["used"] == 64 * 4 and r["stale_dropped"] == 0
        assert r["extra"]["sample_versions"] == [r["version"]]  # max_staleness 0
        ids = Counter(e["name"] for e in gen if e["args"]["iteration"] == r["iteration"])
        assert len(ids) == 256 and set(ids.values()) == {1}
        assert {e["args"]["version"] for e in gen if e["args"]["iteration"] == r["iteration"]} == {
            r["version"]
        }
    assert rows[-1]["extra"]["fleet"]["duplicates_dropped"] == 0
    with sqlite3.connect(out / "partial.sqlite") as db:  # every completed sample's chunks cleared
        assert db.execute("SELECT COUNT(*) FROM tasks").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM chunks").fetchone() == (0,)


def test_the_reclaimed_instances_requests_resume_from_their_saved_tokens(elastic_run) -> None:
    proc, out = elastic_run
    assert "transient-0 preempted" in proc.stdout
    ev = spans(out)
    (pre,) = [e for e in ev if e["cat"] == "preempt"]
    assert pre["args"]["iteration"] == 3 and pre["args"]["requeued"] > 0
    resumed = [e for e in ev if e["cat"] == "resume"]
    # each requeued request resumes from what was saved of it, or restarts from zero when nothing
    # was (reclaimed within one store flush of its dispatch, or its group cut back to 0): a resume
    # span for each that continued, and every one of them accounted for
    fleet = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]["extra"]["fleet"]
    assert fleet["resumed"] + fleet["restarted"] == pre["args"]["requeued"]
    assert len(resumed) <= fleet["resumed"]
    gen3 = {
        e["name"].removeprefix("generate "): e
        for e in ev
        if e["cat"] == "generate" and e["args"]["iteration"] == 3
    }
    for r in resumed:
        a = r["args"]
        assert a["from"] == "transient-0" and a["choice"] == "resume"
        assert 0 < a["resumed_from"] <= a["saved"] < a["final_tokens"] == 80
        sample = gen3[r["name"].removeprefix("resume ")]
        assert (
            sample["args"]["lane"] != "transient-0" and sample["args"]["resumed_tokens"] == a["resumed_from"]
        )
        assert a["logprob_drift"] < 1e-3  # same version: the saved log-probs are what the engine recomputes
    groups = Counter(r["name"].removeprefix("resume ").rsplit("-", 1)[0] for r in resumed)
    for g in groups:  # a group's interrupted members continue from one common length
        assert len({r["args"]["resumed_from"] for r in resumed if r["name"].startswith(f"resume {g}-")}) == 1


def test_rlsched_scale_adds_an_instance_that_joins_serves_and_drains(elastic_run) -> None:
    proc, out = elastic_run
    assert "scale: scaled-1 allocated" in proc.stdout
    assert re.search(r"scaled-1 joined at v\d+: transfer", proc.stdout)
    assert "scaled-1 draining (rlsched scale)" in proc.stdout
    served = [e for e in spans(out) if e["cat"] == "generate" and e["args"]["lane"] == "scaled-1"]
    assert served  # it took work between joining and draining
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["extra"]["fleet"]["drained"] == 1 and "scaled-1" not in rows[-1]["extra"]["serving"]


def test_scaling_or_finishing_a_job_that_is_not_running_is_a_clear_error(elastic_run) -> None:
    for command in ("scale", "finish"):
        proc = rlsched(command, "no-such-job")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "no Ray cluster" in proc.stderr or "no running job named 'no-such-job'" in proc.stderr


def test_the_recorded_run_replayed_in_virtual_time_makes_the_same_decisions(elastic_run) -> None:
    """The fleet's core, driven by Ray in the `rlsched run` process and replayed by the simulator: the
    same effects for every event, and the run went through joins over the link, a reclaim whose
    requests resumed, reloads after each update and the scaled instance's drain."""
    _, out = elastic_run
    trace = load_trace(out / "fleet_trace.pkl")
    replayed = replay(trace)
    assert compare(trace, replayed) == []
    assert replayed.events == len(trace.steps)
    kinds = {type(e) for _, effects in trace.steps for e in effects}
    wanted = {StartInstance, StartPull, Joined, Route, Accepted, KillInstance, ReadSaved, CutSaved, Left}
    wanted.add(ReloadDone)
    assert wanted <= kinds, wanted - kinds
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    counts = rows[-1]["extra"]["fleet"]
    assert counts["preempted"] >= 1 and counts["resumed"] + counts["restarted"] >= 1 and counts["joined"] >= 3
