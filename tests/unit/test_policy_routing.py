"""The endpoint's routing over the fleet and the version pin of an episode (`rlsched.policy.routing`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlsched.policy.routing import InstanceView, NoInstance, Routed, hold_back, route
from rlsched.policy.versions import admissible


def view(name: str, version: int, in_flight: int = 0, ready: bool = True, rows: int = 4) -> InstanceView:
    return InstanceView(name, ready, version, in_flight, rows)


def test_an_unpinned_request_goes_to_the_least_loaded_admissible_instance() -> None:
    views = [view("a", 3, in_flight=3), view("b", 3, in_flight=1), view("c", 1), view("d", 3, ready=False)]
    assert route(views, latest=3, max_staleness=1) == Routed("b", 3)  # c is too stale, d not READY


def test_a_pinned_turn_stays_on_its_version_while_it_is_admissible() -> None:
    views = [view("old", 2, in_flight=4), view("new", 3)]
    assert route(views, latest=3, max_staleness=1, pin=2) == Routed("old", 2)


def test_a_pin_no_instance_holds_runs_on_the_newest_and_says_why() -> None:
    routed = route([view("new", 3)], latest=3, max_staleness=1, pin=2)
    assert isinstance(routed, Routed) and routed.name == "new"
    assert routed.mixed == "no READY instance holds version 2"


def test_on_policy_a_pin_behind_the_latest_is_mixed() -> None:
    routed = route([view("old", 2), view("new", 3)], latest=3, max_staleness=0, pin=2)
    assert isinstance(routed, Routed) and (routed.name, routed.version) == ("new", 3)
    assert routed.mixed is not None and "no longer admissible" in routed.mixed


def test_no_candidate_is_a_value_naming_what_is_held() -> None:
    routed = route([view("a", 1), view("b", 5, ready=False)], latest=5, max_staleness=2)
    assert isinstance(routed, NoInstance)
    assert "versions [1]" in routed.reason and "down to 3" in routed.reason


def test_a_reload_holds_one_instance_per_admissible_pinned_version() -> None:
    views = [view("a", 4), view("b", 4), view("c", 4)]
    held = hold_back(views, {4: {"a": 1, "b": 3}}, new_version=5, max_staleness=1)
    assert held == {"b"}  # the one serving most of the version's episodes


def test_a_reload_holds_nothing_on_policy_and_never_everything() -> None:
    views = [view("a", 4), view("b", 4)]
    assert hold_back(views, {4: {"a": 2}}, new_version=5, max_staleness=0) == set()
    assert hold_back([view("a", 4)], {4: {"a": 2}}, new_version=5, max_staleness=3) == set()


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8), st.booleans()), min_size=1, max_size=6),
    st.integers(0, 6),
    st.integers(0, 3),
    st.none() | st.integers(0, 6),
)
def test_routing_never_picks_an_instance_that_cannot_serve(
    rows: list[tuple[int, int, bool]], latest: int, staleness: int, pin: int | None
) -> None:
    views = [view(f"i{k}", v, load, ready) for k, (v, load, ready) in enumerate(rows)]
    routed = route(views, latest, staleness, pin)
    able = [v for v in views if v.ready and admissible(v.version, latest, staleness)]
    assert isinstance(routed, NoInstance) == (not able)
    if isinstance(routed, Routed):
        chosen = next(v for v in views if v.name == routed.name)
        assert chosen in able
        holds_pin = any(v.version == pin for v in able)
        assert (routed.mixed is None) == (pin is None or holds_pin)
