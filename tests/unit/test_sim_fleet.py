"""Elastic instances in the simulator: joins over the shared link, reclaims, resume or restart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rlsched.errors import UserError
from rlsched.metrics.spans import SpanKind
from rlsched.sim.engine import Simulator
from rlsched.sim.fleet import Link, Transfers
from rlsched.sim.jobs import simulate
from rlsched.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "configs/scenarios/elastic.yaml"


def test_six_joiners_behind_a_shared_egress_are_ready_after_the_spec_bound_plus_load() -> None:
    run = simulate(load_scenario(SCENARIO, ["seeds=1"]), seed=0)
    joiners = {n: life for n, life in run.instances.items() if "transient-0." in n}
    assert len(joiners) == 6
    for life in joiners.values():  # 6 x 16,381,470,720 bytes through 200 Gbit/s: 3.93 s, then 5 s of load
        assert life["preparing_s"] == pytest.approx(3.93 + 5.0, abs=0.01)
        assert life["lifetime_s"] == pytest.approx(120.0)
        assert 0.0 < life["not_generating"] < 1.0
    statics = [life for n, life in run.instances.items() if "rollout-" in n]
    for life in statics:  # the first version, as at runtime: 2 receivers at their 50 Gbit/s cap, then load
        assert life["preparing_s"] == pytest.approx(16_381_470_720 * 8 / 50e9 + 5.0, abs=0.01)


def test_every_sample_is_generated_once_per_iteration_despite_reclaims() -> None:
    cfg = load_scenario(SCENARIO, ["seeds=1"])
    run = simulate(cfg, seed=1)
    assert run.resumed + run.restarted > 0  # the six were reclaimed mid-generation
    gen = [s for s in run.spans if s.kind is SpanKind.GENERATE]
    per_iteration = Counter(s.iteration for s in gen)
    assert set(per_iteration.values()) == {cfg.jobs[0].samples}
    assert len({(s.iteration, s.id) for s in gen}) == len(gen)
    lanes = {s.attrs["lane"] for s in gen}
    assert any("transient-0." in lane for lane in lanes)  # the joiners served


def test_resume_when_prefill_is_cheap_restart_when_it_is_not() -> None:
    cheap = simulate(load_scenario(SCENARIO, ["seeds=1"]), seed=2)
    assert cheap.resumed > 0 and cheap.restarted == 0
    costly = simulate(
        load_scenario(SCENARIO, ["seeds=1", "jobs.0.resume.setup_s=100000"]), seed=2
    )  # re-entering costs more than any saved decode
    assert costly.resumed == 0 and costly.restarted > 0


def test_elastic_scenarios_need_a_link_and_the_token_model() -> None:
    window = ["jobs.0.transient.0.join_at_s=1", "jobs.0.transient.0.available_s=5"]
    with pytest.raises(UserError, match="transient instances need weights"):
        load_scenario(None, ["jobs.0.generate_s=1", *window])
    link = ["jobs.0.weights.bytes=1e9", "jobs.0.weights.egress_gbps=10", "jobs.0.weights.receiver_gbps=10"]
    with pytest.raises(UserError, match="needs the token model"):
        load_scenario(None, ["jobs.0.generate_s=1", *link])


def test_relayed_joiners_take_the_peers_uploads_while_those_are_as_fast_as_the_egress() -> None:
    """Six joiners, 50 Gbit/s links and a 200 Gbit/s egress: two pull from the static instances'
    uploads, four from the trainer, every one at its 50 Gbit/s cap (the trainer alone: 33.3 each)."""
    cfg = load_scenario(SCENARIO, ["seeds=1", "jobs.0.weights.relay=true"])
    run = simulate(cfg, seed=0)
    joiners = [life for n, life in run.instances.items() if "transient-0." in n]
    assert len(joiners) == 6
    for life in joiners:
        assert life["preparing_s"] == pytest.approx(16_381_470_720 * 8 / 50e9 + 5.0, abs=0.01)


def test_relays_with_zero_upload_are_refused_naming_the_fix() -> None:
    with pytest.raises(UserError, match=r"upload_gbps is 0.*relay: false"):
        load_scenario(SCENARIO, ["jobs.0.weights.relay=true", "jobs.0.weights.upload_gbps=0"])


def transfers() -> tuple[Simulator, Transfers, dict[str, float]]:
    sim = Simulator(seed=0)
    t = Transfers(sim, Link(sim, 8e9), upload_bps=8e9, chunk_bytes=10_000_000)  # 1 GB/s; a hop: 10 ms
    return sim, t, {}


def test_a_chain_of_relays_ends_one_hop_after_another_and_a_dead_relay_hands_back_to_the_trainer() -> None:
    sim, t, done = transfers()
    for name, sources in (("a", ()), ("b", ("a",)), ("c", ("b",))):
        t.start(name, sources, 1e9, 8e9, lambda name=name: done.setdefault(name, sim.now))
    sim.run()
    assert done == pytest.approx({"a": 1.0, "b": 1.01, "c": 1.02})  # chain_finish_s: S/r + hops

    sim, t, done = transfers()
    for name, sources in (("a", ()), ("b", ("a",)), ("c", ("b",))):
        t.start(name, sources, 1e9, 8e9, lambda name=name: done.setdefault(name, sim.now))
    sim.at(0.5, lambda: t.gone("b"))  # b dies halfway: c takes its last half from the trainer,
    sim.run()  # which a still shares with it (0.5 GB each at 0.5 GB/s)
    assert done == pytest.approx({"a": 1.5, "c": 1.5}) and "b" not in done
