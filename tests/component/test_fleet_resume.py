"""The fleet's resume path without Ray: the core decides the group cut and resume or restart from
what the durable store saved; the store keeps what each new attempt starts from; the finished
sample gets its saved log-probabilities back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlsched.config import load_config
from rlsched.config_params import fleet_params
from rlsched.core import fleet_io as fx
from rlsched.core.fleet import FleetCore
from rlsched.engine.protocol import FinishReason, RequestId, Sample, WeightVersion
from rlsched.policy.lifecycle import Leave
from rlsched.rl.requests import group_of
from rlsched.store.partial import Chunk, PartialStore
from rlsched.store.resumes import Resumes


def saved_store(tmp_path: Path, saved: dict[str, int]) -> PartialStore:
    store = PartialStore(tmp_path / "partial.sqlite")
    store.claim(list(saved), 1, "transient-0", 0.0)
    chunks = [
        Chunk(rid, 0, tuple(range(3, 3 + n)), tuple(-0.1 * (i + 1) for i in range(n)))
        for rid, n in saved.items()
    ]
    store.append(chunks, 1, 0.0)
    return store


def reclaim(core: FleetCore, resumes: Resumes) -> list[fx.Effect]:
    """transient-0 (running every request) is preempted; the driver's part: read, then cut."""
    effects = core.handle(fx.Reclaimed(1.0, "transient-0", Leave.PREEMPTED, "a test"))
    (read,) = [e for e in effects if isinstance(e, fx.ReadSaved)]
    effects = core.handle(fx.SavedRead(1.0, "transient-0", resumes.read(read.requests)))
    for e in effects:
        if isinstance(e, fx.CutSaved):
            resumes.cut(e.request_id, e.keep)
    return effects


def fleet(overrides: list[str], ids: list[str]) -> FleetCore:
    core = FleetCore(fleet_params(load_config(None, overrides)))
    core.handle(fx.Published(0.0, 0))
    for name in ("transient-0", "rollout-0"):
        core.handle(fx.Added(0.0, name))
        core.handle(fx.PullDone(0.0, name, 0))
    core.handle(fx.Arrived(0.0, "rollout-0", "nothing"))  # not running there: dropped, not accepted
    (route,) = core.handle(fx.Begun(0.0, 3, tuple(fx.RequestSpec(r, group_of(r), 2) for r in ids)))
    assert isinstance(route, fx.Route) and route.name == "transient-0" and route.requests == tuple(ids)
    return core


def test_interrupted_members_continue_from_the_shortest_saved_length(tmp_path: Path) -> None:
    store = saved_store(tmp_path, {"3-7-0": 40, "3-7-1": 10})
    resumes = Resumes(store)
    core = fleet([], ["3-7-0", "3-7-1"])
    effects = reclaim(core, resumes)
    (route,) = [e for e in effects if isinstance(e, fx.Route)]
    assert route.name == "rollout-0" and route.resume == (10, 10)  # the other instance takes them
    assert resumes.resume_ids("3-7-0") == tuple(range(3, 13))
    assert len(store.saved("3-7-0")) == 10  # the store holds what the new attempt starts from
    c = core.counts
    assert (c.resumed, c.reused_tokens, c.regenerated_tokens, c.duplicates_dropped) == (2, 20, 30, 1)
    # the finished sample carries the saved log-probabilities for the tokens it did not generate
    new = Sample(
        RequestId("3-7-0"), (1, 2), (*range(3, 13), 99), tuple([-9.0] * 11), "", FinishReason.LENGTH,
        WeightVersion(2), resumed_tokens=10,
    )  # fmt: skip
    (accepted,) = core.handle(fx.Arrived(2.0, "rollout-0", "3-7-0"))
    assert isinstance(accepted, fx.Accepted) and accepted.resumed is not None and accepted.resumed.kept == 10
    done = resumes.finish(new)
    assert done.resumed_from == 10 and done.logprob_drift > 8
    stitched = done.sample
    assert (
        stitched.logprobs[:10] == tuple(-0.1 * (i + 1) for i in range(10)) and stitched.logprobs[10] == -9.0
    )
    assert dataclasses.replace(stitched, logprobs=new.logprobs) == new
    assert len(store.saved("3-7-0")) == 0  # a finished sample's chunks are cleared


def test_a_costly_resume_restarts_from_the_prompt(tmp_path: Path) -> None:
    store = saved_store(tmp_path, {"3-1-0": 30})
    resumes = Resumes(store)
    core = fleet(["rollout.resume_setup_s=1000"], ["3-1-0"])
    effects = reclaim(core, resumes)
    (route,) = [e for e in effects if isinstance(e, fx.Route)]
    assert route.resume == (0,) and resumes.resume_ids("3-1-0") == ()
    assert core.counts.restarted == 1 and len(store.saved("3-1-0")) == 0
