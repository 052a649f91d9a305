"""The simulated RL job: deterministic, consistent with the analytic queue, and the same policy calls."""

from __future__ import annotations

import pytest

from rlsched.metrics.spans import SpanKind, phase_times
from rlsched.policy.queueing import batch
from rlsched.sim.rljob import Dist, DistKind, RLJobModel, simulate

MODEL = RLJobModel(
    iterations=2,
    samples=128,
    instances=2,
    slots=16,
    workers=3,
    generate=Dist(DistKind.LOGNORMAL, 0.2, 0.8),
    verify=Dist(DistKind.UNIFORM, 0.005, 0.05),
)


def test_same_seed_same_decision_log_byte_for_byte() -> None:
    a, b = simulate(MODEL, seed=3), simulate(MODEL, seed=3)
    assert "\n".join(a.decisions).encode() == "\n".join(b.decisions).encode()
    assert sum(d.split(" ")[1] == "dispatch" for d in a.decisions) == 2 * 128
    assert simulate(MODEL, seed=4).decisions != a.decisions


def test_fifo_dispatch_matches_the_analytic_fcfs_batch() -> None:
    run = simulate(MODEL, seed=5)
    for it in (1, 2):
        gens = {s.id: s.end for s in run.spans if s.iteration == it and s.kind is SpanKind.GENERATE}
        vers = {s.id: s for s in run.spans if s.iteration == it and s.kind is SpanKind.VERIFY}
        ids = sorted(gens)
        model = batch([gens[i] for i in ids], [vers[i].duration for i in ids], None, MODEL.workers)
        assert max(v.end for v in vers.values()) == pytest.approx(model.completion)


def test_overlap_beats_the_sequential_baseline_and_hides_verification() -> None:
    seq = simulate(RLJobModel(overlap=False), seed=1)
    ovl = simulate(RLJobModel(overlap=True), seed=1)
    for it in (1, 2, 3):
        s = phase_times([x for x in seq.spans if x.iteration == it])
        o = phase_times([x for x in ovl.spans if x.iteration == it])
        assert s.overlap_fraction == 0.0 and o.overlap_fraction > 0.9
        assert o.t_iter < s.t_iter


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"workers": 0}, "workers"), ({"update_s": -1.0}, "non-negative"), ({"samples": 0}, "samples")],
)
def test_bad_models_are_refused(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        RLJobModel(**kwargs)  # type: ignore[arg-type]


def test_empirical_distribution_draws_only_observed_values() -> None:
    import numpy as np

    d = Dist(DistKind.EMPIRICAL, values=(0.1, 0.2, 0.7))
    assert set(d.draw(np.random.default_rng(0), 200).tolist()) == {0.1, 0.2, 0.7}


def test_bad_distributions_are_refused() -> None:
    with pytest.raises(ValueError, match="empirical"):
        Dist(DistKind.EMPIRICAL)
    with pytest.raises(ValueError, match="non-negative"):
        Dist(DistKind.CONSTANT, -1.0)
    with pytest.raises(ValueError, match="a <= b"):
        Dist(DistKind.UNIFORM, 2.0, 1.0)
