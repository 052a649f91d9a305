"""The OpenAI endpoint over the Ray rollout fleet: one actor hosts the HTTP server, and every request
streams from a rollout instance chosen by the fleet's routing rule.

Why an actor and not Ray Serve: the endpoint's one decision is which instance takes a request, by
the fleet's state (READY, admissible version, the version an episode is pinned to) and not by the
load-balancing Serve's router does; and its streams come from instance actors the fleet already
runs, so Serve's controller and HTTP proxy actors would only add processes (a second per-node
proxy, its own port) and a second autoscaler beside the fleet core's. One actor running uvicorn
(`rlsched.serve.server.start`) is the whole server; it holds no state a restart would lose except
the captured episodes, which it hands to the trainer.

`FleetBackend` is the app's backend (`rlsched.serve.backend.Backend`). It reads no instance's state
itself: whoever owns the fleet pushes the fleet as its core has it (`sync`: each live instance's
handle, state and weight version, and the version the fleet was last reloaded to; a job's fleet core
on every join, pull, departure and reload, `actors.endpoint_link`; standalone, `serve_fleet` once the
instances have joined). It routes each request with `rlsched.policy.routing.route` (READY at an
admissible version, the pin of an episode's later turns, then the fewest of its own requests), and
sends it there (`submit_stream`). Each instance streams all of this backend's requests on one Ray
streaming generator (`mux`: one message a decoding step for the whole batch, not one per request and
token), read on the server's loop, each event into its request's queue. A client that goes away
cancels the request on its instance; an instance whose stream dies takes nothing more until the owner
says otherwise, and its requests fail with the reason.

`actors.endpoint_serve.serve_fleet` starts all of it for `rlsched serve` on the embedded cluster.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter, OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rlsched.config import EndpointConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, check_fits
from rlsched.engine.stream_server import EngineStopped, Event, Withdrawn
from rlsched.policy.lifecycle import InstanceState
from rlsched.policy.routing import InstanceView, NoInstance, route
from rlsched.serve.hosted import HostedEndpoint

log = logging.getLogger(__name__)

SERVED_BY = 65536  # requests whose instance is remembered (an open episode's last turn is among them)


@dataclass
class _Stream:
    instance: str
    events: asyncio.Queue[Event]
    started: bool = False
    cancelled: bool = False


Member = tuple[Any, str, int]  # a live instance as the fleet's owner has it: handle, state, version


@dataclass
class _Instance:
    handle: Any
    rows: int
    state: str = str(InstanceState.ALLOCATED)
    version: int = -1
    running: int = 0  # this backend's requests there that have a token
    waiting: int = 0  # and those that have none yet
    mux: asyncio.Task[None] | None = None  # reading its stream of this backend's requests (`mux`)
    mux_of: Any = None  # the handle that stream comes from (a rejoined instance has another)


@dataclass
class RouteCounts:
    routed: Counter[str] = field(default_factory=Counter)  # requests per instance
    mixed: int = 0  # pinned turns that ran at another version


class FleetBackend:
    def __init__(
        self,
        members: Mapping[str, Member],
        *,
        context_length: int,
        rows: int,
        max_staleness: int,
        latest: int,
    ) -> None:
        self._rows = rows
        self._instances: dict[str, _Instance] = {}
        self._context_length = context_length
        self.max_staleness = max_staleness
        self.latest = latest
        self.counts = RouteCounts()
        self._streams: dict[RequestId, _Stream] = {}
        self.served_by: OrderedDict[RequestId, str] = OrderedDict()  # the latest SERVED_BY requests
        self.reader = uuid.uuid4().hex  # this backend's name on the instances' streams
        self._tasks: set[asyncio.Task[None]] = set()
        self.sync(members, latest)

    # -- the fleet's state, as its owner pushes it -------------------------------------------------
    def sync(self, members: Mapping[str, Member], latest: int) -> None:
        """The fleet now: each live instance's handle, state and version, and the version it was last
        reloaded to (routing admits versions down to it minus max_staleness). An instance no longer
        live takes nothing more; requests running there finish or fail there."""
        streaming = {s.instance for s in list(self._streams.values())}
        fleet = {}
        for name, (handle, state, version) in members.items():
            member = self._instances.get(name) or _Instance(handle, self._rows)
            member.handle, member.state, member.version = handle, state, version
            fleet[name] = member
        for name, member in self._instances.items():
            if name not in fleet and name in streaming:
                member.state = str(InstanceState.RELEASED)
                fleet[name] = member
        self._instances, self.latest = fleet, latest  # the loop's thread reads them: one assignment each

    def views(self) -> list[InstanceView]:
        return [
            InstanceView(name, m.state == str(InstanceState.READY), m.version, m.running + m.waiting, m.rows)
            for name, m in self._instances.items()
        ]

    # -- the Backend protocol -------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def waiting(self) -> int:
        return sum(m.waiting for m in self._instances.values())

    @property
    def running(self) -> int:
        return sum(m.running for m in self._instances.values())

    @property
    def backlog(self) -> int:
        ready = [m for m in self._instances.values() if m.state == str(InstanceState.READY)]
        return max(0, self.waiting - sum(max(0, m.rows - m.running) for m in ready))

    def submit(
        self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event], pin: int | None = None
    ) -> None:
        check_fits(req, self._context_length)
        routed = route(self.views(), self.latest, self.max_staleness, pin)
        if isinstance(routed, NoInstance):
            raise EngineStopped(routed.reason)
        if routed.mixed is not None:
            self.counts.mixed += 1
            log.warning("request %s of an episode at version %s: %s", req.request_id, pin, routed.mixed)
        member = self._instances[routed.name]
        member.waiting += 1
        self.counts.routed[routed.name] += 1
        self.served_by[req.request_id] = routed.name
        if len(self.served_by) > SERVED_BY:
            self.served_by.popitem(last=False)
        stream = _Stream(routed.name, events)
        self._streams[req.request_id] = stream
        if member.mux is None or member.mux_of is not member.handle:  # one stream for all requests
            member.mux_of = member.handle
            member.mux = self._task(self._read(routed.name, member, member.handle.mux.remote(self.reader)))
        sent = member.handle.submit_stream.remote(req, priority, self.reader)
        self._task(self._sent(req.request_id, sent))

    def _task(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel(self, request_id: RequestId) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and not stream.cancelled:
            stream.cancelled = True
            self._instances[stream.instance].handle.cancel.remote(request_id)

    def close(self) -> None:
        return None

    # -- on the server's loop -------------------------------------------------------------------
    async def _read(self, name: str, member: _Instance, refs: Any) -> None:
        """An instance's stream of this backend's requests: each event to its request's queue."""
        why = "was released"
        try:
            async for ref in refs:
                for rid, event in await ref:
                    self._deliver(RequestId(rid), event)
        except (RayTaskError, RayActorError) as err:
            member.state = str(InstanceState.PREEMPTED)  # until the fleet's owner says otherwise
            why = f"is gone: {err}"
        finally:
            if member.mux is asyncio.current_task():  # not a stream a rejoined instance replaced
                member.mux = None
                for rid in [r for r, s in self._streams.items() if s.instance == name]:
                    self._deliver(rid, EngineStopped(f"instance {name} {why}"))

    async def _sent(self, rid: RequestId, ref: Any) -> None:
        """A request the instance refused (not ready, or one it cannot run) fails with the reason."""
        try:
            await ref
        except RayTaskError as err:
            self._deliver(rid, err.as_instanceof_cause())
        except RayActorError as err:
            self._deliver(rid, EngineStopped(f"its instance is gone: {err}"))

    def _deliver(self, rid: RequestId, event: Event | BaseException) -> None:
        """One event of a request: its tokens (none to a request its client left), its sample, or the
        exception it failed with; the last two end it (a `Withdrawn` one ends it unseen)."""
        stream = self._streams.get(rid)
        if stream is None:  # it ended already (a failure told twice)
            return
        member = self._instances[stream.instance]
        failed = isinstance(event, BaseException)
        if not stream.started and not failed:
            stream.started = True
            member.waiting, member.running = member.waiting - 1, member.running + 1
        if (failed and not isinstance(event, Withdrawn)) or not (failed or stream.cancelled):
            stream.events.put_nowait(event)
        if failed or isinstance(event, Sample):
            del self._streams[rid]
            if stream.started:
                member.running -= 1
            else:
                member.waiting -= 1


