"""A job's multi-turn episodes on disk, round by round, so that an episode whose process dies resumes
from its last committed round and never runs a tool call twice (SPEC section 6's commit, per round).

Three writes, each one fsync'ed SQLite transaction (WAL, `synchronous=FULL`):
- `state`: the episode as it stands (its record, conversation and counts). Written when a reply is
  sampled (with the tool calls it makes: the round is open), when the round's observations are
  appended (the round is closed: its calls' rows go in the same transaction), and when it ends;
- `call`: one tool call done, by its id: its observation, and the files of its environment kind as
  the call left them, together. A resumed round runs only the calls that have no row;
- `load`: what an episode resumes from (None: it never started).

Rows are keyed by the episode's id, which names the iteration (`ITERATION-PROBLEM-MEMBER`), so a job
that runs an iteration again after a crash finds that iteration's episodes where they stood;
`forget_before` drops the rows of iterations whose records are committed. Several processes (the
rollout instances of one job on one machine, or on a shared file system) may write one journal:
SQLite serializes them.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.store.durable import open_fsynced

_SCHEMA = """
CREATE TABLE IF NOT EXISTS states (
    episode TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    episode TEXT NOT NULL,
    call TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (episode, call)
);
CREATE TABLE IF NOT EXISTS files (
    episode TEXT NOT NULL,
    kind TEXT NOT NULL,
    archive BLOB NOT NULL,
    PRIMARY KEY (episode, kind)
);
"""


_UPSERT_STATE = (
    "INSERT INTO states(episode, body) VALUES (?, ?) ON CONFLICT(episode) DO UPDATE SET body=excluded.body"
)
_PUT_CALL = "INSERT OR REPLACE INTO calls(episode, call, body) VALUES (?, ?, ?)"
_PUT_FILES = "INSERT OR REPLACE INTO files(episode, kind, archive) VALUES (?, ?, ?)"
# an episode id's iteration: the number before its first '-'
_ITERATION = "CAST(substr(episode, 1, instr(episode, '-') - 1) AS INTEGER)"


class RoundJournalError(RuntimeError):
    """The journal cannot be opened or written; the message names the path and the fix."""


@dataclass(frozen=True)
class Saved:
    """An episode as its journal left it: its state, the calls of its open round already done (by
    call id), and each environment kind's files."""

    state: dict[str, Any]
    calls: dict[str, dict[str, Any]]
    files: dict[str, bytes]


class RoundJournal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._db = open_fsynced(self.path, _SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise RoundJournalError(
                f"cannot keep the episodes' rounds at {self.path}: {err}; choose a writable run directory"
            ) from None
        self._lock = threading.Lock()

    def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """The statements in one transaction (one fsync)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for sql, row in statements:
                        self._db.execute(sql, row)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as err:
                raise RoundJournalError(f"cannot write the episodes' rounds to {self.path}: {err}") from None

    def state(self, episode: str, body: dict[str, Any], round_closed: bool = False) -> None:
        """The episode as it stands; `round_closed`: its open round's calls are in `body` now."""
        statements: list[tuple[str, Sequence[Any]]] = [(_UPSERT_STATE, (episode, json.dumps(body)))]
        if round_closed:
            statements.append(("DELETE FROM calls WHERE episode=?", (episode,)))
        self._write(statements)

    def call(
        self, episode: str, call: str, body: dict[str, Any], kind: str | None, files: bytes | None
    ) -> None:
        """Call `call` of the open round is done: its observation and, where it ran in an environment,
        that kind's files as it left them."""
        statements: list[tuple[str, Sequence[Any]]] = [(_PUT_CALL, (episode, call, json.dumps(body)))]
        if kind is not None and files is not None:
            statements.append((_PUT_FILES, (episode, kind, files)))
        self._write(statements)

    def load(self, episode: str) -> Saved | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM states WHERE episode=?", (episode,)).fetchone()
            if row is None:
                return None
            calls = self._db.execute("SELECT call, body FROM calls WHERE episode=?", (episode,)).fetchall()
            files = self._db.execute("SELECT kind, archive FROM files WHERE episode=?", (episode,)).fetchall()
        return Saved(
            json.loads(row[0]),
            {call: json.loads(body) for call, body in calls},
            {kind: bytes(archive) for kind, archive in files},
        )

    def forget_before(self, iteration: int) -> None:
        """Drop the episodes of the iterations before `iteration` (their records are committed)."""
        self._write(
            [(f"DELETE FROM {t} WHERE {_ITERATION} < ?", (iteration,)) for t in ("states", "calls", "files")]
        )

    def reset(self) -> None:
        """A new run: nothing of an earlier one in this directory carries over."""
        self._write([(f"DELETE FROM {t}", ()) for t in ("states", "calls", "files")])

    def episodes(self) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT episode FROM states ORDER BY rowid").fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
