"""The weight link model and the elastic helpers: max-min shares of a shared egress, finish times,
usable windows, break-even throughput; the SPEC section 2 figures through `rlsched calc`."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.calc import run
from rlsched.policy.bandwidth import (
    Flow,
    all_receivers_bound,
    chain_finish_s,
    finish_times,
    max_min_rates,
    p2p_bound,
    relay_plan,
)

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


# -- relays ------------------------------------------------------------------------------------------

SMOLLM2_BF16 = 269_060_552  # bytes of SmolLM2-135M's BF16 safetensors
HALF_GBIT = 0.5e9


def test_a_chain_pipelines_chunks_one_hop_behind_each_other() -> None:
    # 4 chunks of 1 Gbit over 1 Gbit/s hops: the head takes 4 s, every member after it one chunk more
    assert chain_finish_s(4 * 1e9 / 8, 1e9 / 8, 1e9, [1e9] * 3, [1e9] * 3) == pytest.approx([4, 5, 6])
    # member 1 uploads at 0.5 Gbit/s: its hop to member 2 takes 2 s a chunk
    assert chain_finish_s(2 * 1e9 / 8, 1e9 / 8, 1e9, [1e9] * 3, [1e9, 0.5e9, 1e9]) == pytest.approx([2, 3, 6])


def test_the_peer_to_peer_bound_is_kumar_and_rosss() -> None:
    s = 1e9 / 8  # 1 Gbit
    assert p2p_bound(s, [1e9] * 4, 1e9, [1e9] * 4) == pytest.approx(1.0)  # S/E: uploads are plenty
    assert p2p_bound(s, [1e9] * 4, 1e9, [0.0] * 4) == pytest.approx(4.0)  # N*S/E: nobody relays
    assert p2p_bound(s, [1e9] * 4, 1e9, [1e9, 0, 0, 0]) == pytest.approx(2.0)  # N*S/(E + sum u)
    assert p2p_bound(s, [0.25e9, 1e9], 1e9, [1e9] * 2) == pytest.approx(4.0)  # the slow ingress


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_relays_bring_the_egress_bound_fan_out_near_one_sender_time(n: int) -> None:
    """E = r = u = 0.5 Gbit/s (the issue's setting): the sender alone needs N x S/E, one chain about S/E."""
    plan = relay_plan(SMOLLM2_BF16, 4 << 20, [HALF_GBIT] * n, HALF_GBIT, [HALF_GBIT] * n)
    bound = p2p_bound(SMOLLM2_BF16, [HALF_GBIT] * n, HALF_GBIT, [HALF_GBIT] * n)
    assert plan.chains == (tuple(range(n)),)
    assert bound == pytest.approx(8 * SMOLLM2_BF16 / HALF_GBIT)
    assert bound / plan.all_s >= 0.90
    assert plan.source(0) is None and all(plan.source(i) == i - 1 for i in range(1, n))


def test_without_uploads_the_plan_is_the_sender_alone() -> None:
    plan = relay_plan(QWEN3_8B_BF16, 64 << 20, [50e9] * 6, 200e9, [0.0] * 6)
    assert plan.chains == tuple((i,) for i in range(6))
    assert plan.all_s == pytest.approx(all_receivers_bound(QWEN3_8B_BF16, [50e9] * 6, 200e9))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.floats(1e8, 1e10), min_size=6, max_size=6),
    st.lists(st.floats(0, 1e10), min_size=6, max_size=6),
    st.floats(1e8, 4e10),
    st.integers(1, 64),
)
def test_no_relay_plan_beats_the_peer_to_peer_bound_nor_loses_to_the_sender_alone(
    n: int, ingress: list[float], upload: list[float], egress: float, chunks: int
) -> None:
    size = 1e8
    plan = relay_plan(size, size / chunks, ingress[:n], egress, upload[:n])
    assert plan.all_s >= p2p_bound(size, ingress[:n], egress, upload[:n]) * (1 - 1e-9)
    alone = finish_times([Flow(str(i), size, r) for i, r in enumerate(ingress[:n])], egress)
    assert plan.all_s <= max(alone.values()) * (1 + 1e-9)
    assert sorted(i for chain in plan.chains for i in chain) == list(range(n))


def test_calc_transfer_with_relays_and_its_bad_input() -> None:
    from rlsched.errors import UserError

    args = {"bytes": float(SMOLLM2_BF16), "receivers": 8, "egress_gbps": 0.5, "receiver_gbps": "0.5"}
    out = calc("transfer", **args, relay=True, upload_gbps=None, chunk_kb=4096)
    assert out["all_s"] == pytest.approx(8 * 8 * SMOLLM2_BF16 / HALF_GBIT)  # the sender alone: N*S/E
    assert out["relay_all_s"] == pytest.approx(4.775, abs=0.001)
    assert out["relay_efficiency"] == pytest.approx(0.9016, abs=0.0005)
    with pytest.raises(UserError, match="every upload cap at 0: no receiver can pass anything on"):
        calc("transfer", **args, relay=True, upload_gbps="0", chunk_kb=4096)
    with pytest.raises(UserError, match="--upload-gbps needs one non-negative rate, or one per receiver"):
        calc("transfer", **args, relay=True, upload_gbps="1,2", chunk_kb=4096)
