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
reads the instance's `stream` (a Ray streaming generator) on the server's loop into the request's
queue. A client that goes away cancels the request on its instance; an instance whose stream dies
takes nothing more until the owner says otherwise.

`actors.endpoint_serve.serve_fleet` starts all of it for `rlsched serve` on the embedded cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rlsched.config import EndpointConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, check_fits
from rlsched.engine.stream_server import EngineStopped, Event
from rlsched.model.checkpoint import load_prompting
from rlsched.policy.lifecycle import InstanceState
from rlsched.policy.routing import InstanceView, NoInstance, route
from rlsched.serve.episodes import Episode, EpisodeStore
from rlsched.serve.run import Served
from rlsched.serve.server import Running, start, with_chat_template
from rlsched.store.episode_journal import EpisodeJournal
from verifiers.protocol import UNIT_REWARDS, RewardRange

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


@dataclass(frozen=True)
class Judgeable:
    """An episode's final answer for the job's verifier."""

    episode_id: str
    text: str
    version: int
    reference: str
    token_ids: tuple[int, ...]


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
        refs = member.handle.stream.remote(req, priority)
        asyncio.get_running_loop().create_task(self._pump(req.request_id, stream, refs))

    def cancel(self, request_id: RequestId) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and not stream.cancelled:
            stream.cancelled = True
            self._instances[stream.instance].handle.cancel.remote(request_id)

    def close(self) -> None:
        return None

    # -- on the server's loop -------------------------------------------------------------------
    async def _pump(self, rid: RequestId, stream: _Stream, refs: Any) -> None:
        member = self._instances[stream.instance]
        try:
            async for ref in refs:
                event: Event = await ref
                if not stream.started:
                    stream.started = True
                    member.waiting, member.running = member.waiting - 1, member.running + 1
                if not stream.cancelled:
                    stream.events.put_nowait(event)
        except RayTaskError as err:
            stream.events.put_nowait(err.as_instanceof_cause())
        except RayActorError as err:
            member.state = str(InstanceState.PREEMPTED)  # until the fleet's owner says otherwise
            stream.events.put_nowait(EngineStopped(f"instance {stream.instance} is gone: {err}"))
        finally:
            del self._streams[rid]
            if stream.started:
                member.running -= 1
            else:
                member.waiting -= 1


# -- the actor --------------------------------------------------------------------------------------


class Endpoint:
    """The HTTP server over the fleet, in an actor of its own (see the module's docstring)."""

    def __init__(
        self,
        members: Mapping[str, Member],
        checkpoint: str,
        cfg: EndpointConfig,
        *,
        max_staleness: int,
        latest: int,
        template: str | None = None,
        chat_template: str | None = None,
        model_name: str | None = None,
        journal: str | None = None,
        resume_after: int | None = None,
        rewards: RewardRange = UNIT_REWARDS,
        reference_refusal: str | None = None,
    ) -> None:
        first = next(iter(members.values()))[0]
        context_length, rows = ray.get(first.describe.remote())
        self.backend = FleetBackend(
            members, context_length=context_length, rows=rows, max_staleness=max_staleness, latest=latest
        )
        path = Path(checkpoint)
        tokenizer, prompts = load_prompting(path, template)
        prompts = with_chat_template(tokenizer, prompts, Path(chat_template) if chat_template else None)
        served = Served(self.backend, tokenizer, prompts, model_name or cfg.model_name or path.name)
        served.reference_refusal = reference_refusal
        served.episodes = EpisodeStore(cfg.reward_timeout_s, rewards=rewards)
        if journal is not None:  # a job's endpoint: its episodes survive a crash of the job
            kept = EpisodeJournal(Path(journal))
            if resume_after is None:
                kept.reset()  # a new run
            served.episodes = EpisodeStore(cfg.reward_timeout_s, journal=kept, rewards=rewards)
            if resume_after is not None:
                served.episodes.restore(resume_after)
        self.running: Running = start(served, cfg)

    def address(self) -> tuple[str, int, str, int]:
        """Where it listens, the model's name and its context length."""
        served = self.running.served
        return self.running.host, self.running.port, served.model_name, self.backend.context_length

    def sync(self, members: Mapping[str, Member], latest: int) -> None:
        """The fleet as its owner has it (`FleetBackend.sync`)."""
        self.backend.sync(members, latest)

    def pins(self) -> dict[int, dict[str, int]]:
        """For each version that open episodes began on, how many of them each instance served:
        what a reload must leave in place (`rlsched.policy.routing.hold_back`)."""
        pins: dict[int, dict[str, int]] = {}
        for episode in self.running.served.episodes.all():
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

    def episodes(self) -> list[Episode]:
        """Every captured episode, as it stands (ready or not)."""
        return self.running.served.episodes.all()

    def to_judge(self) -> list[Judgeable]:
        """Ended episodes that carry a reference and await their reward, each handed out once: the
        job's verifier judges their final answer (the last turn's text)."""
        tokenizer = self.running.served.tokenizer
        return [
            Judgeable(e.id, tokenizer.decode(list(e.turns[-1].token_ids)), e.turns[-1].weight_version,
                      e.reference or "", e.turns[-1].token_ids)
            for e in self.running.served.episodes.to_judge()
        ]  # fmt: skip

    def judged(self, episode_id: str, reward: float) -> None:
        """The verifier's reward for an episode handed out by `to_judge`."""
        self.running.served.episodes.reward(episode_id, reward, judged=True)

    def take_ready(self, iteration: int = 0) -> list[Episode]:
        """The episodes ended and rewarded, each handed out once: iteration `iteration`'s batch."""
        store = self.running.served.episodes
        return store.take([e.id for e in store.ready()], iteration)

    def checkpointed(self, iteration: int) -> None:
        """A checkpoint holds the iterations up to `iteration`: the journal lets their episodes go."""
        self.running.served.episodes.checkpointed(iteration)

    def restore(self, after: int) -> int:
        """The training group was rebuilt from the checkpoint of `after`: the episodes later iterations
        took are back, to be taken again. How many."""
        return self.running.served.episodes.restore(after)

    def stop(self) -> None:
        self.running.stop()


EndpointActor = ray.remote(num_cpus=0, max_concurrency=4)(Endpoint)


# -- standalone: `rlsched serve` on the embedded cluster -------------------------------------------
