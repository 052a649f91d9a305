"""The fleet core's refill by slot (`rollout.refill: slot`): the rows arrivals free take the next
requests, once `refill_min` of them are free, and an instance due to reload takes nothing new. The
driver is played by hand, as in test_core_fleet.py, whose helpers these tests use."""

from __future__ import annotations

from rlsched.core import fleet_io as fx
from tests.unit.test_core_fleet import RELOAD, core, reqs


def test_refilled_by_slot_each_arrival_frees_a_row_that_takes_the_next_request_at_once() -> None:
    c = core(ready=2, request_batch=3, refill=fx.Refill.SLOT)
    assert c.handle(fx.Begun(1.0, 1, reqs(8))) == [
        fx.Route("rollout-0", ("r0", "r1", "r2"), 1, (0, 0, 0)),
        fx.Route("rollout-1", ("r3", "r4", "r5"), 2, (0, 0, 0)),
    ]
    assert c.handle(fx.Arrived(2.0, "rollout-1", "r4")) == [
        fx.Accepted("rollout-1", "r4", None),
        fx.Route("rollout-1", ("r6",), 3, (0,)),  # its route 2 runs on: r3 and r5 still decode
    ]
    assert c.handle(fx.Arrived(2.1, "rollout-0", "r0")) == [
        fx.Accepted("rollout-0", "r0", None),
        fx.Route("rollout-0", ("r7",), 4, (0,)),
    ]
    assert c.handle(fx.Arrived(2.2, "rollout-0", "r1")) == [
        fx.Accepted("rollout-0", "r1", None)
    ]  # none waits
    # route 3 ends without r6 (aborted): r6 alone goes back, to the first free row (r1's)
    assert c.handle(fx.StreamEnded(2.5, "rollout-1", 3)) == [fx.Route("rollout-0", ("r6",), 5, (0,))]
    running = {n: v["running"] for n, v in c.snapshot()["instances"].items()}
    assert running == {"rollout-0": 3, "rollout-1": 2}  # r2 r7 r6; route 2's r3 r5 run on


def test_refilled_by_slot_with_a_minimum_an_instance_takes_more_once_that_many_rows_are_free() -> None:
    c = core(ready=1, request_batch=4, refill=fx.Refill.SLOT, refill_min=2)
    assert c.handle(fx.Begun(0.0, 1, reqs(7))) == [
        fx.Route("rollout-0", ("r0", "r1", "r2", "r3"), 1, (0,) * 4)
    ]
    assert c.handle(fx.Arrived(1.0, "rollout-0", "r0")) == [fx.Accepted("rollout-0", "r0", None)]  # 1 free
    assert c.handle(fx.Arrived(1.1, "rollout-0", "r1")) == [
        fx.Accepted("rollout-0", "r1", None),
        fx.Route("rollout-0", ("r4", "r5"), 2, (0, 0)),
    ]
    assert c.handle(fx.Arrived(1.2, "rollout-0", "r2")) == [
        fx.Accepted("rollout-0", "r2", None),
        fx.Route("rollout-0", ("r6",), 3, (0,)),  # the last one waiting: fewer than the minimum go
    ]


def test_refilled_by_slot_an_instance_due_to_reload_takes_nothing_new_and_pulls_once_its_routes_end() -> None:
    c = core(ready=2, request_batch=2, refill=fx.Refill.SLOT, max_staleness=1)
    c.handle(fx.Begun(0.0, 1, reqs(6)))  # r0 r1 on rollout-0, r2 r3 on rollout-1; r4 r5 wait
    c.handle(fx.Published(1.0, 1))
    assert c.handle(fx.ReloadAsked(1.0)) == []  # both busy: each pulls after its routes
    assert c.handle(fx.Arrived(2.0, "rollout-0", "r0")) == [fx.Accepted("rollout-0", "r0", None)]
    assert list(c.pending) == ["r4", "r5"]  # its freed row stays empty
    c.handle(fx.Arrived(2.1, "rollout-0", "r1"))
    assert c.handle(fx.StreamEnded(2.2, "rollout-0", 1)) == [fx.StartPull("rollout-0", 1, RELOAD)]
