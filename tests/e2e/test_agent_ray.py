"""A multi-turn job on Ray, as a user runs it (`rlsched run configs/jobs/agent_calc.yaml`): a tiny
model with SmolLM2's tokenizer, taught the calculator's call format (tests/agent_model.py), two rollout
instances each running a route of the episodes with the calculator sandboxed beside it, every round
journaled in the run's `rounds.sqlite`.

One rollout instance is killed with SIGKILL while its episodes are under way. The fleet core routes
them again, to an instance that serves, where each episode resumes from its last committed round:
the iteration commits with every episode, and the calculator (which keeps a line per run in its work
directory) ran exactly once per call the episodes made. Nothing of any environment is left on the
machine afterwards.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rlsched.chaos import TITLES, Fault, processes
from tests.helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def counting(sleep_s: float) -> str:
    """The calculator, taking `sleep_s` a call (so that what the test does lands while calls are under
    way, however fast the model answers) and keeping a line per completed run in its work directory."""
    return (
        f"import time\ntime.sleep({sleep_s})\n"
        + (ROOT / "configs" / "tools" / "calculator.py").read_text()
        + "\nwith open('runs.txt', 'a') as f:\n    f.write('ran\\n')\n"
    )


@pytest.fixture(scope="module")
def calc_model(tool_model: Path) -> Path:
    """The tiny model that calls the calculator, built once and cached (tests/agent_model.py)."""
    return tool_model


def job_file(tmp_path: Path, model: Path, sleep_s: float = 1.5) -> Path:
    """agent_calc.yaml, small, on the problems the tiny model learned (tests/agent_model.py): a model
    that small replays what it learned there (a call, then the answer), and on a problem it has never
    seen writes no call at all. The mechanism under test (rounds, journals, resumption) does not care
    which problems the episodes are about."""
    from tests.agent_model import teacher_problems

    cfg = yaml.safe_load((ROOT / "configs" / "jobs" / "agent_calc.yaml").read_text())
    program = tmp_path / "counting_calculator.py"
    program.write_text(counting(sleep_s))
    taught = teacher_problems()
    rows = [
        {"id": f"{split}-{k}", "prompt": p.messages()[0].content, "reference": p.answer, "split": split}
        for split, n in (("train", 8), ("eval", 16))
        for k, p in ((k, taught[k % len(taught)]) for k in range(n))
    ]
    problems = tmp_path / "taught.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg["model"]["checkpoint"] = str(model)
    cfg["agent"]["chat_template"] = str(ROOT / cfg["agent"]["chat_template"])
    cfg["agent"]["tools"][0]["program_file"] = str(program)
    cfg["task"] = {"name": "jsonl", "path": str(problems)}
    cfg["grpo"] |= {"steps": 1, "prompts_per_step": 4, "group_size": 2, "time_budget_s": 900}
    cfg["eval"] = {"every_steps": 100, "curve_size": 16}
    cfg["rollout"] = {"instances": 2, "request_batch": 4}  # the 8 episodes in a route of 4 on each
    cfg["trainer"] |= {"ranks": 1}  # the gang is not what this is about: a process fewer to start
    cfg["verifier"] |= {"workers": 1}
    cfg.setdefault("run", {})["record_iterations"] = True  # the iteration core's trace, replayed below
    path = tmp_path / "agent_job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def episodes_under_way(journal: Path) -> int:
    """Episodes of the journal that have started and not ended (a reply sampled, a call running)."""
    if not journal.exists():
        return 0
    try:
        with sqlite3.connect(journal, timeout=5) as db:
            bodies = [json.loads(b) for (b,) in db.execute("SELECT body FROM states").fetchall()]
    except sqlite3.Error:
        return 0
    return sum(1 for b in bodies if b["episode"]["ended"] is None)


def runs_in(archive: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("runs.txt")
        return 0 if member is None else member.read().decode().count("ran")


def test_a_killed_instance_s_episodes_resume_elsewhere_without_running_a_tool_twice(
    calc_model: Path, tmp_path: Path
) -> None:
    sandboxes = set(Path(tempfile.gettempdir()).glob("rlsched-sandbox-*"))
    out = tmp_path / "run"
    job = job_file(tmp_path, calc_model)
    command = [sys.executable, "-m", "rlsched.cli", "run", str(job), "--out", str(out)]
    log = (tmp_path / "stdout.txt").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, text=True)
    try:
        deadline = time.monotonic() + 600
        while episodes_under_way(out / "rounds.sqlite") < 4:  # rounds under way on both instances
            assert proc.poll() is None, (tmp_path / "stdout.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no episode was journaled under way within 600 s"
            time.sleep(0.2)
        victims = processes(TITLES[Fault.ROLLOUT_INSTANCE])
        assert victims, "no rollout instance process to kill"
        os.kill(victims[0], signal.SIGKILL)
        assert proc.wait(timeout=900) == 0, (tmp_path / "stdout.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:  # stopped as a user would, so that its embedded cluster goes with it
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
    stdout = (tmp_path / "stdout.txt").read_text()
    assert (
        "routed again, their instance having died" in stdout
        and "resumes from its last committed round" in stdout
    )
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["iteration"] == 1 and row["samples"] == 8  # every episode, once
    episodes = row["extra"]["episodes"]
    assert episodes["episodes"] == 8 and episodes["handed_again"] >= 1

    with sqlite3.connect(out / "rounds.sqlite") as db:
        states = dict(db.execute("SELECT episode, body FROM states").fetchall())
        files = {e: bytes(a) for e, a in db.execute("SELECT episode, archive FROM files").fetchall()}
    assert len(states) == 8
    calls = 0
    for episode, body in states.items():
        state = json.loads(body)
        made = state["counts"][0]  # tool calls the episode made
        assert state["episode"]["ended"] is not None
        assert runs_in(files[episode]) == made if made else episode not in files
        calls += made
    assert calls > 0
    assert set(Path(tempfile.gettempdir()).glob("rlsched-sandbox-*")) <= sandboxes

    # the multi-turn iteration is the one core's: every event the Ray driver fed it (each episode's
    # arrival and verdict, the kill included) gives the same effects in the simulator's and --local's
    from rlsched.config import load_config
    from rlsched.store.traces import load_trace
    from tests.helpers import replays_in_every_driver

    trace = load_trace(out / "iteration_trace.pkl")
    assert replays_in_every_driver(load_config(job), trace) == []
    print(f"multi-turn iteration trace: {len(trace.steps)} events, equal in the sim's, --local's and a copy")
