"""Tokenizers through transformers: the shipped base's byte-level one round-trips exactly, and the
incremental detokenizer never splits a character, on it and on a trained BPE with merges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlsched.model.checkpoint import BASE_CHECKPOINT
from rlsched.model.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.tiny_models import CHATML, tokenizer

TOK = Tokenizer.from_dir(BASE_CHECKPOINT)  # ids 0-5 special, 6-261 the bytes in order
BPE = Tokenizer(tokenizer(CHATML, "<|im_end|>", "<pad>"))  # byte-level BPE with merges
BYTE_OFFSET, IM_END_ID = 6, 5


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


@given(st.text(min_size=1, max_size=40))
def test_incremental_detokenizer_matches_full_decode_with_merges(text: str) -> None:
    detok = IncrementalDetokenizer(BPE)
    ids = BPE.encode(text)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == BPE.decode(ids)


def test_special_token_ids_are_found_by_text() -> None:
    assert TOK.id_of("<|im_end|>") == IM_END_ID
    assert TOK.id_of("ab") is None  # two tokens
    assert BPE.id_of("<|im_end|>") is not None and BPE.id_of("<|im_end|>") in BPE.special_ids
