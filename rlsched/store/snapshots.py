"""The latest state of a long-lived object, kept where a restart finds it: one SQLite file, each save
one fsync'ed transaction (`synchronous=FULL`) that replaces the last, checksummed.

The cluster scheduler keeps its state core here (`actors/cluster.py`): saved after every event the
core handles and before any of its effects is carried out, so that a scheduler killed at any point
restarts knowing every placement group it may have asked for (a group it never made is found
missing and handled as a failed placement; one it made is found by name and kept). The state is a
pickle: the file is the scheduler's own, on its own node, never read from elsewhere. Each state
carries an `owner` (the scheduler instance that wrote it): a new scheduler never adopts an old one's.
"""

from __future__ import annotations

import hashlib
import pickle
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from rlsched.store.durable import open_fsynced

_SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    body BLOB NOT NULL,
    sha256 TEXT NOT NULL,
    saves INTEGER NOT NULL,
    saved_at REAL NOT NULL
);
"""


class SnapshotError(RuntimeError):
    """The file cannot be written, or a saved state does not read back as written."""


class SnapshotStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._db = open_fsynced(self.path, _SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise SnapshotError(f"cannot keep state at {self.path}: {err}; choose a writable path") from None
        self._lock = threading.Lock()
        self.saves = 0

    def save(self, key: str, owner: str, obj: Any) -> None:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        sha = hashlib.sha256(body).hexdigest()
        with self._lock:
            self.saves += 1
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO state(key, owner, body, sha256, saves, saved_at) "
                    "VALUES (?,?,?,?,?,?)",
                    (key, owner, body, sha, self.saves, time.time()),
                )
            except sqlite3.Error as err:
                raise SnapshotError(f"cannot save state to {self.path}: {err}") from None

    def load(self, key: str, owner: str) -> Any | None:
        """The state `owner` last saved under `key`; None when there is none (or another owner's)."""
        with self._lock:
            row = self._db.execute("SELECT owner, body, sha256 FROM state WHERE key=?", (key,)).fetchone()
        if row is None or row[0] != owner:
            return None
        if hashlib.sha256(row[1]).hexdigest() != row[2]:
            raise SnapshotError(f"the state saved in {self.path} does not match its checksum")
        return pickle.loads(row[1])

    def close(self) -> None:
        with self._lock:
            self._db.close()
