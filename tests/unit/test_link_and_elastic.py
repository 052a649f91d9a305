"""The weight link model and the elastic helpers: max-min shares of a shared egress, finish times,
usable windows, break-even throughput; the SPEC section 2 figures through `rlsched calc`."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.calc import run
from rlsched.policy.bandwidth import Flow, all_receivers_bound, finish_times, max_min_rates

QWEN3_8B_BF16 = 16_381_470_720  # bytes (SPEC section 2)


def transfer(receivers: int, egress: float, ingress: str, nbytes: float = QWEN3_8B_BF16) -> dict[str, object]:
    args = argparse.Namespace(
        bytes=nbytes, receivers=receivers, egress_gbps=egress, receiver_gbps=ingress, json=True
    )
    out: dict[str, object] = json.loads(run("transfer", args))
    return out


def test_spec_six_receivers_behind_one_egress() -> None:
    out = transfer(6, 200, "50")
    assert out["alone_s"] == [pytest.approx(2.62, abs=0.005)] * 6
    assert out["all_s"] == pytest.approx(3.93, abs=0.005) == out["bound_s"]
    assert out["shared_link_bytes"] == pytest.approx(98.3e9, rel=1e-3)


def test_a_slow_receiver_leaves_its_share_to_the_others() -> None:
    assert max_min_rates([10, 100, 100], 100) == [10, 45, 45]
    out = transfer(3, 100, "10,100,100", nbytes=1.25e9)  # 10 Gbit each
    assert out["finish_s"] == pytest.approx([1.0, 10 / 45 + (10 - 10 / 45 * 45) / 90, 10 / 45 + 0.0])
    assert out["all_s"] == pytest.approx(1.0) == out["bound_s"]  # receiver-bound: the slow link decides


def test_rates_are_recomputed_when_a_flow_starts_and_when_one_finishes() -> None:
    s = 100e9 / 8  # 100 Gbit: one second alone on a 100 Gbit/s link
    done = finish_times([Flow("a", s, 100e9), Flow("b", s, 100e9, start=0.5)], 100e9)
    assert done["a"] == pytest.approx(1.5)  # half alone, the other half at 50
    assert done["b"] == pytest.approx(2.0)  # half at 50, then alone at 100


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="egress"):
        finish_times([Flow("a", 1, 1)], 0)
    with pytest.raises(ValueError, match="one flow at a time"):
        finish_times([Flow("a", 1, 1), Flow("a", 1, 1)], 1)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(0.1, 1000), min_size=1, max_size=8), st.floats(0.1, 2000))
def test_max_min_shares_are_feasible_work_conserving_and_fair(caps: list[float], capacity: float) -> None:
    rates = max_min_rates(caps, capacity)
    assert all(0 <= r <= c + 1e-9 for r, c in zip(rates, caps, strict=True))
    assert sum(rates) <= capacity * (1 + 1e-9)
    if sum(rates) < capacity * (1 - 1e-9):
        assert rates == pytest.approx(caps)  # spare capacity only when everyone is at its cap
    for r, c in zip(rates, caps, strict=True):
        if r < c - 1e-9:  # held back by the egress: no flow gets more
            assert all(other <= r + 1e-9 for other in rates)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(  # whole bytes: a flow is done when less than a thousandth of a bit is left
        st.tuples(st.integers(0, 10**9).map(float), st.floats(1e8, 1e11), st.floats(0, 5)),
        min_size=1,
        max_size=6,
    ),
    st.floats(1e8, 4e11),
)
def test_no_receiver_finishes_before_its_own_bound(
    flows: list[tuple[float, float, float]], egress: float
) -> None:
    made = [Flow(f"r{i}", b, r, start) for i, (b, r, start) in enumerate(flows)]
    done = finish_times(made, egress)
    for f in made:
        alone = 8 * f.nbytes / min(f.ingress_bps, egress)
        assert done[f.receiver] >= f.start + alone * (1 - 1e-9) - 1e-12  # (a clock's rounding)
    if all(f.start == 0 for f in made) and len({f.nbytes for f in made}) == 1:
        bound = all_receivers_bound(made[0].nbytes, [f.ingress_bps for f in made], egress)
        assert max(done.values()) >= bound * (1 - 1e-9)


def calc(name: str, **kw: object) -> dict[str, object]:
    out: dict[str, object] = json.loads(run(name, argparse.Namespace(json=True, **kw)))
    return out


def test_spec_usable_window_and_tokens() -> None:
    assert calc("window", available="20,5", prepare=8.0, rate=None)["usable_s"] == [12, 0]
    assert calc("window", available="10,20,40", prepare=8.0, rate=100.0)["tokens"] == [200, 1200, 3200]


def test_spec_breakeven_of_six_transient_instances() -> None:
    out = calc("breakeven", base_cost=84.0, added_cost="5.30*6", throughput="1.2,1.6")
    assert out["total_cost"] == pytest.approx(115.8)
    assert out["breakeven_throughput"] == pytest.approx(1.38, abs=0.005)
    assert out["relative_cost_per_work"] == pytest.approx([1.15, 0.86], abs=0.005)


def test_bad_calc_input_names_the_flag() -> None:
    from rlsched.errors import UserError

    with pytest.raises(UserError, match="--receiver-gbps needs one positive rate, or one per receiver"):
        transfer(3, 200, "50,50")
    with pytest.raises(UserError, match="--receivers at least 1"):
        transfer(0, 200, "50")
    with pytest.raises(UserError, match="base cost must be positive"):
        calc("breakeven", base_cost=0.0, added_cost="5", throughput="1.2")
