"""The rollout fleet's core and its weight-version book on their own: events in, effects out.

No Ray and no simulator: each test plays the driver by hand (`FleetCore.handle`), so joining, routing,
exactly-once acceptance, staleness, preemption with resume, draining, scaling and transient windows
are checked effect by effect; `WeightBook` is checked directly.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rlsched.core import fleet_io as fx
from rlsched.core.fleet import FleetCore, FleetTrace
from rlsched.core.weights import WeightBook
from rlsched.policy.bandwidth import RelayParams
from rlsched.policy.lifecycle import IllegalTransition, InstanceState, Leave, VersionState
from rlsched.policy.resume import Restart, ResumeCost
from rlsched.sim.replay import compare, replay
from rlsched.store.traces import load_trace, save_trace

T = TypeVar("T")
JOIN, CATCH_UP, RELOAD = fx.PullWhy.JOIN, fx.PullWhy.CATCH_UP, fx.PullWhy.RELOAD
GROUP = (fx.RequestSpec("g-0", "g", 2), fx.RequestSpec("g-1", "g", 2))  # one GRPO group of two


def core(ready: int = 0, **params: Any) -> FleetCore:
    """A core with version 0 published and `ready` instances (rollout-0, ...) READY at it."""
    c = FleetCore(fx.FleetParams(**params))
    c.handle(fx.Published(0.0, 0))
    for i in range(ready):
        c.handle(fx.Added(0.0, f"rollout-{i}"))
        c.handle(fx.PullDone(0.0, f"rollout-{i}", 0))
    return c


def reqs(n: int) -> tuple[fx.RequestSpec, ...]:
    return tuple(fx.RequestSpec(f"r{i}", f"group-{i}", 2) for i in range(n))


def only(effects: list[fx.Effect], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def test_an_instance_added_before_any_publish_joins_at_the_reload_which_ends_once_all_pulled() -> None:
    c = FleetCore(fx.FleetParams())
    assert c.handle(fx.Added(0.0, "a", 5.0)) == [fx.StartInstance("a", 5.0)]
    assert c.handle(fx.Added(0.0, "b")) == [fx.StartInstance("b", 0.0)]
    assert c.handle(fx.Published(1.0, 0)) == []
    assert c.handle(fx.ReloadAsked(2.0)) == [fx.StartPull("a", 0, JOIN), fx.StartPull("b", 0, JOIN)]
    assert c.handle(fx.PullDone(3.0, "a", 0)) == [fx.Joined("a", 0, JOIN, 0, 2.0)]  # b still pulls
    assert c.handle(fx.PullDone(4.0, "b", 0)) == [fx.Joined("b", 0, JOIN, 0, 2.0), fx.ReloadDone()]
    assert c.serving() == ["a", "b"] and c.counts.joined == 2
    c.handle(fx.Published(5.0, 1))
    assert c.handle(fx.ReloadAsked(6.0)) == [fx.StartPull("a", 1, RELOAD), fx.StartPull("b", 1, RELOAD)]


def test_an_instance_added_after_a_publish_pulls_at_once() -> None:
    c = core()
    assert c.handle(fx.Added(1.0, "a")) == [fx.StartInstance("a", 0.0), fx.StartPull("a", 0, JOIN)]
    assert c.pulling() == ["a"] and c.serving() == []


def test_a_failed_pull_releases_the_instance_and_counts_as_done_for_the_reload() -> None:
    c = FleetCore(fx.FleetParams())
    c.handle(fx.Added(0.0, "a"))
    c.handle(fx.Added(0.0, "b"))
    c.handle(fx.Published(1.0, 0))
    c.handle(fx.ReloadAsked(2.0))
    c.handle(fx.PullDone(3.0, "a", 0))
    effects = c.handle(fx.PullDone(4.0, "b", 0, error="checksum mismatch"))
    assert effects == [fx.Note("b could not join: checksum mismatch"), fx.KillInstance("b"), fx.ReloadDone()]
    assert c.counts.join_failures == 1 and c.join_errors == ["b could not join: checksum mismatch"]
    assert not c.live("b") and c.serving() == ["a"] and c.weights.pulling(0) == frozenset()


def test_requests_go_in_batches_to_idle_ready_instances_in_member_order() -> None:
    c = core(ready=2, request_batch=3)
    assert c.handle(fx.Begun(1.0, 1, reqs(7))) == [
        fx.Route("rollout-0", ("r0", "r1", "r2"), 1, (0, 0, 0)),
        fx.Route("rollout-1", ("r3", "r4", "r5"), 2, (0, 0, 0)),
    ]
    assert list(c.pending) == ["r6"]
    for rid in ("r3", "r4", "r5"):  # an arrival frees nothing: its batch still runs
        assert c.handle(fx.Arrived(2.0, "rollout-1", rid)) == [fx.Accepted("rollout-1", rid, None)]
    assert c.handle(fx.StreamEnded(2.5, "rollout-1")) == [fx.Route("rollout-1", ("r6",), 3, (0,))]
    assert not c.pending


@pytest.mark.parametrize(
    "name",
    ["nowhere", "rollout-1", "rollout-0"],
    ids=["unknown instance", "not running there", "already done"],
)
def test_an_arrival_not_for_the_running_instance_or_already_done_is_dropped(name: str) -> None:
    c = core(ready=2, request_batch=1)
    c.handle(fx.Begun(0.0, 1, reqs(2)))  # r0 on rollout-0, r1 on rollout-1
    assert c.handle(fx.Arrived(1.0, "rollout-0", "r0")) == [fx.Accepted("rollout-0", "r0", None)]
    assert c.generating
    assert c.handle(fx.Arrived(1.5, name, "r0")) == [] and c.counts.duplicates_dropped == 1
    assert c.handle(fx.Arrived(2.0, "rollout-1", "r1")) == [fx.Accepted("rollout-1", "r1", None)]
    assert not c.generating


def test_a_stream_that_ends_early_puts_its_missing_requests_back_at_the_front_in_order() -> None:
    c = core(ready=1, request_batch=3)
    c.handle(fx.Begun(0.0, 1, reqs(5)))  # rollout-0 runs r0 r1 r2; r3 r4 wait
    c.handle(fx.Arrived(1.0, "rollout-0", "r1"))
    assert c.handle(fx.StreamEnded(1.0, "rollout-0")) == [
        fx.Route("rollout-0", ("r0", "r2", "r3"), 2, (0, 0, 0))
    ]
    assert list(c.pending) == ["r4"]


@pytest.mark.parametrize(("max_staleness", "serving"), [(0, ["rollout-1"]), (1, ["rollout-0", "rollout-1"])])
def test_an_instance_past_the_staleness_bound_gets_nothing(max_staleness: int, serving: list[str]) -> None:
    c = core(ready=1, request_batch=1, max_staleness=max_staleness)  # rollout-0 holds version 0
    c.handle(fx.Published(1.0, 1))
    c.handle(fx.Added(1.0, "rollout-1"))
    c.handle(fx.PullDone(2.0, "rollout-1", 1))
    assert c.serving() == serving
    assert [r.name for r in only(c.handle(fx.Begun(3.0, 1, reqs(2))), fx.Route)] == serving


def test_a_pull_of_a_version_made_inadmissible_meanwhile_is_followed_by_a_catch_up_pull() -> None:
    c = core()
    c.handle(fx.Added(0.0, "a"))  # pulls version 0
    assert c.handle(fx.Published(1.0, 1)) == [] and c.weights.state(0) is VersionState.RETIRED
    assert c.handle(fx.PullDone(2.0, "a", 0)) == [
        fx.Joined("a", 0, JOIN, 0, 0.0),
        fx.StartPull("a", 1, CATCH_UP),
    ]
    assert c.serving() == []
    assert c.handle(fx.PullDone(3.0, "a", 1)) == [fx.Joined("a", 1, CATCH_UP, 0, 2.0)]
    assert c.serving() == ["a"] and c.counts.joined == 1


def preempt_group(**params: Any) -> tuple[FleetCore, list[fx.Effect]]:
    """rollout-0 runs GROUP and is preempted with 40 and 10 tokens saved; rollout-1 is idle."""
    c = core(ready=2, **params)
    assert only(c.handle(fx.Begun(0.0, 1, GROUP)), fx.Route)[0].name == "rollout-0"
    effects = c.handle(fx.Reclaimed(1.0, "rollout-0", Leave.PREEMPTED, "spot"))
    assert effects == [fx.KillInstance("rollout-0"), fx.ReadSaved("rollout-0", ("g-0", "g-1"))]
    return c, c.handle(fx.SavedRead(2.0, "rollout-0", (("g-0", 40), ("g-1", 10))))


def test_a_preempted_group_resumes_elsewhere_from_its_shortest_saved_length() -> None:
    c, effects = preempt_group()
    assert effects == [
        fx.CutSaved("g-0", 10),
        fx.CutSaved("g-1", 10),
        fx.Left("rollout-0", Leave.PREEMPTED, "spot", 2, 1.0),
        fx.Note("rollout-0 preempted (spot): 2 request(s) go back to the queue"),
        fx.Route("rollout-1", ("g-0", "g-1"), 2, (10, 10)),
    ]
    n = c.counts
    assert (n.preempted, n.resumed, n.restarted, n.reused_tokens, n.regenerated_tokens) == (1, 2, 0, 20, 30)
    (accepted,) = c.handle(fx.Arrived(3.0, "rollout-1", "g-0"))
    assert accepted == fx.Accepted(
        "rollout-1", "g-0", fx.Resumption(10, 40, 1.0, "rollout-0", Restart.RESUME)
    )


def test_a_dead_instance_is_replaced_and_its_requests_resume_on_the_others() -> None:
    c = core(ready=2)
    c.handle(fx.Begun(0.0, 1, GROUP))
    died = c.handle(fx.Reclaimed(1.0, "rollout-0", Leave.PREEMPTED, "its actor died", replace=True))
    assert died[:2] == [fx.KillInstance("rollout-0"), fx.ReadSaved("rollout-0", ("g-0", "g-1"))]
    assert died[2:] == [
        fx.StartInstance("rollout-0-r1", 0.0),
        fx.StartPull("rollout-0-r1", 0, JOIN),
        fx.Note("rollout-0-r1 replaces rollout-0; it serves once it has the latest version"),
    ]
    assert only(c.handle(fx.SavedRead(2.0, "rollout-0", ())), fx.Route)[0].name == "rollout-1"
    c.handle(fx.PullDone(3.0, "rollout-0-r1", 0))
    assert c.serving() == ["rollout-1", "rollout-0-r1"] and c.counts.replaced == 1
    again = c.handle(fx.Reclaimed(4.0, "rollout-0-r1", Leave.PREEMPTED, "its actor died", replace=True))
    assert fx.StartInstance("rollout-0-r2", 0.0) in again  # the next free name, from the same base


def test_replenish_brings_the_jobs_own_instances_back_to_the_target() -> None:
    c = core(ready=3)
    c.handle(fx.PullDone(1.0, "rollout-0", -1, "weight service: UNAVAILABLE"))  # no pull: ignored
    c.handle(fx.Published(1.0, 1))
    c.handle(fx.ReloadAsked(1.0))
    for name in ("rollout-0", "rollout-1"):  # the service died under the reload: both gave up
        c.handle(fx.PullDone(2.0, name, -1, "weight service: UNAVAILABLE"))
    c.handle(fx.PullDone(2.0, "rollout-2", 1))
    assert c.serving() == ["rollout-2"]
    effects = c.handle(fx.Replenish(3.0, target=3, exclude=("rollout-2",)))
    assert only(effects, fx.StartInstance) == [
        fx.StartInstance("rollout-0-r1", 0.0),
        fx.StartInstance("rollout-1-r1", 0.0),
    ]
    assert c.handle(fx.Replenish(4.0, target=2)) == []  # three live: rollout-2 and the two joiners
    assert c.counts.replaced == 2


def test_a_dead_instance_lent_by_a_window_or_a_scheduler_is_not_replaced() -> None:
    c = core(ready=1)
    effects = c.handle(fx.Reclaimed(1.0, "rollout-0", Leave.PREEMPTED, "its actor died", replace=False))
    assert not only(effects, fx.StartInstance) and c.counts.replaced == 0


def test_a_preempted_group_restarts_when_resuming_costs_more() -> None:
    c, effects = preempt_group(cost=ResumeCost(5000.0, 50.0, setup_s=1e9))
    assert only(effects, fx.CutSaved) == [fx.CutSaved("g-0", 0), fx.CutSaved("g-1", 0)]
    assert only(effects, fx.Route) == [fx.Route("rollout-1", ("g-0", "g-1"), 2, (0, 0))]
    assert (c.counts.restarted, c.counts.resumed, c.counts.reused_tokens) == (2, 0, 0)


def test_a_restart_counts_every_saved_token_as_regenerated() -> None:
    c, _ = preempt_group(cost=ResumeCost(5000.0, 50.0, setup_s=1e9))
    assert (c.counts.reused_tokens, c.counts.regenerated_tokens) == (0, 50)


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (fx.Reclaimed(1.0, "rollout-0", Leave.DRAINING, "spot"), "spot"),
        (fx.Scaled(1.0, remove=("rollout-0",)), "rlsched scale"),
    ],
    ids=["reclaimed", "scaled"],
)
def test_a_draining_instance_takes_nothing_new_and_leaves_when_its_batch_ends(
    event: fx.Event, why: str
) -> None:
    c = core(ready=1, request_batch=2)
    c.handle(fx.Begun(0.0, 1, reqs(3)))  # rollout-0 runs r0 r1; r2 waits
    assert c.handle(event) == [fx.Note(f"rollout-0 draining ({why}): 2 request(s) to finish")]
    assert c.members["rollout-0"].state is InstanceState.DRAINING and c.live("rollout-0")
    for rid in ("r0", "r1"):
        assert c.handle(fx.Arrived(2.0, "rollout-0", rid)) == [fx.Accepted("rollout-0", rid, None)]
    assert c.handle(fx.StreamEnded(3.0, "rollout-0")) == [
        fx.KillInstance("rollout-0"),
        fx.Left("rollout-0", Leave.DRAINING, why, 0, 3.0),
    ]
    assert c.counts.drained == 1 and c.counts.preempted == 0 and list(c.pending) == ["r2"]
    assert not c.live("rollout-0")


def test_draining_an_instance_that_is_not_ready_preempts_it() -> None:
    c = core()
    c.handle(fx.Added(0.0, "a"))  # pulling
    assert c.handle(fx.Scaled(1.0, remove=("a",))) == [
        fx.KillInstance("a"),
        fx.Left("a", Leave.PREEMPTED, "rlsched scale", 0, 1.0),
        fx.Note("a preempted (rlsched scale): 0 request(s) go back to the queue"),
    ]
    assert (c.counts.preempted, c.counts.drained) == (1, 0) and c.pulling() == [] and not c.live("a")
    assert c.handle(fx.PullDone(2.0, "a", 0)) == []  # its pull's end comes too late: ignored


def test_draining_an_instance_that_already_drains_lets_it_finish() -> None:
    c = core(ready=1)
    c.handle(fx.Begun(0.0, 1, reqs(1)))
    c.handle(fx.Scaled(1.0, remove=("rollout-0",)))
    effects = c.handle(fx.Scaled(2.0, remove=("rollout-0",)))
    assert not only(effects, fx.KillInstance) and c.members["rollout-0"].state is InstanceState.DRAINING


def test_scaling_names_new_instances_in_turn_and_an_unknown_removal_changes_nothing() -> None:
    c = core(ready=1)
    note = "scale: {} allocated; it serves once it has the latest version"
    assert c.handle(fx.Scaled(1.0, add=2, ingress_bps=1e9)) == [
        fx.StartInstance("scaled-1", 1e9),
        fx.StartPull("scaled-1", 0, JOIN),
        fx.Note(note.format("scaled-1")),
        fx.StartInstance("scaled-2", 1e9),
        fx.StartPull("scaled-2", 0, JOIN),
        fx.Note(note.format("scaled-2")),
    ]
    before = c.snapshot()
    unknown = fx.Note("scale: no live instance named nope (live: rollout-0, scaled-1, scaled-2)")
    assert c.handle(fx.Scaled(2.0, remove=("nope",))) == [unknown]
    assert c.snapshot() == before and c.counts.drained == c.counts.preempted == 0


def test_a_window_opens_at_its_time_into_its_iterations_generation_and_ends_available_s_later() -> None:
    c = core(ready=1, windows=(fx.Window("transient-0", join_at_s=5.0, available_s=3.0),))
    assert c.next_wakeup() is None  # no generation yet
    c.handle(fx.Begun(10.0, 1, reqs(1)))
    assert c.next_wakeup() == 15.0
    assert c.handle(fx.Tick(14.9)) == []
    wake = c.next_wakeup()
    assert wake is not None  # a driver ticking at next_wakeup finds the window open: no loop
    assert c.handle(fx.Tick(wake)) == [
        fx.StartInstance("transient-0", 0.0),
        fx.StartPull("transient-0", 0, JOIN),
    ]
    assert c.next_wakeup() == 18.0  # granted at 15, available 3 s
    c.handle(fx.PullDone(16.0, "transient-0", 0))
    assert c.handle(fx.Tick(18.0)) == [
        fx.KillInstance("transient-0"),
        fx.Left("transient-0", Leave.PREEMPTED, "its availability window ended", 0, 18.0),
        fx.Note("transient-0 preempted (its availability window ended): 0 request(s) go back to the queue"),
    ]
    assert c.next_wakeup() is None


def test_a_window_of_a_later_iteration_opens_at_that_iterations_begun() -> None:
    c = core(ready=1, windows=(fx.Window("transient-0", join_iteration=2),))
    assert only(c.handle(fx.Begun(0.0, 1, reqs(1))), fx.StartInstance) == [] and c.next_wakeup() is None
    c.handle(fx.Arrived(1.0, "rollout-0", "r0"))
    c.handle(fx.StreamEnded(1.0, "rollout-0"))
    assert c.handle(fx.Begun(50.0, 2, reqs(1))) == [
        fx.StartInstance("transient-0", 0.0),
        fx.StartPull("transient-0", 0, JOIN),
        fx.Route("rollout-0", ("r0",), 2, (0,)),
    ]


def test_a_reclaim_iteration_window_ends_reclaim_at_s_into_that_iterations_generation() -> None:
    c = core(windows=(fx.Window("transient-0", reclaim_iteration=2, reclaim_at_s=4.0),))
    c.handle(fx.Begun(0.0, 1, reqs(1)))  # opens at once
    assert only(c.handle(fx.PullDone(1.0, "transient-0", 0)), fx.Route) == [
        fx.Route("transient-0", ("r0",), 1, (0,))
    ]
    assert c.next_wakeup() is None  # not its iteration
    c.handle(fx.Arrived(2.0, "transient-0", "r0"))
    c.handle(fx.StreamEnded(2.0, "transient-0"))
    c.handle(fx.Begun(100.0, 2, reqs(1)))
    assert c.next_wakeup() == 104.0
    assert c.handle(fx.Tick(103.9)) == []
    assert c.handle(fx.Tick(104.0)) == [fx.KillInstance("transient-0"), fx.ReadSaved("transient-0", ("r0",))]


def test_after_generation_ends_next_wakeup_no_longer_reports_join_windows() -> None:
    c = core(ready=1, windows=(fx.Window("transient-0", join_at_s=50.0),))
    c.handle(fx.Begun(0.0, 1, reqs(1)))
    assert c.next_wakeup() == 50.0
    c.handle(fx.Arrived(1.0, "rollout-0", "r0"))
    assert not c.generating and c.next_wakeup() is None
    assert c.handle(fx.Tick(50.0)) == []


def test_requests_are_stranded_only_when_nothing_serves_joins_or_is_due() -> None:
    c = core()
    c.handle(fx.Begun(0.0, 1, reqs(1)))
    assert c.stranded()
    c.handle(fx.Added(1.0, "a"))
    assert not c.stranded()  # a is pulling
    windowed = core(windows=(fx.Window("transient-0", join_at_s=5.0),))
    windowed.handle(fx.Begun(0.0, 1, reqs(1)))
    assert not windowed.stranded()  # a window is due


@pytest.mark.parametrize(
    "event",
    [
        fx.PullDone(1.0, "rollout-0", 0),
        fx.PullDone(1.0, "nobody", 0),
        fx.StreamEnded(1.0, "rollout-0"),
        fx.Reclaimed(1.0, "nobody", Leave.PREEMPTED, "x"),
    ],
    ids=["pull not pulling", "pull unknown", "stream idle", "reclaim unknown"],
)
def test_an_event_that_does_not_apply_to_an_instance_is_ignored(event: fx.Event) -> None:
    c = core(ready=1)
    before = c.snapshot()
    assert c.handle(event) == [] and c.snapshot() == before and c.counts.joined == 1


def test_a_member_edge_outside_the_table_is_refused_by_name() -> None:
    c = core(ready=1)
    with pytest.raises(IllegalTransition, match="instance cannot go from ready to allocated"):
        c.members["rollout-0"].to(InstanceState.ALLOCATED)


@pytest.mark.parametrize("version", [0, -1])
def test_a_version_not_newer_than_the_latest_is_refused(version: int) -> None:
    book = WeightBook(0)
    book.publish(0)
    with pytest.raises(ValueError, match="not newer than 0"):
        book.publish(version)


def test_versions_past_the_staleness_bound_retire_oldest_first() -> None:
    book = WeightBook(1)
    assert (book.publish(0), book.publish(1), book.publish(2)) == ([], [], [0])
    assert [book.state(v) for v in (0, 1, 2)] == [VersionState.RETIRED, *[VersionState.PUBLISHED] * 2]
    assert book.publish(5) == [1, 2] and book.admissible(4) and not book.admissible(3)


def test_the_book_tracks_pulls_and_holders_and_confirms_a_version_once() -> None:
    book = WeightBook(0)
    book.publish(0)
    book.pull_started("a", 0)
    assert book.pulling(0) == {"a"} and book.holders(0) == frozenset()
    book.confirmed("a", 0)
    book.confirmed("b", 0)
    assert book.state(0) is VersionState.CONFIRMED and book.holders(0) == {"a", "b"} and not book.pulling(0)
    assert book.publish(1) == [0] and book.state(0) is VersionState.RETIRED
    book.pull_started("a", 1)  # still holds 0 while it pulls 1
    assert book.holders(0) == {"a", "b"} and book.pulling(1) == {"a"}
    book.confirmed("a", 1)
    assert book.holders(0) == {"b"} and book.holders(1) == {"a"} and not book.pulling(1)
    book.pull_started("b", 1)
    book.gone("b")
    assert book.holders(0) == frozenset() and book.pulling(1) == frozenset()


def test_nothing_is_admissible_before_a_publish_and_a_negative_bound_is_refused() -> None:
    assert not WeightBook(3).admissible(0)
    with pytest.raises(ValueError, match="at least 0"):
        WeightBook(-1)


RELAY = RelayParams(upload_bps=0.5e9, egress_bps=0.5e9, chunk_bytes=4 << 20)


def test_a_reload_with_relays_follows_the_plans_pipelined_chain() -> None:
    """E = r = u: the plan is one chain, so each instance pulls from the one before it."""
    c = FleetCore(fx.FleetParams(relay=RELAY))
    for name in "abcd":
        c.handle(fx.Added(0.0, name, 0.5e9))
    c.handle(fx.Published(1.0, 0, nbytes=269_000_000))
    pulls = only(c.handle(fx.ReloadAsked(2.0)), fx.StartPull)
    assert [p.sources for p in pulls] == [(), ("a",), ("b",), ("c",)]
    assert c.weights.sources("c") == ("b",)
    for name in "abcd":
        c.handle(fx.PullDone(3.0, name, 0))
    assert c.weights.sources("c") == ()  # a finished pull draws on nobody


def test_without_relays_every_pull_is_from_the_trainer_alone() -> None:
    c = core(ready=3)
    c.handle(fx.Published(1.0, 1))
    assert {p.sources for p in only(c.handle(fx.ReloadAsked(2.0)), fx.StartPull)} == {()}
    assert only(c.handle(fx.Added(3.0, "late")), fx.StartPull)[0].sources == ()


def test_a_lone_joiner_pulls_from_peers_only_while_they_would_feed_it_as_fast_as_the_trainer() -> None:
    """Uploads of 0.5 Gbit/s, the trainer's egress 0.25: holders before pullers, least loaded first."""
    c = core(ready=2, relay=RelayParams(upload_bps=0.5e9, egress_bps=0.25e9))
    (first,) = only(c.handle(fx.Added(1.0, "j1")), fx.StartPull)
    assert first.sources == ("rollout-0", "rollout-1")  # both hold it, both idle: by name
    (second,) = only(c.handle(fx.Added(1.0, "j2")), fx.StartPull)
    assert second.sources == ("rollout-1", "rollout-0")  # rollout-0 already feeds j1
    c.handle(fx.Reclaimed(2.0, "rollout-1", Leave.PREEMPTED, "reclaimed"))
    (third,) = only(c.handle(fx.Added(2.0, "j3")), fx.StartPull)
    assert third.sources == ("rollout-0", "j1")  # half of 0.5 ties the trainer's 0.25; then a puller
    (fourth,) = only(c.handle(fx.Added(2.0, "j4")), fx.StartPull)
    assert fourth.sources == ()  # a third of rollout-0's upload is less than the idle trainer's egress
    assert c.weights.fed_by(None) == ["j4"] and c.weights.fed_by("rollout-0") == ["j1", "j3"]


