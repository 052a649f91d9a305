"""The fleet's resume path without Ray: saved tokens from the store, the group cut, resume or restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from actors.fleet import Fleet
from rlsched.config import load_config
from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    RequestId,
    Sample,
    SamplingParams,
    WeightVersion,
)
from rlsched.store.partial import Chunk, PartialStore


def fleet_with_saved(
    tmp_path: Path, saved: dict[str, int], overrides: list[str]
) -> tuple[Fleet, PartialStore]:
    cfg = load_config(None, overrides)
    fleet = Fleet(cfg, None, tmp_path / "partial.sqlite", [], lambda: 0.0, lambda _: None)
    store = PartialStore(tmp_path / "partial.sqlite")
    store.claim(list(saved), 1, "transient-0", 0.0)
    store.append(
        [
            Chunk(rid, 0, tuple(range(3, 3 + n)), tuple(-0.1 * (i + 1) for i in range(n)))
            for rid, n in saved.items()
        ],
        1,
        0.0,
    )
    return fleet, store


def request(rid: str) -> GenerationRequest:
    return GenerationRequest(RequestId(rid), (1, 2), SamplingParams(max_tokens=64))


def test_interrupted_members_continue_from_the_shortest_saved_length(tmp_path: Path) -> None:
    fleet, store = fleet_with_saved(tmp_path, {"3-7-0": 40, "3-7-1": 10}, [])
    back = fleet._resume_group([request("3-7-0"), request("3-7-1")], "transient-0", now=1.0)
    assert [len(r.resume_ids) for r in back] == [10, 10]
    assert back[0].resume_ids == tuple(range(3, 13))
    assert len(store.saved("3-7-0")) == 10  # the store holds what the new attempt starts from
    assert (fleet.counts.resumed, fleet.counts.reused_tokens, fleet.counts.regenerated_tokens) == (2, 20, 30)
    # the finished sample carries the saved log-probabilities for the tokens it did not generate
    new = Sample(
        RequestId("3-7-0"), (1, 2), (*range(3, 13), 99), tuple([-9.0] * 11), "", FinishReason.LENGTH,
        WeightVersion(2), resumed_tokens=10,
    )  # fmt: skip
    stitched = fleet._stitch(new)
    assert (
        stitched.logprobs[:10] == tuple(-0.1 * (i + 1) for i in range(10)) and stitched.logprobs[10] == -9.0
    )
    assert dataclasses.replace(stitched, logprobs=new.logprobs) == new


def test_a_costly_resume_restarts_from_the_prompt(tmp_path: Path) -> None:
    fleet, store = fleet_with_saved(tmp_path, {"3-1-0": 30}, ["rollout.resume_setup_s=1000"])
    (back,) = fleet._resume_group([request("3-1-0")], "transient-0", now=1.0)
    assert back.resume_ids == () and fleet.counts.restarted == 1 and len(store.saved("3-1-0")) == 0
