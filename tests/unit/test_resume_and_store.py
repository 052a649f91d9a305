"""Group truncation, resume-or-restart, and the durable partial-output store (SQLite WAL)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.policy.resume import Restart, ResumeCost, resume_or_restart, reuse, truncate_group
from rlsched.store.partial import Chunk, PartialStore, StoreError

ROOT = Path(__file__).resolve().parents[2]


def test_spec_group_truncation_4000_and_1000() -> None:
    saved = {"a": 4000, "b": 1000}
    cut = truncate_group(saved, finished=())
    assert cut == {"a": 1000, "b": 1000}
    assert reuse(saved, cut) == (2000, 3000)


def test_finished_members_keep_their_output_and_do_not_set_the_cut() -> None:
    saved = {"a": 4000, "b": 1000, "c": 3000}
    assert truncate_group(saved, finished={"b"}) == {"a": 3000, "c": 3000}
    assert truncate_group(saved, finished=set(saved)) == {}


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 10_000), min_size=1), st.data())
def test_the_cut_never_exceeds_what_any_resumed_member_saved(
    saved: dict[str, int], data: st.DataObject
) -> None:
    finished = data.draw(st.sets(st.sampled_from(sorted(saved))))
    cut = truncate_group(saved, finished)
    assert set(cut) == set(saved) - finished
    assert all(cut[m] <= saved[m] for m in cut) and len(set(cut.values())) <= 1
    reused, regenerated = reuse(saved, cut)
    assert reused + regenerated == sum(saved[m] for m in cut)


def test_resuming_is_chosen_only_when_cheaper() -> None:
    fast_prefill = ResumeCost(prefill_tokens_per_s=5000, decode_tokens_per_s=50)
    assert resume_or_restart(500, 1000, fast_prefill).choice is Restart.RESUME
    # a long prompt, few saved tokens and a costly re-entry: starting over is sooner (SPEC: 96 saved
    # tokens took 12.8 s to resume against 11.6 s from scratch)
    slow = ResumeCost(prefill_tokens_per_s=300, decode_tokens_per_s=100, setup_s=2.0)
    c = resume_or_restart(3000, 96, slow)
    assert c.choice is Restart.RESTART and c.resume_s > c.restart_s
    assert resume_or_restart(100, 0, fast_prefill).choice is Restart.RESTART
    with pytest.raises(ValueError, match="positive"):
        ResumeCost(0, 1)


def test_calc_resume_reproduces_the_spec(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rlsched.cli", "calc", "resume", "--saved", "4000,1000", "--json"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    import json

    got = json.loads(out.stdout)
    assert got["continue_from"] == [1000, 1000] and (got["reused_tokens"], got["regenerated_tokens"]) == (
        2000,
        3000,
    )


def chunk(rid: str, start: int, n: int) -> Chunk:
    return Chunk(rid, start, tuple(range(start, start + n)), tuple(-0.5 * i for i in range(start, start + n)))


def test_chunks_are_saved_in_order_and_handed_back(tmp_path: Path) -> None:
    store = PartialStore(tmp_path / "partial.sqlite")
    store.claim(["r1", "r2"], attempt=1, owner="rollout-0", now=0.0)
    assert store.append([chunk("r1", 0, 3), chunk("r2", 0, 2)], attempt=1, now=1.0) == 2
    assert store.append([chunk("r1", 3, 4)], attempt=1, now=2.0) == 1
    assert store.append([chunk("r1", 3, 4)], attempt=1, now=2.5) == 0  # a repeat is refused
    assert store.append([chunk("r1", 9, 1)], attempt=1, now=2.5) == 0  # so is a gap
    saved = PartialStore(tmp_path / "partial.sqlite").saved("r1")  # another process's connection
    assert saved.tokens == tuple(range(7)) and saved.logprobs == tuple(-0.5 * i for i in range(7))
    assert store.truncate("r1", 5).tokens == tuple(range(5)) and store.saved("r1").tokens == tuple(range(5))
    store.clear(["r1"])
    assert store.saved("r1").tokens == () and store.pending() == 1


def test_a_superseded_attempt_cannot_write_and_heartbeats_keep_a_stream_alive(tmp_path: Path) -> None:
    store = PartialStore(tmp_path / "p.sqlite")
    store.claim(["r1", "r2"], attempt=1, owner="rollout-0", now=0.0)
    store.append([chunk("r1", 0, 2)], attempt=1, now=5.0)
    store.heartbeat(["r2"], attempt=1, now=5.0)
    assert store.stale(now=12.0, older_than_s=10.0) == []
    assert store.stale(now=16.0, older_than_s=10.0) == ["r1", "r2"]
    store.claim(["r1"], attempt=2, owner="rollout-1", now=16.0)  # resumed elsewhere
    assert store.append([chunk("r1", 2, 3)], attempt=1, now=17.0) == 0  # the old owner is refused
    assert store.append([chunk("r1", 2, 3)], attempt=2, now=17.0) == 1
    assert len(store.saved("r1")) == 5


def test_a_store_that_cannot_be_written_is_refused_by_path_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file")
    with pytest.raises(StoreError, match=r"not-a-directory/partial.sqlite.*Set store.path"):
        PartialStore(blocker / "partial.sqlite")
    with pytest.raises(StoreError, match="cannot open"):
        PartialStore(tmp_path)  # a directory, not a file
    locked = sqlite3.connect(tmp_path / "busy.sqlite")
    locked.execute("CREATE TABLE t (x)")
    locked.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    with pytest.raises(StoreError, match=r"busy\.sqlite"):
        PartialStore(tmp_path / "busy.sqlite", busy_timeout_s=0.1)
    locked.rollback()