@pytest.mark.parametrize("upload", [0.0, -1e9])
def test_relays_with_no_upload_are_refused_with_the_fix(upload: float) -> None:
    with pytest.raises(ValueError, match=r"upload_gbps is -?[01]:.*relay: false"):
        RelayParams(upload_bps=upload, egress_bps=1e9)


def test_a_reload_holds_an_instance_for_pinned_episodes_only_while_its_version_is_admissible() -> None:
    c = FleetCore(fx.FleetParams(max_staleness=1))
    for name in ("a", "b"):
        c.handle(fx.Added(0.0, name))
    c.handle(fx.Published(1.0, 0))
    c.handle(fx.ReloadAsked(2.0))
    c.handle(fx.PullDone(3.0, "a", 0))
    c.handle(fx.PullDone(3.0, "b", 0))
    c.handle(fx.Published(4.0, 1))
    effects = c.handle(fx.ReloadAsked(5.0, hold=("a",)))
    assert effects == [fx.Note("a stays at v0 for the endpoint's episodes"), fx.StartPull("b", 1, RELOAD)]
    assert c.handle(fx.PullDone(6.0, "b", 1)) == [fx.Joined("b", 1, RELOAD, 0, 5.0), fx.ReloadDone()]
    assert c.serving() == ["a", "b"]  # a still serves at v0, admissible under max_staleness 1
    c.handle(fx.Published(7.0, 2))  # v0 is now two behind: a reloads although held
    pulls = only(c.handle(fx.ReloadAsked(8.0, hold=("a",))), fx.StartPull)
    assert [p.name for p in pulls] == ["a", "b"]


