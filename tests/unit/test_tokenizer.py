"""Byte-level tokenizer: exact round trips, and an incremental detokenizer that never splits a character."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlsched.model.tokenizer import BYTE_OFFSET, IM_END_ID, ByteTokenizer, IncrementalDetokenizer

TOK = ByteTokenizer()


@given(st.text(max_size=60))
def test_round_trip_any_text(text: str) -> None:
    ids = TOK.encode(text)
    assert ids == [BYTE_OFFSET + x for x in text.encode("utf-8")] or "<" in text
    assert TOK.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids() -> None:
    assert TOK.encode("a<|im_end|>b") == [BYTE_OFFSET + ord("a"), IM_END_ID, BYTE_OFFSET + ord("b")]
    assert TOK.decode([IM_END_ID]) == ""
    assert TOK.decode([IM_END_ID], skip_special_tokens=False) == "<|im_end|>"


@given(st.text(min_size=1, max_size=30))
def test_incremental_detokenizer_never_emits_half_a_character(text: str) -> None:
    detok = IncrementalDetokenizer(TOK)
    deltas = [detok.push(i) for i in TOK.encode(text)]
    assert "\ufffd" not in "".join(deltas) or "\ufffd" in text
    assert "".join(deltas) + detok.flush() == TOK.decode(TOK.encode(text))


def test_multibyte_character_appears_only_when_complete() -> None:
    detok = IncrementalDetokenizer(TOK)
    ids = TOK.encode("€")  # three bytes
    assert [detok.push(i) for i in ids] == ["", "", "€"]


def test_truncated_character_becomes_replacement_at_flush() -> None:
    detok = IncrementalDetokenizer(TOK)
    assert detok.push(TOK.encode("€")[0]) == ""
    assert detok.flush() == "\ufffd"
