"""Run an RL job on Ray: connect or start a cluster, check it can host the job, iterate, write outputs.

Outputs in the run's directory: `commit.sqlite` (the commit log: each iteration's record, fsync'ed
before the next starts, and the checkpoints; `rlsched.job.durability`), `checkpoints/` (the training
state every `checkpoint.every` iterations, at the end and when stopped), `metrics.jsonl` (the log's
metrics rows: phase times, overlap, critical path, reward, pass rate, tokens/s, eval pass rate every
k iterations), `timeline.json` (every span as a Chrome trace; open it in Perfetto) and `report.json`
(before/after); a multi-turn job adds `rounds.sqlite` (each episode's rounds, `actors.agent_episodes`).
`resume=True` continues the run in the directory from its newest checkpoint.
Whatever happens, actors are ended, the placement group removed, and an embedded cluster stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import ray

from actors.cluster_client import ClusterClient, JobStopped, find_scheduler
from actors.controller import JobController
from actors.scale import open_inbox
from rlsched.config import JobConfig
from rlsched.config_params import job_spec, run_rules
from rlsched.core.fleet import FleetTrace
from rlsched.errors import TrainingFault, UserError
from rlsched.job.capacity import check_capacity, probe_address
from rlsched.job.durability import JobLog, ResumePlan, plan_resume, span_words
from rlsched.job.interrupt import Terminated, ctrl_c
from rlsched.job.preflight import preflight
from rlsched.job.records import commit_record
from rlsched.job.registry import record_job
from rlsched.job.report import JobReport, iteration_line, write_report
from rlsched.metrics.plots import summary_png
from rlsched.metrics.spans import chrome_trace, phase_times
from rlsched.metrics.tracking import Tracking
from rlsched.rl.evaluate import EvalResult
from rlsched.store.traces import save_trace


def connect(cfg: JobConfig, address: str | None) -> bool:
    """Join `address`, or start an embedded local cluster sized from the config. True if we started it."""
    if ray.is_initialized():
        return False
    common: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if address:
        probe_address(address)
        try:
            ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise UserError(
                f"cannot connect to the Ray cluster at {address!r}: {err}. Check the address "
                "(host:port of the head node's GCS, or 'auto') and that the cluster is up; a cluster "
                "from `ray start` (Ray 2.60) takes only clients that send its token: export "
                "RAY_AUTH_MODE=token"
            ) from None
        return False
    ray.init(
        num_cpus=cfg.cluster.num_cpus,
        num_gpus=cfg.cluster.num_gpus,
        object_store_memory=cfg.cluster.object_store_mb << 20,
        **common,
    )
    return True


def _open_inbox(job: str) -> Any:
    try:
        inbox = open_inbox(job)
        ray.get(inbox.status.remote())
    except ValueError as err:  # the name is taken
        raise UserError(
            f"a job named {job!r} is already running on this cluster ({err}); give this one another --out"
        ) from None
    return inbox


Tick = Callable[[int, str], None]  # (iteration just committed, its one-line summary)


def register(
    cfg: JobConfig,
    name: str,
    queue: str | None,
    priority: str | None,
    log: Callable[[str], None],
    attempt: int | None = None,
) -> ClusterClient | None:
    """With a cluster scheduler on this cluster, the job's registration (None: it runs alone).
    `attempt`: the supervisor's attempt number (`rlsched.supervise`); the scheduler then requeues
    the job after a preemption or a failure instead of ending it."""
    handle = find_scheduler()
    if handle is None:
        if queue or priority:
            raise UserError(
                "--queue and --priority need the cluster scheduler, and none runs on this cluster; start "
                "one with `rlsched admin start FILE --address ADDR`, or leave them out to run alone"
            )
        return None
    if not queue:
        raise UserError(
            "this cluster has a scheduler (`rlsched queue` shows it): name the job's queue with --queue"
        )
    spec = job_spec(cfg, name, queue, priority or "")
    if attempt is not None:
        spec = replace(spec, requeue=True, attempt=attempt)
    client = ClusterClient(handle, spec)
    try:
        client.register()
    except ValueError as err:
        raise UserError(str(err)) from None
    again = f", attempt {attempt + 1}" if attempt else ""
    log(f"registered with the cluster scheduler as {name} (queue {queue}{again}); waiting for admission")
    return client


def run_job(
    cfg: JobConfig,
    out_dir: Path,
    address: str | None = None,
    log: Callable[[str], None] = print,
    tick: Tick | None = None,
    queue: str | None = None,
    priority: str | None = None,
    resume: bool = False,
    attempt: int | None = None,
) -> JobReport:
    note = preflight(cfg, out_dir, address)
    if note is not None:
        log(note)
    plan = plan_resume(cfg, out_dir, log) if resume else None
    if plan is not None:
        log(
            f"resuming {out_dir} after iteration {plan.start.iteration}, from {plan.source}"
            + (f"; {span_words(plan.redone)} run again" if plan.redone else "")
        )
    started = connect(cfg, address)
    controller: JobController | None = None
    trace: FleetTrace | None = None
    client: ClusterClient | None = None
    preempted, failure = False, ""
    forget: Callable[[], None] | None = None
    ctrl_c.__enter__()
    try:
        client = register(cfg, out_dir.name, queue, priority, log, attempt)
        groups = client.wait_admitted(log) if client is not None else []
        if client is None:
            check_capacity(cfg, ray.cluster_resources())
        t0 = time.monotonic()
        inbox = _open_inbox(out_dir.name)
        # where `rlsched scale` finds this job's cluster
        forget = record_job(out_dir.name, ray.get_runtime_context().gcs_address)
        start = plan.start if plan is not None else None
        controller = JobController(
            cfg, log=log, out_dir=out_dir, inbox=inbox, cluster=client, groups=groups, start=start
        )
        if cfg.run.record_fleet:
            trace = controller.fleet.record()
        if cfg.run.record_iterations:
            controller.record()
        log(
            f"Ray job ready in {time.monotonic() - t0:.1f} s: {cfg.trainer.ranks} trainer ranks "
            f"({cfg.trainer.strategy.value}, {cfg.trainer.placement_strategy.value}), "
            f"{cfg.rollout.instances} rollout instances, "
            f"{cfg.verifier.workers} verifier workers, overlap {'on' if cfg.schedule.overlap else 'off'}"
        )
        return _iterate(cfg, controller, out_dir, log, tick, plan)
    except JobStopped as stop:
        preempted = stop.preempted
        raise
    except (Terminated, UserError):
        raise  # stopped from outside, or bad input: the job ends as it is
    except Exception as err:
        failure = f"{type(err).__name__}: {err}"[:500]
        raise
    finally:
        ctrl_c.__exit__(None, None, None)
        if forget is not None:
            forget()
        if controller is not None:
            controller.shutdown()
        if trace is not None:
            save_trace(trace, out_dir / "fleet_trace.pkl")
        if controller is not None and controller.run.trace is not None:  # the last run's, after a recovery
            save_trace(controller.run.trace, out_dir / "iteration_trace.pkl")
        if client is not None and failure:
            client.failed(failure)
        elif client is not None:
            client.finished(preempted)
        if started:
            ray.shutdown()


def _iterate(
    cfg: JobConfig,
    controller: JobController,
    out_dir: Path,
    log: Callable[[str], None],
    tick: Tick | None,
    plan: ResumePlan | None = None,
) -> JobReport:
    out_dir.mkdir(parents=True, exist_ok=True)
    first = plan.start.iteration + 1 if plan is not None else 1
    tracking = Tracking(cfg.tracking, out_dir, cfg.model_dump(mode="json"), first)
    if tracking.prometheus is not None:
        log(f"metrics: {tracking.prometheus.address} (Prometheus)")
    job_log = JobLog(cfg, out_dir, log, plan)
    try:
        return _iterate_logged(cfg, controller, out_dir, log, tick, plan, job_log, tracking)
    finally:
        job_log.close()
        tracking.close()


def _iterate_logged(
    cfg: JobConfig,
    controller: JobController,
    out_dir: Path,
    log: Callable[[str], None],
    tick: Tick | None,
    plan: ResumePlan | None,
    job_log: JobLog,
    tracking: Tracking,
) -> JobReport:
    metrics_path = out_dir / "metrics.jsonl"
    rows: list[dict[str, Any]] = list(plan.rows) if plan is not None else []
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the log's rows are the truth
    start = time.monotonic()
    if plan is not None and plan.before is not None:
        before = EvalResult(**plan.before)
    else:
        before = controller.evaluate(controller.task.eval_problems)
        job_log.set_before(asdict(before))
    log(f"held-out pass rate before: {before}")
    first = plan.start.iteration + 1 if plan is not None else 1
    spent = plan.train_s if plan is not None else 0.0  # the time budget is the whole run's
    t_train = time.monotonic()
    committed = first - 1
    rules = run_rules(cfg)

    def train_s() -> float:
        return spent + time.monotonic() - t_train

    it = first
    try:
        while it <= cfg.grpo.steps:
            ctrl_c.check()
            if (why := _stop_before(cfg, controller, rules.out_of_time(train_s()), it)) is not None:
                log(why)
                break
            try:
                row, line = _one_iteration(cfg, controller, it)
                job_log.commit(it, controller, row, train_s())  # fsync'ed before the next iteration counts
                committed = it
                commit_record(metrics_path, json.dumps(row))
                rows.append(row)
                tracking.log(row, it, job_log.gauges())
                if row["eval_pass_rate"] is not None or it == first:
                    log(line)
                if tick is not None:
                    tick(it, line)
                job_log.after_commit(it, controller, train_s())
            except TrainingFault as fault:  # rebuilt from the last checkpoint (or raised past the limit)
                committed = job_log.recover(controller, fault)
                del rows[committed:]
                metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
                it = committed
            it += 1
    except (Terminated, JobStopped) as stop:
        _checkpoint_on_stop(job_log, controller, committed, train_s(), log, str(stop))
        raise
    except TrainingFault:
        log(_fault_note(job_log, out_dir))
        raise
    finally:
        spans = controller.spans + controller.redone_spans
        (out_dir / "timeline.json").write_text(json.dumps(chrome_trace(spans)))
        if rows:
            summary_png(rows, out_dir / "summary.png", title=f"{out_dir.name}: reward and phase times")
    if committed and job_log.latest != committed:
        job_log.checkpoint(committed, controller, train_s())
    weights = controller.weights_check()
    after = controller.evaluate(controller.task.eval_problems)
    controller.save_policy(out_dir / "checkpoint")
    log(f"held-out pass rate after:  {after}  ({100 * (after.pass_rate - before.pass_rate):+.1f} points)")
    report = JobReport(before, after, rows, time.monotonic() - start)
    write_report(out_dir, report, job_log, weights)
    return report


def _stop_before(cfg: JobConfig, controller: JobController, out_of_time: bool, it: int) -> str | None:
    """Why the job ends before iteration `it` (its time budget spent, or `rlsched finish` asked), or
    None to run it. Either way, an update the ranks already began on `it` (a pipelined job's) is
    still run and committed."""
    if out_of_time:
        why = f"time budget of {cfg.grpo.time_budget_s:.0f} s reached after {it - 1} iterations"
    elif controller.orders.finish_asked:
        why = f"finishing after {it - 1} iterations, as `rlsched finish` asked"
    else:
        return None
    return None if controller.stop_training(it) else why


def _one_iteration(cfg: JobConfig, controller: JobController, it: int) -> tuple[dict[str, Any], str]:
    """Run iteration `it` (with its held-out evaluation when due); its metrics row and summary line."""
    rec = controller.run_iteration(it)
    if run_rules(cfg).eval_due(it):
        rec.eval_pass_rate = controller.evaluate(
            controller.task.eval_problems[: cfg.eval.curve_size]
        ).pass_rate
    times = phase_times([s for s in controller.spans if s.iteration == it]).to_json()
    tps = rec.tokens / times["t_generate"] if times["t_generate"] else 0.0
    row = {**asdict(rec), **times, "tokens_per_s": round(tps, 1)}
    return row, iteration_line(rec, times)


def _checkpoint_on_stop(
    job_log: JobLog,
    controller: JobController,
    committed: int,
    train_s: float,
    log: Callable[[str], None],
    why: str,
) -> None:
    """Stopped between iterations (or before an update): the training state is the last committed
    iteration's, so it is checkpointed and the run can resume from there. A pipelined job whose ranks
    have already stepped further keeps its last checkpoint instead."""
    if controller.training_ahead:
        log(f"{why}: the trainer has stepped past iteration {committed}; the last checkpoint stands")
    elif committed and job_log.latest != committed:
        saved = job_log.checkpoint(committed, controller, train_s)
        log(f"{why}: checkpoint of iteration {committed} saved at {saved.path}")
    log(f"continue with: rlsched run CONFIG --resume {job_log.out_dir}")


def _fault_note(job_log: JobLog, out_dir: Path) -> str:
    latest = job_log.latest
    kept = f"the checkpoint of iteration {latest}" if latest else "no checkpoint yet"
    return (
        f"the training group failed; {out_dir} keeps the committed iterations and {kept}: "
        f"rlsched run CONFIG --resume {out_dir} continues the run"
    )