def test_a_reload_never_holds_every_instance() -> None:
    c = FleetCore(fx.FleetParams(max_staleness=2))
    c.handle(fx.Added(0.0, "a"))
    c.handle(fx.Published(1.0, 0))
    c.handle(fx.ReloadAsked(2.0))
    c.handle(fx.PullDone(3.0, "a", 0))
    c.handle(fx.Published(4.0, 1))
    assert only(c.handle(fx.ReloadAsked(5.0, hold=("a",))), fx.StartPull) == [fx.StartPull("a", 1, RELOAD)]


def test_a_pipelined_iterations_requests_queue_behind_the_running_ones() -> None:
    c = core(ready=1, request_batch=2)
    c.handle(fx.Begun(0.0, 1, reqs(3)))  # r0 r1 run, r2 waits
    nxt = tuple(fx.RequestSpec(f"s{i}", f"next-{i}", 2) for i in range(2))
    assert c.handle(fx.Begun(0.5, 2, nxt)) == []
    assert list(c.pending) == ["r2", "s0", "s1"] and c.outstanding == 5 and c.iteration == 2
    for rid in ("r0", "r1"):
        c.handle(fx.Arrived(1.0, "rollout-0", rid))
    assert c.handle(fx.StreamEnded(1.0, "rollout-0")) == [fx.Route("rollout-0", ("r2", "s0"), 2, (0, 0))]


