"""The endpoint's episodes survive a crash of the job (`rlsched.store.episode_journal`): every change
is on disk as it happens; a new store over the same journal takes back the open episodes, those
waiting for a reward (handed to the verifier again), and those taken by iterations after the
checkpoint the job resumes from; episodes a kept checkpoint holds, or dropped for want of a reward,
do not come back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.model.content import Rendered
from rlsched.serve.episodes import EndReason, Episode, EpisodeStore, continue_prompt
from rlsched.store.episode_journal import EpisodeJournal, JournalError
from tests.unit.test_episodes import TOK, turn


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(path: Path, clock: Clock) -> EpisodeStore:
    return EpisodeStore(reward_timeout_s=60.0, clock=clock, journal=EpisodeJournal(path))


def test_an_episode_reads_back_as_it_was_written() -> None:
    ep = Episode("e", "g", 3.0, [turn("<u>hi<a>", "CALL", tool=True), turn("<u>hi<a>CALL<t>1<a>", "OK")])
    ep.ended, ep.ended_at, ep.reward, ep.reference = EndReason.FINAL_ANSWER, 9.0, 1.0, "42"
    back = Episode.from_json(ep.as_json())
    assert back == ep and back.as_json() == ep.as_json()


def test_a_crash_loses_no_episode_and_gives_back_none_a_checkpoint_holds(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "episodes.sqlite"
    before = store(path, clock)
    before.record("open", None, turn("<u>hi<a>", "CALL", tool=True))  # the agent's tool is running
    before.record("rewarded", None, turn("<u>a<a>", "done"))
    before.reward("rewarded", 1.0)
    before.record("judged", None, turn("<u>b<a>", "7"), reference="7")
    assert [e.id for e in before.to_judge()] == ["judged"]  # handed to a verifier that never answers
    for name, iteration in (("early", 1), ("late", 3)):
        before.record(name, None, turn("<u>c<a>", "x"))
        before.reward(name, 0.0)
        assert [e.id for e in before.take([name], iteration)] == [name]
    before.checkpointed(2)  # the checkpoint of iteration 2 holds what iteration 1 trained on
    assert before.journal is not None and before.journal.count() == 4  # "early" went with it
    clock.now += 500.0  # the job is down for a while

    after = store(path, clock)  # the resumed job, from the checkpoint of iteration 2
    assert after.restore(after=2) == 4
    episodes = {e.id: e for e in after.all()}
    assert set(episodes) == {"open", "rewarded", "judged", "late"}
    assert [e.id for e in after.ready()] == ["rewarded", "late"]  # "late"'s iteration 3 was lost
    judged = episodes["judged"]
    assert not judged.judging and judged.ended_at == clock.now  # judged again, its timeout from now
    assert [e.id for e in after.to_judge()] == ["judged"]
    # the agent continues its open episode by id: the next prompt extends the recorded turn
    ids, extends, _ = continue_prompt(episodes["open"], Rendered("<u>hi<a>CALL<t>18<a>"), TOK)  # type: ignore[arg-type]
    assert extends and TOK.decode(ids) == "<u>hi<a>CALL<t>18<a>"
    after.record("open", None, turn("<u>hi<a>CALL<t>18<a>", "18"))
    assert store(path, clock).find("open") is None  # a store reads the journal only in `restore`
    again = store(path, clock)
    again.restore(after=2)
    reopened = again.find("open")
    assert reopened is not None and len(reopened.turns) == 2  # the new turn is on disk too


def test_a_resume_from_a_later_checkpoint_does_not_give_back_what_it_trained_on(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "episodes.sqlite"
    before = store(path, clock)
    before.record("late", None, turn("<u>c<a>", "x"))
    before.reward("late", 0.0)
    before.take(["late"], 3)
    assert store(path, clock).restore(after=3) == 0  # iteration 3 is in the checkpoint resumed from
    assert store(path, clock).restore(after=2) == 1  # ... but not in the one of iteration 2


def test_an_episode_dropped_for_want_of_a_reward_is_gone_from_the_journal(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "episodes.sqlite"
    before = store(path, clock)
    before.record("silent", None, turn("<u>c<a>", "x"))
    clock.now += 61.0
    assert before.all() == [] and before.dropped_no_reward == 1
    assert store(path, clock).restore(after=0) == 0


def test_a_new_run_starts_with_an_empty_journal(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "episodes.sqlite"
    store(path, clock).record("old", None, turn("<u>c<a>", "x", tool=True))
    journal = EpisodeJournal(path)
    journal.reset()
    assert EpisodeStore(journal=journal).restore(after=0) == 0


def test_a_journal_under_a_file_says_where_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(JournalError, match=r"a-file/episodes.sqlite: .*choose a writable run directory"):
        EpisodeJournal(tmp_path / "a-file" / "episodes.sqlite")
