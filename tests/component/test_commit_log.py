"""The commit log on real SQLite files: every commit synchronous=FULL, records checksummed and
refused when damaged (naming the last good iteration), a sample never used twice, redone iterations
kept apart; and checkpoint directories that are whole or absent, verified, uploaded in order."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from rlsched.policy.durability import Upload
from rlsched.store import checkpoints as ckpt
from rlsched.store.commit_log import CommitError, CommitLog, CorruptLog, IterationEntry, UsedSample


def _entry(log: CommitLog, i: int, requests: int = 3) -> IterationEntry:
    used = tuple(UsedSample(log.sample_id(f"{i}/{k}"), f"{i}/{k}") for k in range(requests))
    return IterationEntry(i, i, i * requests, float(i), None, {"iteration": i, "reward": 0.5}, used=used)


def _log(tmp_path: Path, iterations: int = 3) -> CommitLog:
    log = CommitLog(tmp_path / "commit.sqlite")
    log.begin_attempt()
    for i in range(1, iterations + 1):
        log.commit(_entry(log, i))
    return log


def test_commits_are_fsynced_and_read_back(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert log._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert [e.iteration for e in log.entries()] == [1, 2, 3]
    assert log.entries()[1].used[0] == UsedSample("2/0@1", "2/0")
    log.close()
    again = CommitLog(tmp_path / "commit.sqlite", create=False)  # a new process's view
    assert [e.cursor for e in again.entries()] == [3, 6, 9] and again.attempt == 1


def test_a_sample_is_never_used_twice(tmp_path: Path) -> None:
    log = _log(tmp_path, 1)
    twice = IterationEntry(2, 2, 6, 2.0, None, {}, used=(UsedSample("1/0@9", "1/0"),))
    with pytest.raises(CommitError, match="used twice"):
        log.commit(twice)
    assert [e.iteration for e in log.entries()] == [1]  # the refused record left nothing behind
    with pytest.raises(CommitError):
        log.commit(_entry(log, 1))  # an iteration is committed once


def test_a_damaged_record_is_refused_naming_the_last_good_iteration(tmp_path: Path) -> None:
    log = _log(tmp_path, 5)
    log.close()
    db = sqlite3.connect(tmp_path / "commit.sqlite")
    db.execute("UPDATE iterations SET body = replace(body, '0.5', '0.9') WHERE iteration = 4")
    db.commit()
    db.close()
    with pytest.raises(CorruptLog, match="last good iteration is 3"):
        CommitLog(tmp_path / "commit.sqlite", create=False).entries()


def test_a_file_that_is_not_a_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "commit.sqlite"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(CorruptLog, match="not a readable commit log"):
        CommitLog(path, create=False)
    with pytest.raises(CommitError, match="no commit log"):
        CommitLog(tmp_path / "absent.sqlite", create=False)


def test_an_unwritable_place_is_refused_before_anything_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CommitError, match="cannot write the commit log"):
        CommitLog(blocker / "commit.sqlite")  # a file where a directory should be


def test_redone_iterations_move_aside_and_their_requests_run_again(tmp_path: Path) -> None:
    log = _log(tmp_path, 5)
    log.begin_attempt()  # the resume
    assert log.redo_after(3) == [4, 5]
    assert [e.iteration for e in log.entries()] == [1, 2, 3]
    assert [(i, a, s[0]) for i, a, s in log.redone()] == [(4, 1, "4/0@1"), (5, 1, "5/0@1")]
    log.commit(_entry(log, 4))  # the same request ids, a new attempt's sample ids
    assert log.used()["4/0"] == "4/0@2"


def test_checkpoint_rows_and_uploads(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    log.add_checkpoint(2, "/x/iter-2", "ab" * 32, 10, 0.5, upload=True)
    assert log.checkpoints()[0].upload is Upload.PENDING
    done = threading.Thread(target=log.set_upload, args=(2, Upload.DONE, "/y/iter-2", 0.1))
    done.start()  # the uploader reports from its own thread
    done.join()
    row = log.checkpoints()[0]
    assert (row.upload, row.upload_path) == (Upload.DONE, "/y/iter-2")


# -- checkpoint directories ---------------------------------------------------------------------------


def _write(root: Path, iteration: int) -> ckpt.Saved:
    tmp = ckpt.partial_dir(root, iteration)
    (tmp / "train_state").mkdir()
    (tmp / "train_state" / "shard.bin").write_bytes(os.urandom(4096))
    (tmp / "meta.json").write_text(f'{{"iteration": {iteration}}}')
    return ckpt.seal(root, iteration)


def test_a_checkpoint_is_sealed_whole_and_verified(tmp_path: Path) -> None:
    saved = _write(tmp_path, 7)
    assert saved.path.name == "iter-0000007" and not (tmp_path / "iter-0000007.partial").exists()
    ckpt.verify(saved.path, saved.sha256)
    (saved.path / "train_state" / "shard.bin").write_bytes(b"torn")
    with pytest.raises(ckpt.CheckpointError, match="does not match"):
        ckpt.verify(saved.path, saved.sha256)


def test_an_unsealed_checkpoint_is_not_one(tmp_path: Path) -> None:
    tmp = ckpt.partial_dir(tmp_path, 3)
    (tmp / "meta.json").write_text("{}")
    with pytest.raises(ckpt.CheckpointError, match="not a whole checkpoint"):
        ckpt.verify(tmp)


def test_uploads_run_in_order_in_the_background_and_failures_are_reported(tmp_path: Path) -> None:
    outcomes: list[tuple[int, bool]] = []
    dest = tmp_path / "bucket"
    up = ckpt.Uploader(dest, lambda i, copy, s, err: outcomes.append((i, copy is not None)))
    first, second = _write(tmp_path / "local", 1), _write(tmp_path / "local", 2)
    up.submit(1, first.path)
    up.submit(2, second.path)
    assert up.drain(60)
    ckpt.verify(dest / "iter-0000002", second.sha256)
    (dest / "iter-0000003.partial").mkdir()
    up.submit(3, tmp_path / "local" / "iter-0000003")  # never sealed: the copy fails
    assert up.close(60)
    assert outcomes == [(1, True), (2, True), (3, False)]


# -- the scheduler's state file -------------------------------------------------------------------------


def test_a_snapshot_comes_back_only_to_its_owner_and_only_intact(tmp_path: Path) -> None:
    from rlsched.store.snapshots import SnapshotError, SnapshotStore

    store = SnapshotStore(tmp_path / "s.sqlite")
    store.save("core", "owner-a", {"jobs": [1, 2, 3]})
    store.save("core", "owner-a", {"jobs": [1, 2, 3, 4]})  # each save replaces the last
    assert store.load("core", "owner-a") == {"jobs": [1, 2, 3, 4]}
    assert store.load("core", "owner-b") is None  # a new scheduler never adopts an old one's state
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2
    store.close()
    db = sqlite3.connect(tmp_path / "s.sqlite")
    db.execute("UPDATE state SET body = zeroblob(length(body))")
    db.commit()
    db.close()
    with pytest.raises(SnapshotError, match="checksum"):
        SnapshotStore(tmp_path / "s.sqlite").load("core", "owner-a")


def test_the_work_a_pipelined_job_held_is_kept_with_its_checkpoint_and_pruned_with_it(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.add_checkpoint(2, "/x/iter-2", "ab" * 32, 10, 0.5, upload=False, pending='{"groups":[]}')
    log.add_checkpoint(3, "/x/iter-3", "cd" * 32, 10, 0.5, upload=False)
    assert log.pending(2) == '{"groups":[]}' and log.pending(3) is None
    log.close()
    again = CommitLog(tmp_path / "commit.sqlite", create=False)
    assert again.pending(2) == '{"groups":[]}'
    again.drop_checkpoint(2)
    assert again.pending(2) is None
    again.add_checkpoint(3, "/x/iter-3", "cd" * 32, 10, 0.5, upload=False, pending='{"x":1}')
    again.close()
    with sqlite3.connect(tmp_path / "commit.sqlite") as db:
        db.execute("UPDATE pending SET body='{\"x\":2}' WHERE iteration=3")
    damaged = CommitLog(tmp_path / "commit.sqlite", create=False)
    with pytest.raises(CorruptLog, match="checkpoint 3 does not match its checksum"):
        damaged.pending(3)
