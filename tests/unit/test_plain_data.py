"""What crosses from a sandboxed solution to the host is built within a budget of total work
(issue 41, finding 7): a reply whose sets cost too many hash comparisons is refused before it is
built, whatever share of its items collide."""

from __future__ import annotations

import time

import pytest

from verifiers.plain_data import MAX_COLLISION_WORK, NotPlainData, decode, dumps, loads

P = 2**61 - 1  # ints that differ by a multiple of P share a hash


def test_plain_values_round_trip() -> None:
    value = {"a": [1, 2.5, (3, b"x")], "s": {1, 2}, "f": frozenset({"y"}), "c": 1 + 2j, "n": None}
    assert loads(dumps(value)) == value


def test_a_set_half_of_whose_items_share_a_hash_is_refused_quickly() -> None:
    """It passed the old guard (distinct hashes >= half the items) and took the host seconds to build."""
    colliding = [k * P for k in range(1, 30_000)]
    reply = {"set": [*colliding, *range(30_000)]}
    start = time.perf_counter()
    with pytest.raises(NotPlainData, match="hash collisions would cost more than"):
        decode(reply)
    assert time.perf_counter() - start < 0.5


def test_the_budget_is_shared_by_every_set_of_a_reply() -> None:
    """Many small sets, each with a few collisions, add up to one budget."""
    one = {"set": [k * P for k in range(1, 1_000)]}  # about 500,000 comparisons
    assert len(decode(one)) == 999
    with pytest.raises(NotPlainData):
        decode([one, one, one])
    assert 999 * 998 // 2 < MAX_COLLISION_WORK < 3 * 999 * 998 // 2
