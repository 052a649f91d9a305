"""A job's durability on the driver: the commit log each iteration is committed to, the checkpoints
of the training state, their background upload, and the plan a `--resume` starts from
(docs/durability.md).

The order is what makes a crash at any point recoverable:
1. the iteration's record (sample ids, data cursor, version, training seconds, metrics row) is
   committed, fsync'ed, before the next iteration starts; a failed commit stops the job;
2. every `checkpoint.every` iterations, at the end, and when the job is stopped (SIGTERM, the cluster
   scheduler's preemption), every trainer rank writes its share of the training state into a
   directory set aside, the driver adds the BF16 policy as a Hugging Face directory and `meta.json`,
   and the directory is sealed: checksummed and renamed into place (`rlsched.store.checkpoints`);
3. the commit log records the checkpoint; an uploader copies it to `checkpoint.upload_to` and the log
   tracks each upload, whose contiguous watermark bounds what may be pruned.

A resume (`plan_resume`) checks the log reads back intact and the model is the one the run started
from, picks the newest checkpoint that verifies, moves the records after it aside as redone (their
training state died with the crash), and returns where the controller starts.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlsched.config import JobConfig
from rlsched.config_params import retries, run_rules
from rlsched.errors import TrainingFault, UserError
from rlsched.model.checkpoint import architecture_fingerprint
from rlsched.policy.durability import (
    ResumePoint,
    Upload,
    durable_checkpoint,
    prunable,
    resume_point,
)
from rlsched.rl.pending import PendingWork
from rlsched.store import checkpoints as ckpt
from rlsched.store.commit_log import (
    LOG_NAME,
    CheckpointRow,
    CommitError,
    CommitLog,
    CorruptLog,
    IterationEntry,
    UsedSample,
)

META = "meta.json"


@dataclass(frozen=True)
class Start:
    """Where the controller begins: a new job, or a resumed one after `iteration`, with the training
    state in `state` (a checkpoint directory; None: the model as loaded), at weight version `version`
    and data position `cursor` (training problems already drawn); a pipelined job's work held beside
    that checkpoint in `pending`; `attempt`: the run's number (1, then one more per resume)."""

    iteration: int = 0
    version: int = 0
    cursor: int = 0
    state: Path | None = None
    pending: PendingWork | None = None
    attempt: int = 1


class JobController(Protocol):
    """What the log asks of the job's controller (`actors.controller.JobController`) to commit,
    checkpoint and recover an iteration."""

    consumed: list[tuple[str, str]]
    group: Any

    @property
    def version(self) -> int: ...
    @property
    def cursor(self) -> int: ...
    def save_policy(self, out: Path) -> Path: ...
    def pending_work(self) -> PendingWork | None: ...
    def episodes_checkpointed(self, iteration: int) -> None: ...
    def restart_training(self, start: Start) -> int: ...


def log_path(out_dir: Path) -> Path:
    return out_dir / LOG_NAME


def checkpoint_root(cfg: JobConfig, out_dir: Path) -> Path:
    return cfg.checkpoint.dir or out_dir / "checkpoints"


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed job starts, and what of the earlier runs it keeps."""

    start: Start
    train_s: float  # training seconds the earlier runs spent up to the resume point
    rows: list[dict[str, Any]]  # the metrics rows of the iterations kept
    redone: list[int]  # committed iterations that run again
    before: dict[str, Any] | None  # the held-out evaluation before training, from the first run
    source: str  # the checkpoint resumed from, in words


def _open_for_resume(run_dir: Path) -> tuple[CommitLog, list[IterationEntry]]:
    path = log_path(run_dir)
    if not path.is_file():
        raise UserError(
            f"--resume: {run_dir} has no commit log ({LOG_NAME}); a run writes it as it commits its "
            "iterations. Name the run's output directory, or start the run without --resume"
        )
    try:
        log = CommitLog(path, create=False)
        return log, log.entries()
    except CorruptLog as err:
        raise UserError(f"--resume refused: {err}") from None
    except CommitError as err:
        raise UserError(f"--resume refused: {err}") from None


def _verified(row: CheckpointRow) -> Path | None:
    """The local copy if it verifies, else the uploaded one if that does, else None."""
    for where in (row.path, row.upload_path if row.upload is Upload.DONE else None):
        if where is None:
            continue
        try:
            ckpt.verify(Path(where), row.sha256)
            return Path(where)
        except ckpt.CheckpointError:
            continue
    return None


def restart_from(commits: CommitLog, entries: list[IterationEntry]) -> tuple[ResumePoint, Start, float]:
    """Where a run starts again (a resume, or a rebuilt training group): after the newest checkpoint
    that verifies and is not ahead of the log; the controller's start and the training seconds then."""
    usable = {
        r.iteration: p for r in commits.checkpoints() if r.iteration <= len(entries) and (p := _verified(r))
    }
    point = resume_point([e.iteration for e in entries], durable_checkpoint(usable, None))
    if point.checkpoint is None:
        return point, Start(), 0.0
    entry = entries[point.checkpoint - 1]
    held = commits.pending(point.checkpoint)
    pending = PendingWork.of_json(held) if held is not None else None
    start = Start(entry.iteration, entry.version, entry.cursor, usable[point.checkpoint], pending)
    return point, start, entry.train_s


