"""Gang placement: all bundles or none, never over-committed, strategies and selectors honoured,
reasons that name the blocker, and the SPEC's wait / migrate / spread choice."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.placement import (
    Gang,
    Node,
    Placement,
    StartOption,
    Strategy,
    Unplaceable,
    add,
    fits,
    place,
    start_choice,
)

DEVICES = frozenset({"H100", "A100"})


def spec_cluster() -> tuple[list[Node], dict[str, dict[str, float]]]:
    nodes = [Node("node-1", {"H100": 8, "CPU": 112}), Node("node-2", {"A100": 8, "CPU": 128})]
    free = {"node-1": {"H100": 4, "CPU": 8}, "node-2": {"A100": 4, "CPU": 32}}
    return nodes, free


def test_spec_section_4_nothing_fits_and_the_reason_names_both_blockers() -> None:
    nodes, free = spec_cluster()
    got = place(Gang(({"H100": 4, "CPU": 16},), Strategy.STRICT_PACK), nodes, free, DEVICES)
    assert isinstance(got, Unplaceable)
    assert got.reason == (
        "needs 4 H100 and 16 CPU on one node; node-1 has 4 free H100 but 8 free CPU; "
        "node-2 has 32 free CPU but its devices are A100"
    )


def test_spec_section_4_migrate_wins_until_it_ties_with_waiting() -> None:
    c = start_choice(wait_s=12, run_s=20, migrate_s=4, spread_ready_s=1, spread_run_s=32)
    assert c.option is StartOption.MIGRATE and c.completion_s == 24
    assert dict(c.options) == {StartOption.WAIT: 32, StartOption.MIGRATE: 24, StartOption.SPREAD: 33}
    assert start_choice(12, 20, migrate_s=11.9).option is StartOption.MIGRATE
    assert start_choice(12, 20, migrate_s=12).option is StartOption.WAIT  # the tie: nobody is disturbed
    assert start_choice(12, 20, spread_ready_s=1, spread_run_s=30).option is StartOption.SPREAD


def test_a_device_type_or_label_no_node_has_is_named() -> None:
    nodes, free = spec_cluster()
    got = place(Gang(({"B200": 1},)), nodes, free, DEVICES)
    assert (
        isinstance(got, Unplaceable) and "no node has B200 (the cluster has: A100, CPU, H100)" in got.reason
    )
    got = place(Gang(({"CPU": 1},), selector={"rack": "r9"}), nodes, free)
    assert isinstance(got, Unplaceable) and "no node carries the labels rack=r9" in got.reason


names = [f"n{i}" for i in range(5)]
resources = ["CPU", "GPU"]
amounts = st.integers(0, 8).map(float)
bundle = st.fixed_dictionaries({r: amounts for r in resources})
cluster = st.lists(st.fixed_dictionaries({r: amounts for r in resources}), min_size=1, max_size=5)


def brute_force_distinct(bundles: tuple[dict[str, float], ...], free: dict[str, dict[str, float]]) -> bool:
    return any(
        all(fits(b, free[n]) for b, n in zip(bundles, choice, strict=True))
        for choice in itertools.permutations(free, len(bundles))
    )


@settings(max_examples=300)
@given(cluster, st.lists(bundle, min_size=1, max_size=4), st.sampled_from(list(Strategy)), st.data())
def test_placements_are_whole_never_over_commit_and_honour_the_strategy(
    caps: list[dict[str, float]], bundles: list[dict[str, float]], strategy: Strategy, data: st.DataObject
) -> None:
    nodes = [Node(names[i], c, {"zone": "a" if i % 2 else "b"}) for i, c in enumerate(caps)]
    free = {
        n.name: {r: data.draw(st.integers(0, int(n.capacity[r])).map(float)) for r in resources}
        for n in nodes
    }
    selector = data.draw(st.sampled_from([{}, {"zone": "a"}]))
    gang = Gang(tuple(bundles), strategy, selector)
    got = place(gang, nodes, free)
    eligible = {n.name for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())}
    if isinstance(got, Placement):
        assert len(got.nodes) == len(bundles) and set(got.nodes) <= eligible
        for name in set(got.nodes):  # never more than a node has free
            used = add(*(b for b, n in zip(bundles, got.nodes, strict=True) if n == name))
            assert fits(used, free[name])
        if strategy is Strategy.STRICT_PACK:
            assert len(set(got.nodes)) == 1
        if strategy is Strategy.STRICT_SPREAD:
            assert len(set(got.nodes)) == len(bundles)
    else:
        assert got.reason.startswith("needs ")
        elig_free = {n: free[n] for n in eligible}
        # the exact strategies are complete: nothing was missed
        if strategy in (Strategy.STRICT_PACK, Strategy.PACK):
            assert not any(fits(gang.total(), f) for f in elig_free.values())
        if strategy in (Strategy.STRICT_SPREAD, Strategy.SPREAD):
            assert not brute_force_distinct(tuple(bundles), elig_free)


def test_pack_prefers_one_node_and_spread_uses_many() -> None:
    nodes = [Node(f"n{i}", {"CPU": 16}) for i in range(3)]
    free = {n.name: {"CPU": 16.0} for n in nodes}
    packed = place(Gang(({"CPU": 4},) * 3, Strategy.PACK), nodes, free)
    spread = place(Gang(({"CPU": 4},) * 3, Strategy.SPREAD), nodes, free)
    assert isinstance(packed, Placement) and len(set(packed.nodes)) == 1
    assert isinstance(spread, Placement) and len(set(spread.nodes)) == 3
    with pytest.raises(ValueError):
        start_choice(-1, 1)