# -- the actor --------------------------------------------------------------------------------------


class Endpoint(HostedEndpoint):
    """The HTTP server over the fleet, in an actor of its own (see the module's docstring): the job's
    side (`rlsched.serve.hosted`) over a `FleetBackend`, which whoever owns the fleet keeps told."""

    def __init__(
        self,
        members: Mapping[str, Member],
        checkpoint: str,
        cfg: EndpointConfig,
        *,
        max_staleness: int,
        latest: int,
        **hosted: Any,
    ) -> None:
        """`hosted`: `HostedEndpoint`'s keywords (template, journal, rewards and the rest)."""
        first = next(iter(members.values()))[0]
        context_length, rows = ray.get(first.describe.remote())
        self.backend = FleetBackend(
            members, context_length=context_length, rows=rows, max_staleness=max_staleness, latest=latest
        )
        super().__init__(self.backend, Path(checkpoint), cfg, **hosted)

    def sync(self, members: Mapping[str, Member], latest: int) -> None:
        """The fleet as its owner has it (`FleetBackend.sync`)."""
        self.backend.sync(members, latest)

    def pins(self) -> dict[int, dict[str, int]]:
        """For each version that open episodes began on, how many of them each instance served:
        what a reload must leave in place (`rlsched.policy.routing.hold_back`)."""
        pins: dict[int, dict[str, int]] = {}
        for episode in self.store.all():
            if episode.ended is None and episode.turns:
                by = pins.setdefault(episode.turns[0].weight_version, {})
                name = self.backend.served_by.get(RequestId(episode.turns[-1].request_id))
                if name is not None:
                    by[name] = by.get(name, 0) + 1
        return pins

    def load(self) -> tuple[int, int]:
        """Requests streaming from an instance, and those sent that have no token yet."""
        return self.backend.running, self.backend.waiting

    def routed(self) -> tuple[dict[str, int], int]:
        """Requests sent to each instance, and pinned turns that ran at another version."""
        return dict(self.backend.counts.routed), self.backend.counts.mixed


EndpointActor = ray.remote(num_cpus=0, max_concurrency=4)(Endpoint)


# -- standalone: `rlsched serve` on the embedded cluster -------------------------------------------
