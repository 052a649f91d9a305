"""Durable partial outputs: the tokens each in-flight generation has produced, saved as they come,
so that a reclaimed instance's work resumes elsewhere instead of starting over (SPEC section 6,
streaming steps).

SQLite in WAL mode (readers never block the writer; one file, nothing to run). A rollout instance
owns each request it runs for one attempt (`claim`); every `flush_s` it appends each live request's
new tokens and log-probabilities as one chunk, and the same transaction refreshes the request's
heartbeat, so a stale-task detector (`stale`) never reclaims a stream that is still producing. A
chunk is accepted only from the attempt that owns the request: a reclaimed instance that is still
running cannot write into its successor's output. On retry, `saved` hands the stored chunks to the
new attempt (after `truncate` when its group is cut back); once the sample is complete its chunks
are cleared.

Failures are values or clear errors: opening a store that cannot be written raises `StoreError`
naming the path and the fix before any work starts.
"""

from __future__ import annotations

import sqlite3
import threading
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    request_id TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    owner TEXT NOT NULL,
    heartbeat REAL NOT NULL,
    saved INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS chunks (
    request_id TEXT NOT NULL,
    start INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    PRIMARY KEY (request_id, start)
);
"""


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the path and what to do."""


@dataclass(frozen=True)
class Chunk:
    """New output of one request since its last chunk."""

    request_id: str
    start: int  # index of the first token within the request's output
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Saved:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.tokens)


class PartialStore:
    """One SQLite file; one connection per process (thread-safe within it)."""

    def __init__(self, path: Path, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
            self._db.executescript(_SCHEMA)
            self._db.execute("BEGIN IMMEDIATE")  # proves we can take the write lock
            self._db.execute("ROLLBACK")
        except (OSError, sqlite3.Error) as err:
            raise StoreError(
                f"cannot open the partial-output store at {self.path}: {err}. Set store.path to a file "
                "in a writable directory (on a multi-node cluster, one every rollout node can reach)"
            ) from None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, rows: Iterable[Sequence[object]]) -> int:
        with self._lock, self._db:
            return self._db.executemany(sql, rows).rowcount

    # -- the instance's side --------------------------------------------------------------------
    def claim(self, request_ids: Sequence[str], attempt: int, owner: str, now: float) -> None:
        """`owner` runs these requests for `attempt`; an older attempt's writes are refused from now."""
        self._write(
            "INSERT INTO tasks(request_id, attempt, owner, heartbeat) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(request_id) DO UPDATE SET attempt=excluded.attempt, owner=excluded.owner, "
            "heartbeat=excluded.heartbeat",
            [(r, attempt, owner, now) for r in request_ids],
        )

    def append(self, chunks: Sequence[Chunk], attempt: int, now: float) -> int:
        """Store the chunks of the requests this attempt still owns, and beat their hearts; returns
        how many were accepted (a superseded attempt's are dropped)."""
        with self._lock, self._db:
            accepted = 0
            for c in chunks:
                if not c.tokens:  # nothing new: a heartbeat
                    cur = self._db.execute(
                        "UPDATE tasks SET heartbeat=? WHERE request_id=? AND attempt=?",
                        (now, c.request_id, attempt),
                    )
                    accepted += cur.rowcount
                    continue
                cur = self._db.execute(
                    "UPDATE tasks SET heartbeat=?, saved=? WHERE request_id=? AND attempt=? AND saved=?",
                    (now, c.start + len(c.tokens), c.request_id, attempt, c.start),
                )
                if cur.rowcount:
                    self._db.execute(
                        "INSERT OR REPLACE INTO chunks(request_id, start, tokens, logprobs) VALUES (?,?,?,?)",
                        (
                            c.request_id,
                            c.start,
                            array("i", c.tokens).tobytes(),
                            array("d", c.logprobs).tobytes(),
                        ),
                    )
                    accepted += 1
            return accepted

    def heartbeat(self, request_ids: Sequence[str], attempt: int, now: float) -> None:
        self._write(
            "UPDATE tasks SET heartbeat=? WHERE request_id=? AND attempt=?",
            [(now, r, attempt) for r in request_ids],
        )

    # -- the controller's side ------------------------------------------------------------------
    def saved(self, request_id: str) -> Saved:
        with self._lock:
            rows = self._db.execute(
                "SELECT tokens, logprobs FROM chunks WHERE request_id=? ORDER BY start", (request_id,)
            ).fetchall()
        tokens: array[int] = array("i")
        logprobs: array[float] = array("d")
        for t, lp in rows:
            tokens.frombytes(t)
            logprobs.frombytes(lp)
        return Saved(tuple(tokens), tuple(logprobs))

    def truncate(self, request_id: str, keep: int) -> Saved:
        """Cut a request's saved output back to its first `keep` tokens (group truncation)."""
        saved = self.saved(request_id)
        kept = Saved(saved.tokens[:keep], saved.logprobs[:keep])
        with self._lock, self._db:
            self._db.execute("DELETE FROM chunks WHERE request_id=?", (request_id,))
            self._db.execute("UPDATE tasks SET saved=? WHERE request_id=?", (len(kept), request_id))
            if kept.tokens:
                self._db.execute(
                    "INSERT INTO chunks(request_id, start, tokens, logprobs) VALUES (?, 0, ?, ?)",
                    (request_id, array("i", kept.tokens).tobytes(), array("d", kept.logprobs).tobytes()),
                )
        return kept

    def stale(self, now: float, older_than_s: float) -> list[str]:
        """Requests whose owner has not beaten their heart for `older_than_s`."""
        with self._lock:
            rows = self._db.execute(
                "SELECT request_id FROM tasks WHERE heartbeat < ? ORDER BY request_id", (now - older_than_s,)
            ).fetchall()
        return [r[0] for r in rows]

    def clear(self, request_ids: Sequence[str]) -> None:
        """The samples are complete: their chunks and task rows go."""
        with self._lock, self._db:
            self._db.executemany("DELETE FROM chunks WHERE request_id=?", [(r,) for r in request_ids])
            self._db.executemany("DELETE FROM tasks WHERE request_id=?", [(r,) for r in request_ids])

    def reset(self) -> None:
        """Forget everything (a new job starts; its request ids may repeat an earlier job's)."""
        with self._lock, self._db:
            self._db.execute("DELETE FROM chunks")
            self._db.execute("DELETE FROM tasks")

    def pending(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM tasks").fetchone()
        return int(n)
