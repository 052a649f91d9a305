"""Fault injection for a running job, and the checks that it recovered (`scripts/chaos.py` runs the
soak; `tests/chaos/` runs each fault once).

A trial starts `rlsched run` as a user would, waits until a given iteration is committed, waits a
little more (so the fault lands inside the next iteration), and kills its target with SIGKILL: a
process found by the title Ray gives its workers (`ray::TrainerRank`, ...), or the driver itself.
The job must then recover by itself (a new training group from the last checkpoint, a replacement
instance, a replacement verifier worker, a cluster scheduler restarted by Ray with its state) or, for
the driver, through `rlsched run --resume` (under a supervisor, `rlsched run --requeue`, by itself:
`tests/e2e/test_requeue_ray.py`). After
the run ends, `check_run` reads its commit log and report:

- every iteration 1..N committed once, each with all of its requests, every request id once (no
  sample lost or used twice);
- the staleness bound held in every committed iteration;
- every rank holds the published weights and every serving instance the latest version;
- with a reference run, the same curve (reward, loss, tokens, held-out pass rate).

Recovery time is the time from the kill until the commit log holds, for good, an iteration past the
one it held at the kill: the progress the fault cost, regained (a kill that lands after an update
may let one more iteration commit before the fault is seen; the rewind that follows sends the log
back, and only the last climb counts).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

STEPS, PROMPTS, GROUP = 6, 8, 8  # the trials' job: the quickstart, small
SETS = [
    f"grpo.steps={STEPS}",
    f"grpo.prompts_per_step={PROMPTS}",
    "checkpoint.every=2",
    "eval.every_steps=3",
    "task.eval_size=64",
    "eval.curve_size=32",
    "trainer.collective_timeout_s=20",
    # every iteration is checked (and the curve against an uninterrupted run's): the default time
    # budget, 180 s, would end a run early on a slow CPU, and a recovery makes the trial slower than
    # its reference, so the two would stop after different iterations
    "grpo.time_budget_s=3600",
    # the curve is compared loss for loss: a requeued request regenerated in another batch must get
    # the log-probs of its first attempt (rlsched/engine/batch_invariant.py), and the batches' make-up
    # must not depend on timing (refilled slot by slot, the loss of a fault-free run already differed
    # from its reference's in the 8th digit, rewards and tokens equal)
    "engine.batch_invariant=true",
    "rollout.refill=batch",
]


class Fault(StrEnum):
    DRIVER = "driver"  # SIGKILL of the driver, then `rlsched run --resume`
    SIGTERM = "sigterm"  # a preemption's notice: checkpoint, exit 3, then --resume
    TRAINER_RANK = "trainer_rank"  # one rank's process
    TRAINER_NODE = "trainer_node"  # every rank, the weight service's host among them
    ROLLOUT_INSTANCE = "rollout_instance"
    VERIFIER_WORKER = "verifier_worker"
    SCHEDULER = "scheduler"  # the cluster scheduler's actor: for a job under it (--queue, on a cluster)
    NODE = "node"  # a whole Ray node removed (ray.cluster_utils.Cluster): its raylet and every worker


CLUSTER_FAULTS = frozenset({Fault.SCHEDULER, Fault.NODE})  # need a multi-process Ray cluster of their own


TITLES = {
    Fault.TRAINER_RANK: "ray::TrainerRank",
    Fault.TRAINER_NODE: "ray::TrainerRank",
    Fault.ROLLOUT_INSTANCE: "ray::Instance",
    Fault.VERIFIER_WORKER: "ray::VerifierWorker",
    Fault.SCHEDULER: "ray::SchedulerActor",
}


def processes(title: str) -> list[int]:
    """Pids of the processes whose title starts with `title` (Ray names its workers `ray::Class`),
    of the Ray clusters this process would start or join: where RAY_TMPDIR is set (each pytest-xdist
    worker sets its own), only the processes that inherited the same one, so that a fault is never
    injected into another cluster on the machine."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = [int(pid) for pid, _, args in (line.strip().partition(" ") for line in out.splitlines())
             if args.strip().startswith(title)]  # fmt: skip
    return [pid for pid in found if same_ray_tmpdir(pid)]


def same_ray_tmpdir(pid: int) -> bool:
    """Whether process `pid` runs with this process's RAY_TMPDIR (always, where none is set)."""
    ours = os.environ.get("RAY_TMPDIR")
    if not ours:
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False  # gone, or not ours to read
    return f"RAY_TMPDIR={ours}".encode() in env


