"""The cluster commands of `rlsched`: start and stop the scheduler, submit, queue, status, cancel.

Each connects to a Ray cluster (`--address`, default the one on this machine) in the scheduler's
namespace for one call and talks to the scheduler actor (`actors/cluster.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from rlsched.errors import UserError

console = Console(highlight=False, soft_wrap=True, markup=False)  # job names, states, reasons: all text


@contextmanager
def _on_cluster(address: str) -> Iterator[None]:
    """Connect to the Ray cluster at `address` for one command (the scheduler's namespace)."""
    import logging

    import ray

    from actors.cluster import NAMESPACE

    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError) as err:
        raise UserError(
            f"no Ray cluster at {address!r} ({err}); start one (`ray start --head`) or pass --address "
            "host:port of its head node"
        ) from None
    try:
        yield
    finally:
        ray.shutdown()


def _scheduler() -> Any:
    from actors.cluster import find_scheduler

    handle = find_scheduler()
    if handle is None:
        raise UserError(
            "no cluster scheduler runs on this Ray cluster; start one with `rlsched admin start FILE`"
        )
    return handle


def cmd_admin_start(args: argparse.Namespace) -> int:
    from actors.cluster import find_scheduler, start_scheduler
    from rlsched.admin import admission_params, load_admin

    cfg = load_admin(args.file)
    defaults = {q: c.default_priority for q, c in cfg.queues.items() if c.default_priority}
    with _on_cluster(args.address):
        if find_scheduler() is not None:
            raise UserError("a cluster scheduler already runs here; `rlsched admin stop` it first")
        start_scheduler(admission_params(cfg), args.cycle_s, defaults)
    console.print(
        f"cluster scheduler started with {args.file} ({len(cfg.queues)} queues, "
        f"{len(cfg.priority_classes)} priority classes); a cycle every {args.cycle_s:g} s. "
        "Jobs join it with `rlsched submit` or `rlsched run --queue Q`"
    )
    return 0


def cmd_admin_stop(args: argparse.Namespace) -> int:
    from actors.cluster import stop_scheduler

    with _on_cluster(args.address):
        stopped = stop_scheduler()
    console.print("cluster scheduler stopped" if stopped else "no cluster scheduler was running")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """Start `rlsched run --queue Q` detached, its output in OUT/submit.log; return once registered."""
    import subprocess
    import time

    import ray

    from rlsched.config import load_config

    cfg = load_config(args.config, args.set)
    out_dir: Path = args.out or cfg.run.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with _on_cluster(args.address):
        handle = _scheduler()
        address = ray.get_runtime_context().gcs_address
        command = [sys.executable, "-m", "rlsched.cli", "run", str(args.config), "--address", address]
        command += ["--out", str(out_dir), "--queue", args.queue]
        command += ["--priority", args.priority] if args.priority else []
        command += [x for kv in args.set for x in ("--set", kv)]
        log = out_dir / "submit.log"
        with log.open("w") as f:
            proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            view = ray.get(handle.poll.remote(out_dir.name))
            if view["state"] != "unknown" or proc.poll() is not None:
                break
            time.sleep(0.5)
    if proc.poll() is not None and proc.returncode != 0:
        raise UserError(
            f"the job exited at once (status {proc.returncode}); see {log}:\n{log.read_text()[-2000:]}"
        )
    console.print(
        f"submitted {out_dir.name} to queue {args.queue} (pid {proc.pid}, state {view['state']}); output in "
        f"{log}. `rlsched queue` shows why it waits; `rlsched cancel {out_dir.name}` ends it"
    )
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

    with _on_cluster(args.address):
        status = ray.get(_scheduler().status.remote())
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
        console.print(f"  job {name} [{j['state']}] queue {j['queue']} {j['priority']}{where}{parts}{why}")


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
