"""The endpoint's episodes on disk, so that a crash of the job loses none of them: each episode's
latest state (its turns, its end, its reward) is written as it changes, one fsync'ed transaction
each (SQLite, WAL, `synchronous=FULL`), in the run's directory (`episodes.sqlite`).

An episode a training iteration takes is marked with that iteration (`taken`), not deleted: until a
checkpoint holds the training it went into, a crash (or a training group rebuilt from an earlier
checkpoint) runs that iteration again, and the episode must be there to take again. A checkpoint of
iteration c deletes the episodes taken up to c (`checkpointed`). After a crash, `load(after=c)`
gives back every episode not yet taken, or taken after the checkpoint the job resumes from:
open episodes (an agent continues them by their id), episodes waiting for a reward, and those a lost
iteration had taken. An episode dropped for want of a reward is deleted (`forget`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlsched.store.durable import open_fsynced

_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    taken_by INTEGER
);
"""


class JournalError(RuntimeError):
    """The journal cannot be opened or written; the message names the path and the fix."""


class EpisodeJournal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._db = open_fsynced(self.path, _SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise JournalError(
                f"cannot keep the endpoint's episodes at {self.path}: {err}; choose a writable run directory"
            ) from None
        self._lock = threading.Lock()

    def _run(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._lock:
            try:
                with self._db:
                    self._db.executemany(sql, rows)
            except sqlite3.Error as err:
                raise JournalError(f"cannot write the endpoint's episodes to {self.path}: {err}") from None

    def save(self, episode_id: str, body: dict[str, Any]) -> None:
        """The episode as it stands now (not taken)."""
        self._run(
            "INSERT INTO episodes(id, body, taken_by) VALUES (?, ?, NULL) "
            "ON CONFLICT(id) DO UPDATE SET body=excluded.body, taken_by=NULL",
            [(episode_id, json.dumps(body))],
        )

    def taken(self, episode_ids: Sequence[str], iteration: int) -> None:
        self._run("UPDATE episodes SET taken_by=? WHERE id=?", [(iteration, i) for i in episode_ids])

    def checkpointed(self, iteration: int) -> None:
        """A checkpoint holds every iteration up to `iteration`: the episodes they took are done."""
        self._run("DELETE FROM episodes WHERE taken_by <= ?", [(iteration,)])

    def forget(self, episode_ids: Sequence[str]) -> None:
        self._run("DELETE FROM episodes WHERE id=?", [(i,) for i in episode_ids])

    def reset(self) -> None:
        """A new run: nothing of an earlier one in this directory carries over."""
        self._run("DELETE FROM episodes", [()])

    def load(self, after: int) -> list[dict[str, Any]]:
        """Every episode not taken, or taken by an iteration after `after`, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT body FROM episodes WHERE taken_by IS NULL OR taken_by > ? ORDER BY rowid", (after,)
            ).fetchall()
        return [json.loads(body) for (body,) in rows]

    def count(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM episodes").fetchone()
        return int(n)

    def close(self) -> None:
        with self._lock:
            self._db.close()
