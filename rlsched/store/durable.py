"""One way to open the SQLite files whose commits must survive a crash: the commit log, the scheduler's
state, the endpoint's episode journal.

WAL mode (readers never block the writer) with `synchronous=FULL`: a commit returns only once its
WAL frames are on disk (the partial-output store keeps `NORMAL`, which may lose its last
transactions on power loss; these files must not). Autocommit (`isolation_level=None`): each caller
opens its own transactions; one connection per process, shared by its threads under the caller's
lock. Errors (`OSError`, `sqlite3.Error`) are the caller's to name: each says what the file is for.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def open_fsynced(path: Path, schema: str, *, create: bool = True) -> sqlite3.Connection:
    """A connection to `path` (its directory made when `create`), every commit fsync'ed, `schema`
    applied (`CREATE TABLE IF NOT EXISTS ...`)."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(schema)
    return db
