"""A job's commit log: one SQLite file whose every commit is fsync'ed before the job moves on (SPEC
section 6: the iteration is the unit of commit; a failed persist stops execution).

`synchronous=FULL` in WAL mode: each transaction's WAL frames reach the disk before `commit` returns,
unlike the partial store's `NORMAL`, which may lose the last transactions on power loss. Each
iteration's record carries what a resume needs: the sample ids it trained on, the data cursor, the
weight version, the training seconds so far, the metrics row, and the checkpoint that holds the
model and optimizer state it continues from. Each record is checksummed as it is written, so a log
damaged on disk is refused with the last iteration that reads back intact.

Ids: every sample is `REQUEST@ATTEMPT`, where the attempt is the job's run number (1, then one more
per resume). A request id names the work (an iteration's prompt and group slot, or an endpoint
episode); the sample id names one execution of it. Live records hold each request id at most once
(a UNIQUE index refuses a second use); when a resume redoes iterations whose training state was lost
with a crash, their records move to `redone` with their samples, so the re-execution is counted and
never mistaken for a second use.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlsched.policy.durability import Upload
from rlsched.store.durable import open_fsynced

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS iterations (
    iteration INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    body TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    committed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    sample_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    iteration INTEGER NOT NULL,
    kind TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS redone (
    iteration INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    body TEXT NOT NULL,
    samples TEXT NOT NULL,
    redone_by INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    iteration INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    save_s REAL NOT NULL,
    upload TEXT,
    upload_path TEXT,
    upload_s REAL
);
CREATE TABLE IF NOT EXISTS pending (
    iteration INTEGER PRIMARY KEY,
    body TEXT NOT NULL,
    sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    attempt INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""

LOG_NAME = "commit.sqlite"


class CommitError(RuntimeError):
    """The log cannot be written, or a record would break its rules; the job must stop."""


class CorruptLog(RuntimeError):
    """The log does not read back as written; the message names the last intact iteration."""


@dataclass(frozen=True)
class UsedSample:
    sample_id: str
    request_id: str
    kind: str = "sample"  # or "episode": an endpoint client's captured episode


@dataclass(frozen=True)
class IterationEntry:
    iteration: int
    version: int  # the weight version this iteration published
    cursor: int  # training problems drawn so far (the data position)
    train_s: float  # seconds of training so far, for the remaining time budget
    checkpoint: int | None  # the newest checkpoint at commit time (its model and optimizer)
    metrics: dict[str, Any]
    rng: dict[str, Any] = field(default_factory=dict)  # the driver's generators, as JSON
    used: tuple[UsedSample, ...] = ()

    def body(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def of(cls, body: str) -> IterationEntry:
        raw = json.loads(body)
        raw["used"] = tuple(UsedSample(**u) for u in raw["used"])
        return cls(**raw)


@dataclass(frozen=True)
class CheckpointRow:
    iteration: int
    path: str
    sha256: str
    nbytes: int
    save_s: float
    upload: Upload | None
    upload_path: str | None
    upload_s: float | None


def _sha(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


class CommitLog:
    """One job's log: one connection, shared by the driver's thread and the checkpoint uploader's under
    one lock (a transaction is never interleaved with another thread's statements)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise CommitError(f"no commit log at {self.path}")
        try:
            self._db = open_fsynced(self.path, _SCHEMA, create=create)  # every commit reaches the disk first
            self._db.execute("BEGIN IMMEDIATE")  # proves the write lock can be taken
            self._db.execute("ROLLBACK")
        except sqlite3.DatabaseError as err:
            raise CorruptLog(f"{self.path} is not a readable commit log ({err})") from None
        except (OSError, sqlite3.Error) as err:
            raise CommitError(
                f"cannot write the commit log at {self.path}: {err}. Point checkpoint.dir (or --out) at "
                "a writable directory"
            ) from None
        self._lock = threading.RLock()
        self.attempt = int(self.get("attempt") or 0)

    def close(self) -> None:
        self._db.close()

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _tx(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        with self._lock:
            self._run(statements)

    def _run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for sql, args in statements:
                self._db.execute(sql, args)
            self._db.execute("COMMIT")
        except sqlite3.IntegrityError as err:
            self._db.execute("ROLLBACK")
            raise CommitError(
                f"the commit log refused a record ({err}): a sample would be used twice"
            ) from None
        except (OSError, sqlite3.Error) as err:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise CommitError(f"cannot commit to {self.path}: {err}; the job stops here") from None

    # -- the job ----------------------------------------------------------------------------------

    def get(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM job WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def put(self, **values: str) -> None:
        self._tx(
            [("INSERT OR REPLACE INTO job(key, value) VALUES (?, ?)", (k, v)) for k, v in values.items()]
        )

    def begin_attempt(self) -> int:
        """A run of the job starts (the first, or a resume): its number tags every sample id."""
        self.attempt += 1
        self.put(attempt=str(self.attempt))
        self.note("attempt", f"run {self.attempt} started")
        return self.attempt

    def sample_id(self, request_id: str) -> str:
        return f"{request_id}@{self.attempt}"

    def note(self, kind: str, detail: str) -> None:
        self._tx(
            [
                (
                    "INSERT INTO events(at, attempt, kind, detail) VALUES (?,?,?,?)",
                    (time.time(), self.attempt, kind, detail),
                )
            ]
        )

    def events(self, kind: str | None = None) -> list[tuple[int, str, str]]:
        rows = self._read("SELECT attempt, kind, detail FROM events ORDER BY seq")
        return [(int(a), str(k), str(d)) for a, k, d in rows if kind is None or k == kind]

    # -- iterations ---------------------------------------------------------------------------------

    def commit(self, entry: IterationEntry) -> float:
        """Persist one iteration's record and its samples in one fsync'ed transaction; the seconds it
        took. A sample already used by a live record, or an iteration already committed, is refused."""
        body = entry.body()
        start = time.perf_counter()
        self._tx(
            [
                (
                    "INSERT INTO iterations(iteration, attempt, body, sha256, committed_at) "
                    "VALUES (?,?,?,?,?)",
                    (entry.iteration, self.attempt, body, _sha(body), time.time()),
                ),
                *[
                    (
                        "INSERT INTO samples(sample_id, request_id, iteration, kind) VALUES (?,?,?,?)",
                        (u.sample_id, u.request_id, entry.iteration, u.kind),
                    )
                    for u in entry.used
                ],
            ]
        )
        return time.perf_counter() - start

    def entries(self) -> list[IterationEntry]:
        """Every live record in order, each checked against its checksum (`CorruptLog` naming the
        last intact iteration otherwise)."""
        try:
            check = self._read("PRAGMA quick_check")[0][0]
            rows = self._read("SELECT iteration, body, sha256 FROM iterations ORDER BY iteration")
        except sqlite3.DatabaseError as err:
            raise CorruptLog(f"{self.path} cannot be read ({err}); no iteration can be trusted") from None
        out: list[IterationEntry] = []
        for iteration, body, sha in rows:
            expected = len(out) + 1
            if check != "ok" or _sha(body) != sha or iteration != expected:
                why = (
                    check if check != "ok" else f"iteration {iteration}'s record does not match its checksum"
                )
                if iteration != expected:
                    why = f"iteration {expected} is missing"
                raise CorruptLog(
                    f"{self.path} is damaged ({why}); the last good iteration is {len(out)}. Move the file "
                    "aside and start afresh, or restore it from a copy"
                )
            out.append(IterationEntry.of(body))
        return out

    def used(self) -> dict[str, str]:
        """request id -> the sample id a live record trained on."""
        rows = self._read("SELECT request_id, sample_id FROM samples")
        return {str(r): str(s) for r, s in rows}

    def redo_after(self, iteration: int) -> list[int]:
        """Move the records after `iteration` (and their samples) to `redone`: their training state was
        lost, and a resume runs them again. Returns the iterations moved."""
        rows = self._read(
            "SELECT iteration, attempt, body FROM iterations WHERE iteration > ? ORDER BY iteration",
            (iteration,),
        )
        statements: list[tuple[str, Sequence[Any]]] = []
        for it, attempt, body in rows:
            samples = self._read("SELECT sample_id FROM samples WHERE iteration=?", (it,))
            statements.append(
                (
                    "INSERT INTO redone(iteration, attempt, body, samples, redone_by) VALUES (?,?,?,?,?)",
                    (it, attempt, body, json.dumps([s[0] for s in samples]), self.attempt),
                )
            )
        statements += [
            ("DELETE FROM samples WHERE iteration > ?", (iteration,)),
            ("DELETE FROM iterations WHERE iteration > ?", (iteration,)),
        ]
        self._tx(statements)
        return [int(r[0]) for r in rows]

    def redone(self) -> list[tuple[int, int, list[str]]]:
        """(iteration, the attempt that ran it, its sample ids) for every record a resume redid."""
        rows = self._read("SELECT iteration, attempt, samples FROM redone ORDER BY rowid")
        return [(int(i), int(a), list(json.loads(s))) for i, a, s in rows]

    # -- checkpoints --------------------------------------------------------------------------------

    def add_checkpoint(
        self,
        iteration: int,
        path: str,
        sha256: str,
        nbytes: int,
        save_s: float,
        upload: bool,
        pending: str | None = None,
    ) -> None:
        """A sealed checkpoint, and in the same transaction the work a pipelined job held beside it
        (`pending`: `rlsched.rl.pending.PendingWork` as JSON), checksummed."""
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT OR REPLACE INTO checkpoints(iteration, path, sha256, nbytes, save_s, upload) "
                "VALUES (?,?,?,?,?,?)",
                (iteration, path, sha256, nbytes, save_s, Upload.PENDING.value if upload else None),
            ),
            ("DELETE FROM pending WHERE iteration=?", (iteration,)),
        ]
        if pending is not None:
            statements.append(
                (
                    "INSERT INTO pending(iteration, body, sha256) VALUES (?,?,?)",
                    (iteration, pending, _sha(pending)),
                )
            )
        self._tx(statements)

    def pending(self, iteration: int) -> str | None:
        """The work held beside the checkpoint of `iteration` (None: none was); refused if damaged."""
        rows = self._read("SELECT body, sha256 FROM pending WHERE iteration=?", (iteration,))
        if not rows:
            return None
        body, sha = rows[0]
        if _sha(body) != sha:
            raise CorruptLog(f"the work held beside checkpoint {iteration} does not match its checksum")
        return str(body)

    def set_upload(self, iteration: int, state: Upload, path: str | None, seconds: float | None) -> None:
        self._tx(
            [
                (
                    "UPDATE checkpoints SET upload=?, upload_path=?, upload_s=? WHERE iteration=?",
                    (state.value, path, seconds, iteration),
                )
            ]
        )

    def drop_checkpoint(self, iteration: int) -> None:
        self._tx(
            [
                ("DELETE FROM checkpoints WHERE iteration=?", (iteration,)),
                ("DELETE FROM pending WHERE iteration=?", (iteration,)),
            ]
        )

    def checkpoints(self) -> list[CheckpointRow]:
        rows = self._read(
            "SELECT iteration, path, sha256, nbytes, save_s, upload, upload_path, upload_s FROM checkpoints "
            "ORDER BY iteration"
        )
        return [
            CheckpointRow(int(i), p, s, int(n), float(t), Upload(u) if u else None, up, us)
            for i, p, s, n, t, u, up, us in rows
        ]
