"""Each fault kind once, against the quickstart job (`rlsched.chaos`): the job recovers by itself
(or through `--resume` after the driver's death), every iteration holds each of its requests once,
the weights agree at the end, and the curve is the uninterrupted run's. `scripts/chaos.py` runs the
longer, randomized soak, one fault to a run.

The faults that need no cluster of their own land in turn in one run (`IN_ONE_RUN`): a run for each
cost four job starts more (about 140 s of CI; the driver's SIGKILL alone, a run and its reference's
length besides, 75 s). `trainer_node` (every
rank's process killed, the weight service's host among them) is covered by the whole node's
removal below, which kills the same processes and the node's raylet besides, so the group is
rebuilt on another node; its own trial cost 41 s of CI (it runs in the soak)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rlsched.chaos import (
    GROUP,
    PROMPTS,
    SETS,
    Fault,
    Landing,
    check_run,
    cluster_trial,
    command,
    curve,
    run_faults,
)
from tests.e2e.test_run_ray import ROOT, settled_ray_processes

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 10  # room for four faults in one run, two iterations apart (`IN_ONE_RUN`)
SETS = [*SETS, f"grpo.steps={STEPS}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Any, ...]]:
    import subprocess

    out = tmp_path_factory.mktemp("reference")
    proc = subprocess.run([*command("configs/jobs/quickstart.yaml", SETS), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return curve(out)


# the faults of one run, in turn, each once the one before is recovered from: (fault, the iteration
# committed when it lands, 0.3 s later). One run instead of one each saves four job starts (about
# 140 s of CI); every fault is still recovered from and the run checked whole against the reference.
IN_ONE_RUN = [
    (Fault.SIGTERM, 1),  # a preemption's notice: checkpoint, exit 3, then `--resume` (run 2)
    (Fault.ROLLOUT_INSTANCE, 3),  # a replacement instance; the requests it held generated elsewhere
    (Fault.TRAINER_RANK, 5),  # the group rebuilt from the checkpoint of 4: committed iteration 5 redone
    (Fault.VERIFIER_WORKER, 7),  # a replacement worker; the samples it held judged again
    (Fault.DRIVER, 9),  # SIGKILL mid-iteration 10, then `--resume` (run 3) from the checkpoint of 8
]


def test_each_fault_in_turn_in_one_run_is_recovered_with_nothing_lost_or_used_twice(
    tmp_path: Path, reference: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    landings = [Landing(fault, after, 0.3) for fault, after in IN_ONE_RUN]
    trial = run_faults(command("configs/jobs/quickstart.yaml", SETS), out, landings)
    assert trial.ok, f"{trial.problems}\n{trial.log}"
    for landing in trial.landings:
        assert landing.killed and landing.recovery_s is not None, f"{landing}\n{trial.log}"
    problems = check_run(out, STEPS, PROMPTS * GROUP, reference=reference)
    assert problems == [], f"{problems}\n{trial.log}"
    db = sqlite3.connect(out / "commit.sqlite")
    kinds = [kind for (kind,) in db.execute("SELECT kind FROM events ORDER BY seq")]
    assert kinds.count("resume") == 2 and kinds.count("recovered") == 1, kinds
    rank = trial.landings[2]
    checkpoint = rank.at_kill // 2 * 2  # the kill's iteration runs again from there, and any after it
    redone_in_run_2 = {i for (i,) in db.execute("SELECT iteration FROM redone WHERE redone_by = 2")}
    assert set(range(checkpoint + 1, rank.at_kill + 1)) <= redone_in_run_2, (rank, redone_in_run_2)
    assert_the_driver_kill_redid_only_what_its_checkpoint_lacks(out, db, trial.landings[4], trial.log)
    assert "Traceback" not in trial.log
    assert settled_ray_processes() == []
    print("; ".join(f"{x.fault} after {x.at_kill}: regained in {x.recovery_s:.1f} s" for x in trial.landings))


def assert_the_driver_kill_redid_only_what_its_checkpoint_lacks(
    out: Path, db: sqlite3.Connection, kill: Landing, log: str
) -> None:
    """Killed 0.3 s into iteration 10 (checkpoints every 2): `--resume` (run 3) loads the checkpoint
    of iteration 8, runs 9 again under run 3's sample ids (run 2's record kept in `redone`), and the
    curve is the uninterrupted run's, loss for loss (`check_run`)."""
    resumes = re.findall(r"^resuming .* after iteration (\d+), from ([^;]+)", log, re.MULTILINE)
    assert len(resumes) == 2, log  # the SIGTERM's resume, then the SIGKILL's
    after, source = resumes[-1]
    assert source == f"the checkpoint of iteration {after}", log
    checkpoint = int(after)
    newest = kill.at_kill // 2 * 2  # 8, unless a fast machine passed iteration 10 before the kill
    assert checkpoint in (newest, newest - 2)  # the one before, when the kill landed in the newest's save
    by_run_3 = "SELECT iteration, attempt FROM redone WHERE redone_by = 3 ORDER BY iteration"
    redone = db.execute(by_run_3).fetchall()
    assert redone == [(i, 2) for i in range(checkpoint + 1, kill.at_kill + 1)]  # by the killed run 2
    resumed = db.execute("SELECT sample_id FROM samples WHERE iteration > ?", (checkpoint,)).fetchall()
    assert resumed and {s.rsplit("@", 1)[1] for (s,) in resumed} == {"3"}
    report = json.loads((out / "report.json").read_text())
    assert report["durability"]["commit_fraction_of_iteration"] < 0.02  # the commit alone


def test_a_whole_node_removed_mid_iteration_takes_the_ranks_and_the_job_rebuilds_them_on_another(
    tmp_path: Path, reference: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three Ray nodes (`ray.cluster_utils.Cluster`): the head (the driver, instances, verifiers) and
    two nodes with room for the training gang (`trainer_slot`). The node holding both ranks (rank
    0's weight service with them) is removed as a crash removes it; the job rebuilds the group on
    the other node from its last checkpoint and finishes with the uninterrupted run's curve."""
    monkeypatch.chdir(ROOT)
    trial = cluster_trial(Fault.NODE, tmp_path / "run", 2, 0.3, SETS)
    assert trial.ok, f"{trial.problems}\n{trial.log[-4000:]}"
    assert len(trial.killed) == 2 and trial.recovery_s is not None
    assert check_run(tmp_path / "run", STEPS, PROMPTS * GROUP, reference=reference) == []
    assert "Traceback" not in trial.log
    print(f"node removed after iteration {trial.at_kill}; regained in {trial.recovery_s:.1f} s")