def test_a_reload_mid_batch_lets_the_batch_finish_on_its_version_then_pulls() -> None:
    c = core(ready=2, request_batch=2, max_staleness=1)
    c.handle(fx.Begun(0.0, 1, reqs(2)))  # r0 r1 on rollout-0; rollout-1 idle
    c.handle(fx.Published(1.0, 1))
    assert c.handle(fx.ReloadAsked(1.0)) == [fx.StartPull("rollout-1", 1, RELOAD)]
    assert c.reloading == {"rollout-0", "rollout-1"}
    c.handle(fx.PullDone(2.0, "rollout-1", 1))
    assert c.handle(fx.Arrived(2.5, "rollout-0", "r0")) == [fx.Accepted("rollout-0", "r0", None)]
    c.handle(fx.Arrived(3.0, "rollout-0", "r1"))
    assert c.handle(fx.StreamEnded(3.0, "rollout-0")) == [fx.StartPull("rollout-0", 1, RELOAD)]
    assert only(c.handle(fx.PullDone(4.0, "rollout-0", 1)), fx.ReloadDone) == [fx.ReloadDone()]
    assert c.serving_versions() == {"rollout-0": 1, "rollout-1": 1}


def test_an_instance_that_drains_mid_reload_no_longer_holds_the_reload_up() -> None:
    c = core(ready=1, request_batch=2, max_staleness=1)
    c.handle(fx.Begun(0.0, 1, reqs(2)))
    c.handle(fx.Published(1.0, 1))
    c.handle(fx.ReloadAsked(1.0))
    c.handle(fx.Scaled(1.5, remove=("rollout-0",)))
    for rid in ("r0", "r1"):
        c.handle(fx.Arrived(2.0, "rollout-0", rid))
    assert fx.ReloadDone() in c.handle(fx.StreamEnded(2.0, "rollout-0")) and c.reloading is None


