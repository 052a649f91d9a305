"""The assembly rule both drivers use: whole groups only, judged, at an admissible version."""

from __future__ import annotations

from rlsched.engine.protocol import FinishReason, RequestId, Sample, WeightVersion
from rlsched.rl.assemble import assemble
from verifiers.protocol import ExecutionFault, FaultKind, Verdict


def sample(rid: str, version: int) -> Sample:
    return Sample(RequestId(rid), (1, 2), (3,), (-0.5,), "x", FinishReason.STOP, WeightVersion(version))


def test_groups_are_used_whole_judged_and_fresh() -> None:
    ids = [RequestId(f"g{g}-{k}") for g in range(3) for k in range(2)]
    versions = {"g0": 5, "g1": 5, "g2": 3}
    samples = {r: sample(r, versions[r.split("-")[0]]) for r in ids}
    outcomes = {r: Verdict(r, float(r.endswith("1")), r.endswith("1")) for r in ids}
    outcomes[RequestId("g1-0")] = ExecutionFault("g1-0", FaultKind.CRASH, "boom")
    batch = assemble(ids, samples, outcomes, group_size=2, oldest=4)
    assert [round(i.advantage, 3) for i in batch.items] == [-1.0, 1.0]  # g0 only
    assert batch.faults == 1 and batch.stale_dropped == 2  # g1 has a fault, g2 is too old
    everything = assemble(ids, samples, outcomes, group_size=2)  # no staleness rule: g2 counts
    assert len(everything.items) == 4 and everything.stale_dropped == 0
