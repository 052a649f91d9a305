"""`schedule.mode: async` on an embedded Ray cluster, with a deliberately slow trainer (four optimizer
steps per batch over small micro-batches): instances generate while the trainer updates, every step
is committed once, and no sample is trained past the staleness bound. The run is then resumed for
four more steps with in-flight weight swaps and generation longer than an update: the judged groups
its last checkpoint held come back, every problem drawn is trained, left out, dropped or still held
exactly once, samples are swapped mid-generation, each token with its version, and the bound holds
on the oldest of them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from rlsched.rl.pending import PendingWork
from rlsched.store.commit_log import CommitLog
from tests.helpers import ONE_OF_EACH

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray
STEPS, MORE, K = 8, 4, 1
GROUP = 8


FIRST = [
    "schedule.mode=async",
    f"rollout.max_staleness={K}",
    f"grpo.steps={STEPS}",
    "grpo.minibatches=4",
    "grpo.correction=decoupled",
    "trainer.micro_batch_tokens=256",
    "eval.every_steps=4",
    "task.eval_size=64",
    "eval.curve_size=32",
    "checkpoint.every=4",
    "run.record_iterations=true",
    *ONE_OF_EACH,  # one instance generates while the one rank updates: the overlap is the subject
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("async")
    _rlsched(["--out", str(out)], FIRST)
    return out


def _rlsched(args: list[str], settings: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "rlsched.cli", "run", "configs/jobs/quickstart.yaml", *args]
        + [a for s in settings for a in ("--set", s)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def resumed(run: Path) -> tuple[Path, str]:
    """The run resumed to STEPS + MORE steps: generation eight times longer, new versions swapped in."""
    settings = [
        "schedule.mode=async",
        f"rollout.max_staleness={K}",
        f"grpo.steps={STEPS + MORE}",
        "rollout.inflight_update=swap",
        "sampling.max_tokens=64",
        "sampling.ignore_eos=true",
        "eval.every_steps=4",
        "task.eval_size=64",
        "eval.curve_size=32",
        "checkpoint.every=4",
        *ONE_OF_EACH,
    ]
    return run, _rlsched(["--resume", str(run)], settings)


def rows(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_recorded_run_replays_to_the_same_decisions_in_every_drivers_core(run: Path) -> None:
    """Every event the Ray driver fed the async core, fed to the cores the simulator and `--local`
    build from the same config (and to a copy of the recorded one), gives the same effects."""
    from rlsched.config import load_config
    from rlsched.core.iteration import Dropped, Generate, Update
    from rlsched.store.traces import load_trace
    from tests.helpers import replays_in_every_driver

    trace = load_trace(run / "iteration_trace.pkl")
    assert replays_in_every_driver(load_config(ROOT / "configs/jobs/quickstart.yaml", FIRST), trace) == []
    effects = [e for _, out in trace.steps for e in out]
    steps = [e.iteration for e in effects if isinstance(e, Update)]  # one past the last is held back
    assert steps[:STEPS] == list(range(1, STEPS + 1)) and len(steps) <= STEPS + 1
    assert sum(isinstance(e, Generate) for e in effects) >= STEPS  # waves ran ahead of the steps
    print(
        f"async iteration trace: {len(trace.steps)} events, {len(effects)} effects "
        f"({sum(isinstance(e, Dropped) for e in effects)} drops), equal in the sim's, --local's and a copy"
    )


def test_every_step_is_committed_once_with_a_whole_batch(run: Path) -> None:
    got = rows(run)
    assert [r["iteration"] for r in got] == list(range(1, STEPS + 1))
    assert all(r["samples"] == 256 and r["used"] + r["faults"] == 256 for r in got)
    report = json.loads((run / "report.json").read_text())
    assert report["weights"]["ranks_agree"] and report["weights"]["instances_at_latest"]
    assert report["durability"]["durable_through"] == STEPS


def test_no_sample_is_trained_past_the_bound(run: Path) -> None:
    for r in rows(run):
        oldest_allowed = r["iteration"] - 1 - K  # step n trains from version n - 1
        assert min(r["extra"]["sample_versions"]) >= oldest_allowed, r["iteration"]
        assert max(int(k) for k in r["extra"]["staleness"]) <= K
        assert sum(r["extra"]["staleness"].values()) == r["samples"]
    assert any("1" in r["extra"]["staleness"] for r in rows(run))  # stale samples were trained


def test_the_trainer_updates_while_instances_generate_later_iterations(run: Path) -> None:
    trace = json.loads((run / "timeline.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    updates = [e for e in spans if e["cat"] == "update"]
    batches = [e for e in spans if e["cat"] == "batch"]
    overlapped = [
        (u, b)
        for u in updates
        for b in batches
        if b["ts"] < u["ts"] + u["dur"] and u["ts"] < b["ts"] + b["dur"]
    ]
    assert overlapped, "no instance generated while the trainer updated"


def test_each_record_carries_the_importance_weights(run: Path) -> None:
    importance = rows(run)[-1]["extra"]["importance"]
    assert importance["correction"] == "decoupled" and importance["max"] >= importance["mean"] > 0


def test_a_resume_brings_back_the_judged_groups_and_draws_the_problems_in_flight_again(
    resumed: tuple[Path, str],
) -> None:
    run, out = resumed
    assert re.search(r"[1-9]\d* judged group\(s\) the checkpoint held are back in the buffer", out), out[
        -3000:
    ]
    got = rows(run)
    assert [r["iteration"] for r in got] == list(range(1, STEPS + MORE + 1))
    # every problem drawn is accounted for once: trained or left out, dropped, or held at the end
    log = CommitLog(run / "commit.sqlite", create=False)
    final = log.entries()[-1]
    held = PendingWork.of_json(log.pending(STEPS + MORE) or "")
    consumed = sum(r["samples"] for r in got) // GROUP
    dropped = got[-1]["extra"]["stale_groups_dropped"]
    assert consumed + dropped + len(held.groups) + len(held.problems) == final.cursor


def test_versions_swapped_in_mid_generation_are_recorded_per_token_and_the_bound_holds(
    resumed: tuple[Path, str],
) -> None:
    run, _ = resumed
    later = rows(run)[STEPS:]
    assert sum(r["extra"]["swapped_samples"] for r in later) > 0
    for r in later:
        assert min(r["extra"]["sample_versions"]) >= r["iteration"] - 1 - K  # the oldest token's version
        assert max(int(k) for k in r["extra"]["staleness"]) <= K
    trace = json.loads((run / "timeline.json").read_text())["traceEvents"]
    spans = [e["args"]["token_versions"] for e in trace if "token_versions" in e.get("args", {})]
    assert spans
    for runs in spans:  # [[version, first, end], ...]: back to back from token 0, newer each time
        assert len(runs) >= 2 and runs[0][1] == 0
        assert all(b[1] == a[2] and b[0] > a[0] for a, b in pairwise(runs))