def test_with_in_flight_swaps_a_reload_reaches_busy_instances_at_once_and_their_batch_goes_on() -> None:
    c = core(ready=2, request_batch=2, max_staleness=1, swap_in_flight=True)
    c.handle(fx.Begun(0.0, 1, reqs(2)))  # r0 r1 on rollout-0; rollout-1 idle
    c.handle(fx.Published(1.0, 1))
    pulls = c.handle(fx.ReloadAsked(1.0))
    assert pulls == [fx.StartPull("rollout-0", 1, RELOAD), fx.StartPull("rollout-1", 1, RELOAD)]
    assert c.handle(fx.Arrived(1.5, "rollout-0", "r0")) == [fx.Accepted("rollout-0", "r0", None)]
    c.handle(fx.PullDone(2.0, "rollout-1", 1))
    assert only(c.handle(fx.PullDone(2.5, "rollout-0", 1)), fx.ReloadDone) == [fx.ReloadDone()]
    assert c.handle(fx.Arrived(3.0, "rollout-0", "r1")) == [fx.Accepted("rollout-0", "r1", None)]
    assert c.handle(fx.StreamEnded(3.0, "rollout-0")) == []  # swapped in already: nothing left to pull
    assert c.serving_versions() == {"rollout-0": 1, "rollout-1": 1} and c.outstanding == 0


