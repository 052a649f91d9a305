"""The episode store and prompt stitching, without a model: a tokenizer of single characters."""

from __future__ import annotations

import pytest

from rlsched.model.content import Rendered
from rlsched.serve.episodes import (
    EndReason,
    Episode,
    EpisodeError,
    EpisodeStore,
    Turn,
    continue_prompt,
    training_sequence,
)


class Chars:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


TOK = Chars()


def turn(prompt: str, said: str, *, tool: bool = False, version: int = 0, extends: bool = True) -> Turn:
    return Turn(
        "r", tuple(TOK.encode(prompt)), tuple(TOK.encode(said)), tuple(-0.5 for _ in said), version,
        0.0, 0.0, 0.0, "tool_calls" if tool else "stop", tool, extends,
    )  # fmt: skip


def test_the_next_prompt_keeps_the_recorded_ids_and_tokenizes_only_what_is_new() -> None:
    ep = Episode("e", "e", 0.0, [turn("<u>hi<a>", "CALL", tool=True)])
    ids, extends, where = continue_prompt(ep, Rendered("<u>hi<a>CALL<t>18C<a>"), TOK)  # type: ignore[arg-type]
    assert extends and where is None
    assert TOK.decode(ids) == "<u>hi<a>CALL<t>18C<a>"


def test_an_edited_history_does_not_extend_and_says_where() -> None:
    ep = Episode("e", "e", 0.0, [turn("<u>hi<a>", "CALL", tool=True)])
    ids, extends, where = continue_prompt(ep, Rendered("<u>hi<a>CALX<t>18C<a>"), TOK)  # type: ignore[arg-type]
    assert not extends and where == len("<u>hi<a>CAL")
    assert TOK.decode(ids) == "<u>hi<a>CALX<t>18C<a>"  # the client's text, tokenized whole


def test_a_training_sequence_masks_everything_the_model_did_not_sample() -> None:
    ep = Episode("e", "e", 0.0, [turn("<u>hi<a>", "CALL", tool=True), turn("<u>hi<a>CALL<t>18C<a>", "OK")])
    seq = training_sequence(ep)
    assert TOK.decode(list(seq.prompt_ids)) == "<u>hi<a>"
    assert TOK.decode(list(seq.token_ids)) == "CALL<t>18C<a>OK"
    assert seq.mask == (1.0,) * 4 + (0.0,) * 9 + (1.0,) * 2
    assert seq.logprobs[:4] == (-0.5,) * 4 and seq.logprobs[4:13] == (0.0,) * 9


def test_an_episode_that_is_not_one_sequence_is_refused_for_training() -> None:
    ep = Episode("e", "e", 0.0, [turn("a", "b"), turn("zz", "c", extends=False)])
    with pytest.raises(ValueError, match="not one sequence"):
        training_sequence(ep)


def test_a_reply_without_a_tool_call_ends_the_episode_and_a_later_turn_is_refused() -> None:
    store = EpisodeStore()
    store.record("e", None, turn("p", "CALL", tool=True))
    assert store.open_turn("e") is not None
    store.record("e", None, turn("pCALLr", "done"))
    assert store.get("e").ended is EndReason.FINAL_ANSWER
    with pytest.raises(EpisodeError) as err:
        store.open_turn("e")
    assert err.value.status == 409


def test_an_ended_episode_without_its_reward_in_time_is_dropped_and_counted() -> None:
    now = [100.0]
    store = EpisodeStore(reward_timeout_s=10, clock=lambda: now[0])
    store.record("late", "g", turn("p", "x"))
    store.record("paid", "g", turn("p", "y"))
    store.reward("paid", 1.0)
    now[0] += 11
    assert [e.id for e in store.ready()] == ["paid"]
    assert store.dropped_no_reward == 1 and store.find("late") is None
    with pytest.raises(EpisodeError):
        store.reward("paid", 0.0)  # a second reward is refused


def test_versions_show_a_mixed_episode() -> None:
    ep = Episode("e", "e", 0.0, [turn("a", "b", version=3), turn("ab!", "c", version=4)])
    assert ep.mixed and ep.versions == [3, 4]


def test_an_ended_episode_with_a_reference_goes_to_the_verifier_once_and_the_client_waits() -> None:
    store = EpisodeStore()
    store.record("ref", None, turn("p", "CALL", tool=True), reference="42")
    assert store.to_judge() == []  # still open
    store.record("ref", None, turn("pCALLr", "42"))  # ends it: no tool call
    store.record("plain", None, turn("p", "x"))  # no reference: the client rewards it
    assert [e.id for e in store.to_judge()] == ["ref"] and store.to_judge() == []  # handed out once
    with pytest.raises(EpisodeError) as err:
        store.reward("ref", 0.0)
    assert err.value.status == 409 and "verifier" in str(err.value)
    assert store.reward("ref", 1.0, judged=True).ready


def test_a_turn_that_ran_across_a_weight_swap_makes_the_episode_mixed() -> None:
    import dataclasses

    across = dataclasses.replace(turn("a", "b", version=4), started_version=3)
    ep = Episode("e", "e", 0.0, [across])
    assert ep.mixed and ep.versions == [3, 4]
    assert ep.as_json()["turns"][0]["started_version"] == 3