def _parent(pid: int) -> int:
    out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True).stdout
    return int(out.strip() or 0)


def remove_node_hosting(cluster: Any, title: str) -> list[int]:
    """Remove, as a crash would (no grace), the worker node of a `ray.cluster_utils.Cluster` whose
    raylet started the processes titled `title`; the pids that went with it (empty: none found, or
    they run on the head, which stays)."""
    by_raylet: dict[int, list[int]] = {}
    for pid in processes(title):
        by_raylet.setdefault(_parent(pid), []).append(pid)
    for node in cluster.worker_nodes:
        ours = by_raylet.get(node.all_processes["raylet"][0].process.pid)
        if ours:
            cluster.remove_node(node, allow_graceful=False)
            return ours
    return []


def committed(out: Path) -> int:
    """The newest iteration in the run's metrics (rewritten from the commit log after a recovery)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return int(json.loads(lines[-1])["iteration"]) if lines else 0


@dataclass
class Landing:
    """One fault of a trial, as it landed."""

    fault: Fault
    after: int  # the iteration committed when the fault was injected
    delay_s: float
    at_kill: int = 0  # the newest committed iteration when the fault landed
    killed: list[int] = field(default_factory=list)
    recovery_s: float | None = None


@dataclass
class Trial:
    """One run with its faults injected in turn (most trials: one), and how the run ended."""

    landings: list[Landing]
    returncode: int | None = None
    problems: list[str] = field(default_factory=list)
    log: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    # a trial of one fault: that fault's figures
    @property
    def at_kill(self) -> int:
        return self.landings[0].at_kill

    @property
    def killed(self) -> list[int]:
        return self.landings[0].killed

    @property
    def recovery_s(self) -> float | None:
        return self.landings[0].recovery_s


# faults whose recovery rewinds the commit log to a checkpoint: the rebuild notes it ("recovered")
REWINDING = frozenset({Fault.TRAINER_RANK, Fault.TRAINER_NODE, Fault.NODE})


def _start(command: list[str], out: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*command, "--out", str(out)], stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _wait_for(out: Path, iteration: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    give_up = time.monotonic() + timeout_s
    while committed(out) < iteration:
        if proc.poll() is not None or time.monotonic() > give_up:
            return False
        time.sleep(0.05)
    return True


def recoveries(out: Path) -> int:
    """How many times the run rebuilt its training group (the commit log's "recovered" events). Read
    with a read-only connection, not `CommitLog`, which takes the log's write lock on opening: polled
    every 50 ms, that would contend with the job's own commits."""
    try:
        db = sqlite3.connect(f"file:{out / 'commit.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            return int(db.execute("SELECT count(*) FROM events WHERE kind = 'recovered'").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:  # not written yet
        return 0


def run_trial(
    command: list[str],
    out: Path,
    fault: Fault,
    after: int,
    delay_s: float,
    timeout_s: float = 600.0,
    inject: Callable[[], list[int]] | None = None,
) -> Trial:
    """One run of `command` (`rlsched run CONFIG --set ...`, without --out) with `fault` injected
    `delay_s` after iteration `after` is committed; the run is waited for (resumed, for the driver).
    `inject` carries out a fault that is not a kill by title (a node removed) and says what it ended."""
    return run_faults(command, out, [Landing(fault, after, delay_s)], timeout_s, inject)


def run_faults(
    command: list[str],
    out: Path,
    landings: list[Landing],
    timeout_s: float = 600.0,
    inject: Callable[[], list[int]] | None = None,
) -> Trial:
    """One run of `command` with several faults in turn: each lands `delay_s` after its iteration
    `after` is committed, once the one before has been recovered from (its run back past the
    iteration it held at the kill; for a rebuilt training group, after the rebuild). The last one's
    recovery is watched until the run ends, as a single fault's is."""
    trial = Trial(landings)
    log = out.parent / f"{out.name}.log"
    proc = _start(command, out, log)
    for n, landing in enumerate(landings):
        if not _wait_for(out, landing.after, proc, timeout_s):
            proc.kill()
            before = f" (before the {landing.fault} fault)" if len(landings) > 1 else ""
            trial.problems.append(f"the run never committed iteration {landing.after}{before}")
            trial.log = log.read_text()
            return trial
        time.sleep(landing.delay_s)
        landing.at_kill, kill_time, rebuilt = committed(out), time.monotonic(), recoveries(out)
        proc = _land(landing, command, out, log, proc, trial, timeout_s, inject)
        if n < len(landings) - 1:
            landing.recovery_s = _regained(out, landing, proc, kill_time, rebuilt, timeout_s)
        else:
            landing.recovery_s = _time_to(out, landing.at_kill + 1, proc, kill_time, timeout_s)
    trial.returncode = proc.wait(timeout=timeout_s)
    trial.log = log.read_text()
    if trial.returncode != 0:
        trial.problems.append(f"the run ended with status {trial.returncode}")
    return trial


def _land(
    landing: Landing,
    command: list[str],
    out: Path,
    log: Path,
    proc: subprocess.Popen[bytes],
    trial: Trial,
    timeout_s: float,
    inject: Callable[[], list[int]] | None,
) -> subprocess.Popen[bytes]:
    """Inject `landing`'s fault into the run; the run's process afterwards (for the driver's faults,
    the `--resume` that continues it)."""
    fault = landing.fault
    if fault in (Fault.DRIVER, Fault.SIGTERM):
        os.kill(proc.pid, signal.SIGKILL if fault is Fault.DRIVER else signal.SIGTERM)
        landing.killed = [proc.pid]
        first = proc.wait(timeout=timeout_s)
        landing.at_kill = committed(out)  # what the stopped run had committed
        expected = -signal.SIGKILL if fault is Fault.DRIVER else 3
        if first != expected:
            trial.problems.append(f"the run stopped by the {fault} fault ended with {first}, not {expected}")
        return _start([*command, "--resume"], out, log)
    if inject is not None:
        landing.killed = inject()
        return proc
    pids = processes(TITLES[fault])
    chosen = pids if fault is Fault.TRAINER_NODE else pids[:1]
    if not chosen:
        trial.problems.append(f"no process titled {TITLES[fault]} to kill")
    for pid in chosen:
        os.kill(pid, signal.SIGKILL)
    landing.killed = chosen
    return proc


def _regained(
    out: Path, landing: Landing, proc: subprocess.Popen[bytes], since: float, rebuilt: int, timeout_s: float
) -> float | None:
    """Seconds from `since` until the run is back past the iteration it held at `landing`'s kill,
    for a fault the next one may follow: after a rebuild of the training group (the commit log's
    "recovered" events past `rebuilt`), since an iteration committed before the rebuild is redone.
    None if the run ended or gave up first."""
    give_up = time.monotonic() + timeout_s
    while landing.fault in REWINDING and recoveries(out) <= rebuilt:
        if proc.poll() is not None or time.monotonic() > give_up:
            return None
        time.sleep(0.05)
    if not _wait_for(out, landing.at_kill + 1, proc, max(0.0, give_up - time.monotonic())):
        return None
    return time.monotonic() - since


def _time_to(
    out: Path, iteration: int, proc: subprocess.Popen[bytes], since: float, timeout_s: float
) -> float | None:
    """Seconds from `since` until `iteration` is committed for good: a recovery that rewinds the log
    (a rebuilt training group redoes iterations) sends it back below, and only the last climb past
    it counts. Watched until the run ends; None if it never got there."""
    give_up = time.monotonic() + timeout_s
    regained: float | None = None
    while proc.poll() is None and time.monotonic() < give_up:
        if committed(out) >= iteration:
            regained = regained if regained is not None else time.monotonic() - since
        else:
            regained = None
        time.sleep(0.05)
    if committed(out) < iteration:
        return None
    return regained if regained is not None else time.monotonic() - since


def curve(out: Path) -> list[tuple[Any, ...]]:
    """What must not change with a fault: reward, loss, tokens and held-out pass rate per iteration
    (the version column does: a rebuilt training group publishes under a new version number)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["iteration"], r["reward_mean"], r["loss"], r["tokens"], r["eval_pass_rate"]) for r in rows]


def check_run(
    out: Path,
    steps: int,
    per_iteration: int,
    max_staleness: int = 0,
    reference: list[tuple[Any, ...]] | None = None,
    uploaded: bool = False,
) -> list[str]:
    """What a recovered run must show (see the module docstring); the problems found."""
    problems: list[str] = []
    missing = [n for n in ("commit.sqlite", "metrics.jsonl", "report.json") if not (out / n).is_file()]
    if missing:
        return [f"the run left no {', '.join(missing)}"]
    db = sqlite3.connect(out / "commit.sqlite")
    try:
        iterations = [i for (i,) in db.execute("SELECT iteration FROM iterations ORDER BY iteration")]
        rows = db.execute("SELECT iteration, request_id FROM samples").fetchall()
    except sqlite3.Error as err:
        return [f"the commit log cannot be read: {err}"]
    finally:
        db.close()
    if iterations != list(range(1, steps + 1)):
        problems.append(f"committed iterations {iterations}, not 1..{steps}")
    by_iteration: dict[int, set[str]] = {}
    for i, rid in rows:
        by_iteration.setdefault(i, set()).add(rid)
    for i in range(1, steps + 1):
        got = by_iteration.get(i, set())
        if len(got) != per_iteration or any(not r.startswith(f"{i}-") for r in got):
            problems.append(f"iteration {i} holds {len(got)} request(s), not its {per_iteration}")
    if len({r for _, r in rows}) != len(rows):
        problems.append("a request id is committed twice")
    for row in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()):
        oldest = min(row["extra"]["sample_versions"], default=row["version"])
        if row["version"] - oldest > max_staleness:
            problems.append(
                f"iteration {row['iteration']} used a sample {row['version'] - oldest} versions old"
            )
    report = json.loads((out / "report.json").read_text())
    if not (report["weights"]["ranks_agree"] and report["weights"]["instances_at_latest"]):
        problems.append(f"weights disagree at the end: {report['weights']}")
    durable = report["durability"]["durable_through"]
    if uploaded and durable != steps:
        problems.append(f"the uploads are durable through iteration {durable}, not {steps}")
    if reference is not None and curve(out) != reference:
        problems.append("the curve differs from the uninterrupted run's")
    return problems


# the cluster of a trial that needs one: a head for the driver, instances and verifiers, and two nodes
# with room for the training gang (`trainer_slot`); the scheduler's fault puts the job under it
TRAINER_SLOT = "trainer.resources.trainer_slot=1"
CLUSTER_ADMIN = """
priority_classes:
  low: {value: 10, preemptible: true, grace_s: 10}
queues:
  research:
    nominal: {CPU: 10, trainer_slot: 4}
    default_priority: low
"""


def cluster_trial(
    fault: Fault, out: Path, after: int, delay_s: float, sets: list[str], timeout_s: float = 600.0
) -> Trial:
    """A trial of a fault in `CLUSTER_FAULTS`, on a three-node `ray.cluster_utils.Cluster` of its own
    (gone afterwards): the node holding the training ranks removed; or the scheduler's actor killed,
    with the job under it (`--queue research --requeue`)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 6})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2, resources={"trainer_slot": 2})
        cluster.wait_for_nodes()
        run = [*command("configs/jobs/quickstart.yaml", [*sets, TRAINER_SLOT]), "--address", cluster.address]
        if fault is Fault.NODE:
            remove = lambda: remove_node_hosting(cluster, TITLES[Fault.TRAINER_NODE])  # noqa: E731
            return run_trial(run, out, fault, after, delay_s, timeout_s, inject=remove)
        admin = out.parent / f"{out.name}-admin.yaml"
        admin.write_text(CLUSTER_ADMIN)
        state = out.parent / f"{out.name}-scheduler.sqlite"
        started = subprocess.run(
            [sys.executable, "-m", "rlsched.cli", "admin", "start", str(admin), "--address", cluster.address,
             "--state", str(state)], capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if started.returncode != 0:
            trial = Trial([Landing(fault, after, delay_s)])
            trial.problems.append(f"the scheduler did not start: {started.stderr[-500:]}")
            return trial
        return run_trial([*run, "--queue", "research", "--requeue"], out, fault, after, delay_s, timeout_s)
    finally:
        cluster.shutdown()


def pick(rng: random.Random, faults: list[Fault], steps: int) -> tuple[Fault, int, float]:
    """A random trial for the soak: the fault, the iteration after which it lands, how far into the
    next iteration."""
    return rng.choice(faults), rng.randint(1, max(1, steps - 2)), round(rng.uniform(0.05, 0.6), 2)


def command(config: str, sets: list[str]) -> list[str]:
    return [sys.executable, "-m", "rlsched.cli", "run", config, *[a for s in sets for a in ("--set", s)]]