@pytest.mark.parametrize("leave", [Leave.DRAINING, Leave.PREEMPTED])
def test_an_instance_reclaimed_while_it_swaps_under_a_running_batch_loses_nothing(leave: Leave) -> None:
    """Mid-pull it has nothing it could finish on a confirmed version: it goes at once, and its
    requests resume elsewhere from what the store saved of them."""
    c = core(ready=2, request_batch=2, max_staleness=1, swap_in_flight=True)
    c.handle(fx.Begun(0.0, 1, reqs(2)))
    c.handle(fx.Published(1.0, 1))
    c.handle(fx.ReloadAsked(1.0))
    c.handle(fx.Arrived(1.2, "rollout-0", "r0"))
    c.handle(fx.PullDone(1.5, "rollout-1", 1))
    out = c.handle(fx.Reclaimed(2.0, "rollout-0", leave, "reclaimed"))
    assert fx.ReadSaved("rollout-0", ("r1",)) in out and c.reloading is None
    resumed = c.handle(fx.SavedRead(2.5, "rollout-0", (("r1", 3),)))
    assert only(resumed, fx.Route) == [fx.Route("rollout-1", ("r1",), 2, (3,))]
    assert c.serving_versions() == {"rollout-1": 1} and c.outstanding == 1


def test_a_saved_trace_loads_back_and_replays_to_the_same_effects(tmp_path: Path) -> None:
    """`run.record_fleet`'s file: what a job saved, read back, replays as it was recorded."""
    c = FleetCore(fx.FleetParams())
    trace = FleetTrace.begin(c)
    for event in (fx.Added(0.0, "a"), fx.Published(1.0, 0), fx.ReloadAsked(2.0), fx.PullDone(3.0, "a", 0)):
        trace.add(event, c.handle(event))
    save_trace(trace, tmp_path / "fleet_trace.pkl")
    loaded = load_trace(tmp_path / "fleet_trace.pkl")
    assert loaded.steps == trace.steps and compare(loaded, replay(loaded)) == []
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"not": "a trace"}))
    with pytest.raises(TypeError, match="not a recorded trace"):
        load_trace(tmp_path / "other.pkl")
