"""The cluster commands of `rlsched`: start and stop the scheduler, submit, queue, status, cancel.

Each connects to a Ray cluster (`--address`, default the one on this machine) in the scheduler's
namespace for one call and talks to the scheduler actor (`actors/cluster.py`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from rlsched.errors import UserError

console = Console(highlight=False, soft_wrap=True, markup=False)  # job names, states, reasons: all text


@contextmanager
def _on_cluster(address: str) -> Iterator[str | None]:
    """Connect to the Ray cluster at `address` for one command (the scheduler's namespace); yields
    the dashboard's address (None: the cluster runs without one)."""
    import logging

    import ray

    from actors.cluster import NAMESPACE

    try:
        context = ray.init(
            address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING
        )
    except (ConnectionError, RuntimeError) as err:
        raise UserError(
            f"no Ray cluster at {address!r} ({err}); start one (`ray start --head`) or pass --address "
            "host:port of its head node. A cluster from `ray start` (Ray 2.60) takes only clients that "
            "send its token: export RAY_AUTH_MODE=token"
        ) from None
    try:
        yield context.dashboard_url or None
    finally:
        ray.shutdown()


def _scheduler() -> Any:
    from actors.cluster_client import find_scheduler

    handle = find_scheduler()
    if handle is None:
        raise UserError(
            "no cluster scheduler runs on this Ray cluster; start one with `rlsched admin start FILE`"
        )
    return handle


def cmd_admin_start(args: argparse.Namespace) -> int:
    from actors.cluster_client import find_scheduler, start_scheduler
    from rlsched.admin import admission_params, load_admin

    cfg = load_admin(args.file)
    defaults = {q: c.default_priority for q, c in cfg.queues.items() if c.default_priority}
    with _on_cluster(args.address):
        if find_scheduler() is not None:
            raise UserError("a cluster scheduler already runs here; `rlsched admin stop` it first")
        start_scheduler(admission_params(cfg), args.cycle_s, defaults, state=args.state or None)
    console.print(
        f"cluster scheduler started with {args.file} ({len(cfg.queues)} queues, "
        f"{len(cfg.priority_classes)} priority classes); a cycle every {args.cycle_s:g} s. "
        "Jobs join it with `rlsched submit` or `rlsched run --queue Q`"
    )
    return 0


def cmd_admin_stop(args: argparse.Namespace) -> int:
    from actors.cluster_client import stop_scheduler

    with _on_cluster(args.address):
        stopped = stop_scheduler()
    console.print("cluster scheduler stopped" if stopped else "no cluster scheduler was running")
    return 0


EXCLUDES = [".git", ".venv*", "runs", "bench_results", "models", "*.egg-info", "**/__pycache__", "*.pyc",
            ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"]  # fmt: skip


def jobs_client(dashboard: str | None) -> Any:
    """Ray's job submission client for the cluster's dashboard (with RAY_AUTH_MODE=token, a cluster
    from `ray start` takes its token)."""
    from ray.job_submission import JobSubmissionClient

    if dashboard is None:
        raise UserError(
            "this Ray cluster runs without its dashboard, which Ray's job API needs; start the head with "
            "`ray start --head --include-dashboard true` (ray[default] installed), or run the job in the "
            "foreground with `rlsched run CONFIG --queue Q --address ADDR`"
        )
    url = dashboard if dashboard.startswith("http") else f"http://{dashboard}"
    try:
        return JobSubmissionClient(url)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UserError(f"Ray's job API at {url} does not answer ({err}); is the dashboard up?") from None


def _entrypoint(args: argparse.Namespace, out_dir: Path) -> str:
    """The command Ray's job supervisor runs on the head node, in the uploaded working directory."""
    import shlex

    command = ["python", "-m", "rlsched.cli", "run", str(args.config), "--address", "auto"]
    command += ["--out", str(out_dir), "--queue", args.queue]
    command += ["--requeue"] if args.requeue else []
    command += ["--priority", args.priority] if args.priority else []
    command += [x for kv in args.set for x in ("--set", kv)]
    command += ["--resume"] if args.resume else []
    return shlex.join(command)


def _submit(client: Any, args: argparse.Namespace, out_dir: Path, name: str, wait_s: float = 120.0) -> str:
    """Hand the job to Ray's job API; a head whose job agent is still starting ("No available agent")
    is asked again for up to `wait_s`. Any other refusal is bad input, said in one paragraph."""
    import time
    import uuid

    give_up = time.monotonic() + wait_s
    while True:
        try:
            return str(
                client.submit_job(
                    entrypoint=_entrypoint(args, out_dir),
                    submission_id=f"rlsched-{name}-{uuid.uuid4().hex[:6]}",
                    runtime_env={"working_dir": str(args.working_dir), "excludes": EXCLUDES},
                    metadata={"rlsched_job": name, "out": str(out_dir)},
                )
            )
        except RuntimeError as err:  # the job SDK's refusals: an HTTP status and Ray's reason
            if "No available agent" in str(err) and time.monotonic() < give_up:
                time.sleep(2.0)
                continue
            raise UserError(f"Ray's job API refused the job: {err}") from None


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit `rlsched run --queue Q` through Ray's job API (the working directory uploaded as its
    `runtime_env`); return once the cluster scheduler has registered it."""
    import time

    import ray

    from rlsched.config import load_config

    cfg = load_config(args.config, args.set)  # bad input stops here, before anything is submitted
    out_dir: Path = (args.out or cfg.run.out_dir).resolve()  # where the head node writes (shared storage)
    name = out_dir.name
    with _on_cluster(args.address) as dashboard:
        handle = _scheduler()
        client = jobs_client(dashboard)
        submission = _submit(client, args, out_dir, name)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            view = ray.get(handle.poll.remote(name))
            status = client.get_job_status(submission)
            if view["state"] != "unknown" or status.is_terminal():
                break
            time.sleep(0.5)
    if status.is_terminal() and str(status) != "SUCCEEDED":
        logs = client.get_job_logs(submission)
        raise UserError(f"the job ended at once ({status}); its output:\n{logs[-2000:]}")
    console.print(
        f"submitted {name} to queue {args.queue} as Ray job {submission} (state {view['state']}). "
        f"`rlsched status` shows it, `rlsched logs {name}` (or `ray job logs {submission}`) its output, "
        f"`rlsched cancel {name}` ends it"
    )
    return 0


def _ray_jobs(dashboard: str | None) -> dict[str, Any]:
    """The newest Ray job of each rlsched job name (by its submission's metadata)."""
    if dashboard is None:
        return {}
    newest: dict[str, Any] = {}
    for job in jobs_client(dashboard).list_jobs():
        name = (job.metadata or {}).get("rlsched_job")
        if name and (name not in newest or (job.start_time or 0) > (newest[name].start_time or 0)):
            newest[name] = job
    return newest


def cmd_logs(args: argparse.Namespace) -> int:
    with _on_cluster(args.address) as dashboard:
        job = _ray_jobs(dashboard).get(args.job)
        if job is None:
            raise UserError(f"no job named {args.job} was submitted through Ray's job API on this cluster")
        print(jobs_client(dashboard).get_job_logs(job.submission_id), end="")
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    import ray

    with _on_cluster(args.address):
        rows = ray.get(_scheduler().queue.remote())
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        console.print("no pending jobs")
    for r in rows:
        console.print(
            f"{r['job']}  queue {r['queue']}  {r['priority']}  waiting {r['waiting_s']:.0f} s\n"
            f"  {r['reason']}"
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import ray

    with _on_cluster(args.address) as dashboard:
        status = ray.get(_scheduler().status.remote())
        ray_jobs = _ray_jobs(dashboard)
    status["ray_jobs"] = {name: {"submission_id": j.submission_id, "status": str(j.status)}
                          for name, j in ray_jobs.items()}  # fmt: skip
    if args.json:
        print(json.dumps(status))
        return 0
    print_status(status)
    return 0


def print_status(status: dict[str, Any]) -> None:
    error = f"; last error: {status['error']}" if status["error"] else ""
    console.print(f"cluster scheduler: {status['cycles']} admission cycles{error}")
    for n in status["nodes"]:
        have = ", ".join(f"{n['free'].get(k, 0):g}/{v:g} {k}" for k, v in sorted(n["capacity"].items()))
        console.print(f"  node {n['name']}: free {have}")
    for name, j in status["jobs"].items():
        where = f" on {', '.join(j['nodes'])}" if j["nodes"] else ""
        parts = f"; elastic {j['elastic']}" if j["elastic"] else ""
        why = f": {j['reason']}" if j["reason"] else ""
        ray_job = status.get("ray_jobs", {}).get(name)
        submitted = f" (Ray job {ray_job['submission_id']}: {ray_job['status']})" if ray_job else ""
        again = _requeue_words(j.get("requeues", 0), j.get("failures", 0))
        console.print(
            f"  job {name} [{j['state']}]{submitted} queue {j['queue']} {j['priority']}{where}{parts}{again}"
            f"{why}"
        )


def _requeue_words(requeues: int, failures: int) -> str:
    if not requeues and not failures:
        return ""
    return f"; requeued {requeues}x ({failures} failure{'s' if failures != 1 else ''})"


def cmd_cancel(args: argparse.Namespace) -> int:
    import ray

    with _on_cluster(args.address):
        error = ray.get(_scheduler().cancel.remote(args.job))
    if error:
        raise UserError(error)
    console.print(
        f"cancel sent to {args.job}: a pending job leaves the queue; a running one stops within a second"
    )
    return 0
