"""Which cluster each of this machine's running jobs is on: a small file per job under Ray's temporary
root (`RAY_TMPDIR`, else the system's), written by the job's driver when it starts and removed when it
ends, so that `rlsched scale JOB` finds the job's cluster among several embedded ones without asking
every cluster (`actors.scale`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def jobs_dir() -> Path:
    """Where this machine's running jobs record their cluster: under Ray's temporary root, so that
    `rlsched scale` in a shell with the same root finds them."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "rlsched-jobs"


def record_job(job: str, address: str) -> Callable[[], None]:
    """Record that `job`'s driver (this process) runs on the cluster whose GCS is at `address`; the
    function that removes the record again (only this driver's: a later job of the name keeps its
    own)."""
    path = jobs_dir() / f"{job}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"job": job, "address": address, "pid": os.getpid()}
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(body))
    partial.replace(path)

    def forget() -> None:
        if _read(path).get("pid") == os.getpid():
            path.unlink(missing_ok=True)

    return forget


def _read(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def recorded(job: str) -> str | None:
    """The GCS address of the cluster `job`'s driver recorded, if that driver is still alive."""
    body = _read(jobs_dir() / f"{job}.json")
    address = body.get("address")
    return address if isinstance(address, str) and _alive(body.get("pid")) else None


def recorded_jobs() -> list[str]:
    """The jobs whose drivers recorded a cluster here and are alive."""
    if not jobs_dir().is_dir():
        return []
    return sorted(p.stem for p in jobs_dir().glob("*.json") if recorded(p.stem) is not None)
