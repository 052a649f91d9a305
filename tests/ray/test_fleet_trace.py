"""The fleet's core, driven by Ray and replayed by the simulator: the same decisions.

An elastic job (`configs/jobs/elastic.yaml`, three iterations) runs in this process with its fleet
recording: a transient instance joins at the start and is reclaimed mid-generation in iteration 3
(its requests resume elsewhere from their saved tokens), another joins over a slow link in
iteration 2, every serving instance reloads after each update, and `rlsched scale` adds one more.
Every event the Ray driver fed the core, replayed through the simulator at its recorded time,
gives the same effects, one for one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.controller import JobController
from actors.scale import ScaleCommand
from rlsched.config import load_config
from rlsched.core.fleet_io import (
    Accepted,
    CutSaved,
    Joined,
    KillInstance,
    Left,
    PullWhy,
    ReadSaved,
    ReloadDone,
    Route,
    StartInstance,
    StartPull,
)
from rlsched.sim.replay import compare, replay

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ROOT = Path(__file__).resolve().parents[2]


def test_a_recorded_elastic_run_replayed_in_virtual_time_makes_the_same_decisions(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs/jobs/elastic.yaml", ["grpo.steps=3", f"run.out_dir={tmp_path}"])
    controller = JobController(cfg, log=lambda _: None, out_dir=tmp_path)
    trace = controller.fleet.record()
    try:
        for it in range(1, 4):
            if it == 2:
                controller.fleet.scale(ScaleCommand(add=1))
            controller.run_iteration(it)
    finally:
        controller.shutdown()
    counts = controller.fleet.counts
    assert counts.preempted >= 1 and counts.resumed + counts.restarted >= 1 and counts.joined >= 3
    replayed = replay(trace)
    assert compare(trace, replayed) == []
    assert replayed.events == len(trace.steps)
    effects = [e for _, out in trace.steps for e in out]
    kinds = {type(e) for e in effects}
    wanted = {StartInstance, StartPull, Joined, Route, Accepted, KillInstance, ReadSaved, CutSaved, Left}
    wanted.add(ReloadDone)
    assert wanted <= kinds, wanted - kinds
    assert {e.why for e in effects if isinstance(e, Joined)} >= {PullWhy.JOIN, PullWhy.RELOAD}
    print(f"fleet trace: {replayed.events} events, {replayed.effects} effects, all equal on replay")
