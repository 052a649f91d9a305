"""One real local Ray cluster for the modules of tests/ray (ray.init costs about 5-10 s on 2 cores,
and a module of its own each cost the Ray lane about 35 s in all), and the checks that keep its users
apart: after each test, nothing that test started is left on the cluster, no live actor, no placement
group, no named actor; after each module, nothing the module started either (its module fixtures, a
job or a fleet, are stopped by then). What a module-scoped fixture holds was made before its tests
began and is not theirs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import ray


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    # two logical GPUs (this machine has none): GPU-stage verifier workers can be placed, and their
    # runs then find no device and say so
    ray.init(
        num_cpus=8, num_gpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_session(ray_cluster: None) -> Iterator[None]:
    """The shared cluster, for one module: when the module is done (its module fixtures torn down
    first, as they depend on this one), nothing it started is alive."""
    before = Held.now()
    yield
    left = settled(before)
    assert not left, f"the module left on the shared Ray session: {'; '.join(left)}"


@dataclass(frozen=True)
class Held:
    """What is alive on the cluster: actor ids, placement group ids and named actors."""

    actors: frozenset[str]
    groups: frozenset[str]
    named: frozenset[str]

    @staticmethod
    def now() -> Held:
        # private on purpose: Ray's public state API (`ray.util.state.list_actors`) asks the
        # dashboard's API server, which this shared cluster leaves off (`include_dashboard=False`:
        # start-up time and memory on two cores); without it the call fails with ServerUnavailable
        from ray._private.state import actors
        from ray.util.placement_group import placement_group_table

        live = {a for a, info in actors().items() if info["State"] != "DEAD"}
        groups = {g for g, info in placement_group_table().items() if info["state"] != "REMOVED"}
        named = {f"{a['namespace']}/{a['name']}" for a in ray.util.list_named_actors(all_namespaces=True)}
        return Held(frozenset(live), frozenset(groups), frozenset(named))

    def left_beyond(self, before: Held) -> list[str]:
        return [
            f"{len(new)} {kind}: {sorted(new)[:5]}"
            for kind, new in (
                ("actor(s)", self.actors - before.actors),
                ("placement group(s)", self.groups - before.groups),
                ("named actor(s)", self.named - before.named),
            )
            if new
        ]


@pytest.fixture(autouse=True)
def nothing_left_on_the_cluster() -> Iterator[None]:
    """After a test on a shared Ray session, none of its actors, placement groups or named actors
    is alive (a killed actor takes a moment to be marked dead: up to 15 s are allowed)."""
    if not ray.is_initialized():  # the test does not run on the module's session
        yield
        return
    before = Held.now()
    yield
    left = settled(before)
    assert not left, f"the test left on the shared Ray session: {'; '.join(left)}"


def settled(before: Held, wait_s: float = 15.0) -> list[str]:
    """What is alive beyond `before`, once a killed actor has had `wait_s` to be marked dead."""
    deadline = time.monotonic() + wait_s
    while (left := Held.now().left_beyond(before)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left
