"""One real local Ray session per test module (ray.init costs about 5-10 s on 2 cores), shared by the
module's tests, and the check that keeps them apart: after each test, nothing that test started is
left on the cluster, no live actor, no placement group, no named actor. What a module-scoped fixture
holds (a job, a fleet) was made before the test began and is not the test's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import ray


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    # two logical GPUs (this machine has none): GPU-stage verifier workers can be placed, and their
    # runs then find no device and say so
    ray.init(
        num_cpus=8, num_gpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False
    )
    yield
    ray.shutdown()


@dataclass(frozen=True)
class Held:
    """What is alive on the cluster: actor ids, placement group ids and named actors."""

    actors: frozenset[str]
    groups: frozenset[str]
    named: frozenset[str]

    @staticmethod
    def now() -> Held:
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
    deadline = time.monotonic() + 15
    while (left := Held.now().left_beyond(before)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"the test left on the shared Ray session: {'; '.join(left)}"