def plan_resume(cfg: JobConfig, run_dir: Path, log: Callable[[str], None]) -> ResumePlan:
    """Read the run's commit log and checkpoints, refuse what cannot be resumed (naming why), and say
    where the job starts. Nothing is changed on disk."""
    commits, entries = _open_for_resume(run_dir)
    try:
        started_from = commits.get("model")
        here = architecture_fingerprint(cfg.model.checkpoint)
        if started_from is not None and started_from != here:
            raise UserError(
                f"--resume refused: the run at {run_dir} trained a different model (fingerprint "
                f"{started_from}, from {commits.get('model_path')}); this config's model.checkpoint "
                f"({cfg.model.checkpoint or 'the shipped base'}) is {here}. Resume with the model the run "
                "started from"
            )
        point, start, train_s = restart_from(commits, entries)
        start = dataclasses.replace(start, attempt=int(commits.get("attempt") or 0) + 1)
        before = commits.get("before")
    except CorruptLog as err:
        raise UserError(f"--resume refused: {err}") from None
    finally:
        commits.close()
    source = f"the checkpoint of iteration {point.checkpoint}"
    if point.checkpoint is None:
        if entries:
            log(f"no checkpoint of {run_dir} verifies: its {len(entries)} committed iteration(s) run again")
        source = "the start (no checkpoint)"
    rows = [e.metrics for e in entries[: point.iteration]]
    return ResumePlan(
        start, train_s, rows, list(point.redone), json.loads(before) if before else None, source
    )


def span_words(iterations: tuple[int, ...] | list[int]) -> str:
    first, last = iterations[0], iterations[-1]
    return f"iteration {first}" if first == last else f"iterations {first}-{last}"


@dataclass
class CheckpointFigures:
    """What durability cost this run, for the report."""

    commit_s: list[float] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)
    upload_s: list[float] = field(default_factory=list)
    nbytes: int = 0


