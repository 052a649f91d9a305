"""The rollout fleet on Ray: a driver of the fleet's state core (`rlsched.core.fleet`), which decides
routing, joins, reloads, transient windows, reclaims with resume or restart, and exactly-once
acceptance. This module turns Ray completions into its events and its effects into Ray calls:

- `StartInstance`, `StartPull` and `KillInstance` go to the instances' actors (`actors.instances`):
  a pull's report or failure becomes `PullDone`.
- `Route` starts a streaming `generate` call (`episodes`, by `actors.agent_episodes`, for a multi-turn
  job); each sample or episode it yields is `Arrived`, its end `StreamEnded`, and an actor that died
  under it `Reclaimed` (preempted).
- `ReadSaved` and `CutSaved` go to the durable store (`rlsched.store.resumes`): what a reclaimed
  instance saved, and what each requeued request continues from. An `Accepted` sample is stitched
  with its saved log-probabilities and handed to the controller.
- `Joined`, `Left` and a resumed `Accepted` become spans (`rlsched.rollout.spans`), `Note` a log line;
  a pull, a join, a departure or a reload tells the `watchers` (the endpoint's view of the fleet).

With `record`, every event and its effects are kept (`rlsched.core.trace`): replayed through the
simulator (`rlsched.sim.replay`), they give the same decisions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from actors.instances import Instances
from actors.scale import ScaleCommand
from actors.trainer import PublishedVersion
from rlsched.config import JobConfig
from rlsched.config_params import fleet_params, retries, swap_fallback
from rlsched.core import fleet_io as fx
from rlsched.core.fleet import FleetCore, FleetTrace
from rlsched.engine.protocol import GenerationRequest, Sample
from rlsched.errors import UserError
from rlsched.metrics.spans import Span
from rlsched.policy.lifecycle import Leave
from rlsched.policy.versions import PipelineMode
from rlsched.rl.episode_runs import EpisodeRun
from rlsched.rl.requests import request_spec
from rlsched.rollout.instance import JoinReport
from rlsched.rollout.spans import preempt_span, pull_spans, resume_span, route_span
from rlsched.store.partial import PartialStore
from rlsched.store.resumes import Resumes


class Fleet:
    CHANGES = (fx.StartPull, fx.Joined, fx.Left, fx.KillInstance, fx.ReloadDone)  # what watchers hear of

    def __init__(
        self,
        cfg: JobConfig,
        checkpoint: str | None,
        store_path: Path | None,
        spans: list[Span],
        clock: Callable[[], float],
        log: Callable[[str], None],
    ) -> None:
        self.cfg, self.checkpoint, self.spans, self.clock, self.log = cfg, checkpoint, spans, clock, log
        store = PartialStore(store_path) if store_path is not None else None
        if store is not None:
            store.reset()  # request ids repeat across runs: start empty
        self.store_path = store_path
        self.resumes = Resumes(store)
        self.core = FleetCore(fleet_params(cfg))
        fallback = swap_fallback(cfg)
        if fallback is not None and cfg.schedule.mode is PipelineMode.ASYNC:
            log(fallback)
        self.instances = Instances(cfg, checkpoint, store_path, retries(cfg).weight_pull, log)
        self.latest: PublishedVersion | None = None
        self.requests: dict[str, GenerationRequest] = {}  # this iteration's, by id
        self.route_other: Callable[[fx.Route], None] | None = None  # a multi-turn job's episodes'
        self.episodes: list[tuple[str, EpisodeRun]] = []  # episodes accepted, until their producer takes them
        self.join_reports: list[JoinReport] = []
        self.trace: FleetTrace | None = None
        self.granted: set[str] = set()  # instances the cluster scheduler lent: never replaced
        self._reports: dict[str, JoinReport] = {}
        self._replies: list[fx.Event] = []
        self._sample: Sample | EpisodeRun | None = None  # what is being fed, for its `Accepted`
        self._accepted: list[tuple[str, Sample]] = []
        self._reload_done = False
        self._routed: dict[tuple[str, int], tuple[float, int]] = {}  # (instance, route) -> its start, size
        self.watchers: list[Callable[[], None]] = []  # told when who serves at which version changes
        self._changed = False
        self.reloaded_to = 0  # the version the last reload brought every instance to

    # -- feeding the core ----------------------------------------------------------------------------

    def record(self) -> FleetTrace:
        """Keep every event and its effects from now on (the trace-equivalence test's record)."""
        self.trace = FleetTrace.begin(self.core)
        return self.trace

    def _feed(self, event: fx.Event) -> None:
        self._replies.append(event)
        while self._replies:  # the store's answers are fed once the effects before them are done
            event = self._replies.pop(0)
            effects = self.core.handle(event)
            if self.trace is not None:
                self.trace.add(event, effects)
            for effect in effects:
                self._do(effect)
        if self._changed and self.watchers:  # who serves, at which version: the endpoint's view
            self._changed = False
            for watcher in self.watchers:
                watcher()

    def _do(self, e: fx.Effect) -> None:
        self._changed = self._changed or isinstance(e, self.CHANGES)
        match e:
            case fx.Route():
                self._route(e)
            case fx.Accepted():
                self._accept(e)
            case fx.StartPull():
                self._pull(e)
            case fx.StartInstance():
                self._start(e)
            case fx.KillInstance():
                self.instances.kill(e.name)
            case fx.ReadSaved():
                self._replies.append(fx.SavedRead(self.clock(), e.name, self.resumes.read(e.requests)))
            case fx.CutSaved():
                self.resumes.cut(e.request_id, e.keep)
            case fx.Joined():
                self._joined(e)
            case fx.Left() if e.leave is Leave.PREEMPTED:
                self.spans.append(preempt_span(e, self.clock(), self.core.iteration))
            case fx.ReloadDone():
                self._reload_done, self.reloaded_to = True, self.core.weights.latest or 0
            case fx.Note():
                self.log(e.message)

    # -- effects -----------------------------------------------------------------------------------

    def _start(self, e: fx.StartInstance) -> None:
        relay = self.core.params.relay
        self.instances.start(e.name, e.ingress_bps, relay.upload_bps if relay is not None else None)

    def _pull(self, e: fx.StartPull) -> None:
        assert self.latest is not None and self.latest.version == e.version
        self.instances.pull(e.name, self.latest.address, e.version, e.sources)

    def _route(self, e: fx.Route) -> None:
        self._routed[(e.name, e.dispatch)] = (self.clock(), len(e.requests))
        if self.route_other is not None and e.requests[0] not in self.requests:
            self.route_other(e)  # episodes: run by their producer's instances' calls
            return
        batch = [self.requests[rid] for rid in e.requests]
        for k, (rid, keep) in enumerate(zip(e.requests, e.resume, strict=True)):
            if keep:  # what the store kept for it (the core's cut, at most what was saved)
                batch[k] = dataclasses.replace(batch[k], resume_ids=self.resumes.resume_ids(rid))
        self.instances.generate(e.name, batch, e.dispatch)

    def _accept(self, e: fx.Accepted) -> None:
        item = self._sample
        if isinstance(item, EpisodeRun):
            self.episodes.append((e.name, item))
            return
        assert item is not None and item.request_id == e.request_id
        done = self.resumes.finish(item)
        if e.resumed is not None and done.resumed_from:
            self.spans.append(resume_span(e.resumed, done, self.clock(), self.core.iteration))
        self._accepted.append((e.name, done.sample))

    def _joined(self, e: fx.Joined) -> None:
        report = self._reports.pop(e.name)
        self.spans.extend(pull_spans(e, report))
        if e.why is fx.PullWhy.JOIN:
            self.join_reports.append(report)
            self.log(report.line(self.instances.relay_names()))

    # -- what the controller asks ------------------------------------------------------------------

    @property
    def counts(self) -> fx.FleetCounts:
        return self.core.counts

    def add(self, name: str, pg: Any = None) -> None:
        """A static instance, or one the cluster scheduler granted (in its placement group)."""
        if pg is not None:
            self.instances.place(name, pg)
        self._feed(fx.Added(self.clock(), name, (self.cfg.weights.receiver_gbps or 0.0) * 1e9))

    def grant(self, name: str, pg: Any) -> None:
        """The cluster scheduler granted an elastic part: it joins unless it is already live."""
        if not self.core.live(name):
            self.granted.add(name)
            self.add(name, pg)
            self.log(f"{name} granted by the cluster scheduler; it serves once it has the latest version")

    def replenish(self, target: int) -> None:
        """The job's own instances back to `target` (the core starts replacements for ones gone)."""
        self._feed(fx.Replenish(self.clock(), target, tuple(sorted(self.granted))))

    def reclaim(self, name: str, why: str) -> None:
        self._feed(fx.Reclaimed(self.clock(), name, Leave.PREEMPTED, why))

    def scale(self, command: ScaleCommand) -> None:
        """`rlsched scale`: add instances (they join like any other), remove some by name."""
        gbps = command.receiver_gbps or self.cfg.weights.receiver_gbps or 0.0
        self._feed(fx.Scaled(self.clock(), command.add, gbps * 1e9, tuple(command.remove), command.leave))

    def snapshot(self) -> dict[str, Any]:
        return self.core.snapshot()

    def serving(self) -> list[str]:
        return self.core.serving()

    @property
    def handles(self) -> dict[str, Any]:
        return self.instances.handles

    def serving_versions(self) -> dict[str, int]:
        return self.core.serving_versions()

    def stranded(self) -> bool:
        return self.core.stranded()

    def begin(self, iteration: int, requests: Sequence[GenerationRequest | fx.RequestSpec]) -> None:
        """An iteration's requests (a multi-turn job's episodes: specs that `route_other` runs); a
        pipelined job's queue behind those still running."""
        mine = {str(r.request_id): r for r in requests if isinstance(r, GenerationRequest)}
        if not self.core.generating:
            self.requests = {}
            self.resumes.reset()
        self.requests.update(mine)
        specs = tuple(r if isinstance(r, fx.RequestSpec) else request_spec(r) for r in requests)
        self._feed(fx.Begun(self.clock(), iteration, specs))

    def tick(self) -> None:
        self._feed(fx.Tick(self.clock()))

    def next_event_in(self) -> float | None:
        """Seconds until the next transient window opens or closes, if any is due."""
        due = self.core.next_wakeup()
        return None if due is None else max(0.0, due - self.clock())

    def waitables(self) -> list[Any]:
        return self.instances.waitables()

    def on_ready(self, ref: Any) -> list[tuple[str, Sample]]:
        """A join finished, or a stream produced a sample, ended or failed; returns the accepted
        samples with the instance that made each."""
        if (name := self.instances.pull_of(ref)) is not None:
            self._on_pull(name, ref)
            return []
        if (key := self.instances.stream_of(ref)) is None:
            return []
        try:
            self._sample = ray.get(next(ref))
        except StopIteration:
            del self.instances.streams[key]
            if (routed := self._routed.pop(key, None)) is not None:  # the route's span: its busy time
                self.spans.append(route_span(key[0], *routed, self.clock(), self.core.iteration))
            self._feed(fx.StreamEnded(self.clock(), *key))
            return []
        except ray.exceptions.RayActorError:  # the instance died under us: reclaimed from outside
            del self.instances.streams[key]
            self.died(key[0])
            return []
        item = self._sample
        rid = item.request_id if isinstance(item, Sample) else item.episode.id
        self._feed(fx.Arrived(self.clock(), key[0], rid))
        self._sample = None
        out, self._accepted = self._accepted, []
        return out

    def died(self, name: str) -> None:
        """An instance's actor died (its process or node is gone): preempted, and replaced unless
        the cluster scheduler lent it."""
        replace = name not in self.granted
        self._feed(fx.Reclaimed(self.clock(), name, Leave.PREEMPTED, "its actor died", replace=replace))

    def _on_pull(self, name: str, ref: Any) -> None:
        try:
            report: JoinReport = ray.get(ref)
        except ray.exceptions.RayActorError:
            self.died(name)
            return
        except ray.exceptions.RayTaskError as err:
            self._feed(fx.PullDone(self.clock(), name, -1, str(err.cause)))
            return
        self._reports[name] = report
        self._feed(fx.PullDone(self.clock(), name, report.version))

    # -- between iterations -------------------------------------------------------------------------

    def publish(self, published: PublishedVersion) -> None:
        """A new version. Joins that finished while nothing waited on them (during the update) are
        reported first: a new version would otherwise restart a joiner whose pull is already done, and
        one whose start-up outlasts an iteration would chase versions for ever."""
        if refs := list(self.instances.pulls.values()):
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self.on_ready(ref)
        self.latest = published
        self._feed(fx.Published(self.clock(), published.version, published.nbytes))

    def reload(self, hold: Sequence[str] = ()) -> None:
        """Every serving instance (and any allocated one not yet pulling) takes the latest version,
        blocking; joiners already pulling catch up on their own. `hold`: instances the endpoint's
        pinned episodes keep at their version while it is admissible (`ReloadAsked.hold`)."""
        self.reload_begin(hold)
        self._pulls_until(lambda: self._reload_done)

    def reload_begin(self, hold: Sequence[str] = ()) -> None:
        """`reload` without the wait: a pipelined job goes on generating; instances in the middle of a
        batch finish it first (`reload_done` once every instance has the version)."""
        self._reload_done = False
        self._feed(fx.ReloadAsked(self.clock(), tuple(hold)))

    @property
    def reload_done(self) -> bool:
        return self._reload_done

    def wait_serving(self, timeout_s: float = 300.0) -> None:
        """Block until at least one instance serves (at start-up)."""
        self._pulls_until(lambda: bool(self.core.serving()), timeout_s)

    def _pulls_until(self, done: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Hand each weight pull that ends to the core until `done()`: a reload's (transient windows
        ticked meanwhile), or the start-up's, which gives up after `timeout_s`."""
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        while not done():
            if give_up is None:
                self.tick()  # a transient window may end meanwhile
            if not (refs := list(self.instances.pulls.values())):
                if give_up is None:
                    raise RuntimeError("the reload waits for instances, yet none is pulling")  # a core bug
                raise UserError("no rollout instance could start. " + "; ".join(self.core.join_errors[:2]))
            left = 0.5 if give_up is None else give_up - time.monotonic()
            if left < 0:
                raise UserError(
                    f"no rollout instance took the first version within {timeout_s:g} s; see the log"
                )
            ready, _ = ray.wait(refs, num_returns=1, timeout=min(left, self.next_event_in() or left))
            for ref in ready:
                self.on_ready(ref)

    def shutdown(self) -> None:
        for name, handle in self.handles.items():
            if self.core.live(name):
                ray.kill(handle)
        if self.resumes.store is not None:
            self.resumes.store.close()