class JobLog:
    """The running job's commit log and checkpoints (see the module docstring for the order)."""

    def __init__(
        self, cfg: JobConfig, out_dir: Path, log: Callable[[str], None], plan: ResumePlan | None
    ) -> None:
        self.cfg, self.out_dir, self.log = cfg, out_dir, log
        self.rules = run_rules(cfg)  # when a checkpoint is due
        self.root = checkpoint_root(cfg, out_dir)
        if plan is None:
            self._start_afresh()
        self.commits = CommitLog(log_path(out_dir))
        attempt = self.commits.begin_attempt()
        self.figures = CheckpointFigures()
        self.latest: int | None = None
        self.recoveries = 0
        self.recovery_s: list[float] = []
        if plan is None:
            self.commits.put(
                model=architecture_fingerprint(cfg.model.checkpoint),
                model_path=str(cfg.model.checkpoint or "the shipped base"),
                seed=str(cfg.run.seed),
            )
        else:
            redone = self.commits.redo_after(plan.start.iteration)
            self.latest = plan.start.iteration if plan.start.state is not None else None
            self.commits.note(
                "resume",
                f"run {attempt} resumes after iteration {plan.start.iteration} from {plan.source}; "
                f"redoes {redone or 'nothing'}",
            )
        upload = cfg.checkpoint.upload_to
        self.uploader = ckpt.Uploader(upload, self._uploaded) if upload is not None else None

    def _start_afresh(self) -> None:
        """A new run in a directory an earlier run used: its log and checkpoints go (metrics.jsonl is
        rewritten too); `--resume` is how to continue one instead."""
        old = log_path(self.out_dir)
        if old.exists():
            self.log(f"starting afresh in {self.out_dir}: the earlier run's commit log and checkpoints are "
                     "replaced (rlsched run --resume continues a run instead)")  # fmt: skip
            for suffix in ("", "-wal", "-shm"):
                Path(f"{old}{suffix}").unlink(missing_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)

    def set_before(self, before: dict[str, Any]) -> None:
        self.commits.put(before=json.dumps(before))

    # -- each iteration ----------------------------------------------------------------------------

    def commit(self, iteration: int, controller: JobController, row: dict[str, Any], train_s: float) -> float:
        """The iteration's record, fsync'ed; the seconds the commit took. A failure stops the job."""
        used = tuple(UsedSample(self.commits.sample_id(rid), rid, kind) for rid, kind in controller.consumed)
        entry = IterationEntry(
            iteration=iteration,
            version=controller.version,
            cursor=controller.cursor,
            train_s=round(train_s, 3),
            checkpoint=self.latest,
            metrics=row,
            used=used,
        )
        seconds = self.commits.commit(entry)
        self.figures.commit_s.append(seconds)
        return seconds

    def after_commit(self, iteration: int, controller: JobController, train_s: float) -> None:
        """A checkpoint when one is due on the schedule (the job's end and stops take their own)."""
        if self.rules.checkpoint_due(iteration):
            self.checkpoint(iteration, controller, train_s)

    def gauges(self) -> dict[str, float]:
        """The durability figures the trackers show beside each row."""
        f = self.figures
        out = {"recoveries_total": float(self.recoveries)}
        if f.commit_s:
            out["commit_seconds"] = f.commit_s[-1]
        if f.save_s:
            out["checkpoint_seconds"] = f.save_s[-1]
        return out

    # -- checkpoints -------------------------------------------------------------------------------

    def checkpoint(self, iteration: int, controller: JobController, train_s: float) -> ckpt.Saved:
        """The training state after `iteration` (its committed record), sealed and recorded."""
        start = time.monotonic()
        tmp = ckpt.partial_dir(self.root, iteration)
        controller.group.save_state(tmp)
        if self.cfg.checkpoint.hf:
            controller.save_policy(tmp / "hf")
        meta = {
            "iteration": iteration,
            "version": controller.version,
            "cursor": controller.cursor,
            "train_s": round(train_s, 3),
            "ranks": self.cfg.trainer.ranks,
            "strategy": self.cfg.trainer.strategy.value,
            "model": architecture_fingerprint(self.cfg.model.checkpoint),
        }
        (tmp / META).write_text(json.dumps(meta, indent=1))
        saved = ckpt.seal(self.root, iteration)
        seconds = time.monotonic() - start
        pending = controller.pending_work()
        self.commits.add_checkpoint(
            iteration, str(saved.path), saved.sha256, saved.nbytes, seconds, self.uploader is not None,
            pending.to_json() if pending is not None else None,
        )  # fmt: skip
        self.figures.save_s.append(seconds)
        self.figures.nbytes = saved.nbytes
        self.latest = iteration
        if self.uploader is not None:
            for row in self.commits.checkpoints():  # a failed one is retried, in order, before this one
                if row.upload is Upload.FAILED:
                    self.uploader.submit(row.iteration, Path(row.path))
            self.uploader.submit(iteration, saved.path)
        self._prune()
        controller.episodes_checkpointed(min(r.iteration for r in self.commits.checkpoints()))
        return saved

    def _uploaded(self, iteration: int, copy: Path | None, seconds: float, error: str | None) -> None:
        """The uploader's report (its own thread): recorded in the log."""
        if copy is None:
            self.commits.set_upload(iteration, Upload.FAILED, None, seconds)
            self.log(f"checkpoint {iteration}: upload failed ({error}); it is retried with the next one")
            return
        self.commits.set_upload(iteration, Upload.DONE, str(copy), seconds)
        self.figures.upload_s.append(seconds)

    def watermark(self) -> int | None:
        """The newest checkpoint that, with every earlier one, is durable (uploaded, where uploads are on)."""
        rows = self.commits.checkpoints()
        uploads = {r.iteration: r.upload or Upload.PENDING for r in rows} if self.uploader else None
        return durable_checkpoint([r.iteration for r in rows], uploads)

    def _prune(self) -> None:
        rows = {r.iteration: r for r in self.commits.checkpoints()}
        for iteration in prunable(rows, self.watermark(), self.cfg.checkpoint.keep):
            row = rows[iteration]
            for where in (row.path, row.upload_path):
                if where:
                    shutil.rmtree(where, ignore_errors=True)
            self.commits.drop_checkpoint(iteration)

    # -- recovery inside the run -------------------------------------------------------------------

    def recover(self, controller: JobController, fault: TrainingFault) -> int:
        """The training group failed (a rank died or hung): rebuild it from the newest checkpoint that
        verifies, move the iterations committed after it aside as redone, and return the iteration
        the run continues after. Past `checkpoint.max_recoveries` the fault stops the run."""
        self.recoveries += 1
        if retries(self.cfg).recovery.gives_up(self.recoveries):
            raise fault
        started = time.monotonic()
        point, start, _ = restart_from(self.commits, self.commits.entries())
        self.commits.redo_after(point.iteration)
        self.latest = point.checkpoint
        version = controller.restart_training(start)
        seconds = time.monotonic() - started
        self.recovery_s.append(seconds)
        what = (
            f"{fault}; rebuilt from the checkpoint of iteration {point.iteration}"
            if point.checkpoint
            else (f"{fault}; rebuilt from the model (no checkpoint yet)")
        )
        redo = f", redoing {span_words(point.redone)}" if point.redone else ""
        self.commits.note("recovered", f"{what}{redo}, as version {version}, in {seconds:.1f} s")
        self.log(f"recovered: {what}{redo}; its weights serve as version {version} ({seconds:.1f} s)")
        return point.iteration

    def close(self, timeout_s: float = 600.0) -> None:
        """Wait for the uploads in flight (their outcome is logged), then close the log."""
        if self.uploader is not None:
            if not self.uploader.close(timeout_s):
                self.log(
                    f"checkpoint uploads still running after {timeout_s:.0f} s; the log says which are done"
                )
            self._prune()
        self.commits.close()
