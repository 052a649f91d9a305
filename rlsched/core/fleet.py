"""The rollout fleet's state core: which instances serve, which are joining or leaving, and where every
request of an iteration is, so that each sample is produced exactly once.

The Ray fleet (`actors.fleet`) and the simulator (`rlsched.sim.fleet`) both drive this class; neither
decides anything itself. A driver feeds `handle` the events it observed, each stamped with the time it
read from its clock, and carries out the effects returned, in order:

- Routing: an iteration's requests wait in one queue; a READY instance at an admissible version holds
  up to `request_batch` of them. With `refill` SLOT the rows arrivals free take the next requests
  once `refill_min` of them are free (1: each at once; fewer if fewer wait); with BATCH an instance
  takes the next `request_batch` only once its last route has ended, as a static batch would
  (`Route`; each route is one call on the instance, ended by `StreamEnded` with its number). A
  joiner that becomes READY mid-iteration is served at once from what is left.
- Joining: a new instance (static, transient when its window opens, `rlsched scale`, or granted by
  the cluster scheduler) is ALLOCATED (`StartInstance`) and pulls the latest version (`StartPull`).
  It serves once the pull is confirmed (`PullDone`). One that confirmed a version that has since
  become inadmissible pulls the latest first (CATCH_UP). The versions and who holds each are kept in
  a `WeightBook` (`rlsched.core.weights`), with the weight-version lifecycle.
- Reloading: between iterations every serving instance pulls the new version; `ReloadDone` once they
  all have. Joiners already pulling go on and catch up afterwards. In a pipelined job a reload comes
  while requests run: an instance in the middle of a batch finishes it on its version (stale by one)
  and pulls when the batch ends; the next iteration's requests queue behind the running ones.
  A reload may hold serving instances at their version for the OpenAI endpoint's episodes pinned
  there (`ReloadAsked.hold`), while that version stays admissible; one instance always reloads.
- Relaying (`FleetParams.relay`): a reload follows `relay_plan`, each instance pulling from the one
  before it in its pipelined chain; a lone joiner or catch-up pulls from the peers that hold or pull
  the version (`WeightBook.peers_for`) when the best of them would feed it at least as fast as the
  trainer's egress would, leaving that egress to the others. Every pull falls back to the trainer
  when its peers fail it; `StartPull.sources` carries the choice.
- Leaving: DRAINING takes nothing new and is released when its batch ends; PREEMPTED is abrupt
  (`KillInstance`). A preempted instance's unfinished requests go back to the front of the queue with
  what the durable store holds for them (`ReadSaved` -> `SavedRead`): the interrupted members of a
  group are cut back to the shortest saved length among them (`truncate_group`), and each resumes or
  restarts by the cost model (`resume_or_restart`; `CutSaved` tells the store).
- Transient windows count from the start of generation in their iteration (and `available_s` from
  the grant); they are looked at on every event, and `next_wakeup` says when the next is due.
- Exactly once: a sample is accepted (`Accepted`) only from the instance currently running its
  request and only if the request is not done yet; anything else is counted and dropped. Each
  `Route` carries its dispatch number, the attempt under which the store takes its writes.

Lifecycles: `InstanceState` per instance (`rlsched.policy.lifecycle`), each move checked.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlsched.core import fleet_io as fx
from rlsched.core.trace import Trace
from rlsched.core.weights import WeightBook
from rlsched.policy.bandwidth import max_min_rates, relay_plan
from rlsched.policy.lifecycle import INSTANCE_TRANSITIONS, InstanceState, Leave, transition
from rlsched.policy.resume import Restart, ResumeCost, resume_or_restart, reuse, truncate_group

_S = InstanceState
_GONE = (_S.RELEASED, _S.PREEMPTED)
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class _Pull:
    why: fx.PullWhy
    version: int
    iteration: int
    started: float


@dataclass(slots=True)
class _Member:
    name: str
    ingress_bps: float
    window: fx.Window | None
    granted_at: float
    state: InstanceState = _S.ALLOCATED
    version: int = -1
    pull: _Pull | None = None
    streams: dict[int, None] = field(default_factory=dict)  # its route calls in flight, by number
    running: dict[str, int] = field(default_factory=dict)  # its requests not yet arrived -> their route
    reload_due: bool = False  # asked to reload mid-route: it takes nothing new, pulls once its routes end
    why: str = ""  # why it is leaving

    def to(self, target: InstanceState) -> None:
        if target not in INSTANCE_TRANSITIONS[self.state]:
            transition(self.state, target)  # raises, naming the edges allowed
        self.state = target


@dataclass(frozen=True, slots=True)
class _Leaving:
    why: str
    at: float


class FleetCore:
    def __init__(self, params: fx.FleetParams) -> None:
        self.params = params
        self.members: dict[str, _Member] = {}
        self.weights = WeightBook(params.max_staleness)
        self.iteration = 0
        self.gen_start = 0.0
        self.requests: dict[str, fx.RequestSpec] = {}
        self.pending: deque[str] = deque()
        self.outstanding = 0  # requests of this iteration not yet accepted
        self.resume_from: dict[str, int] = {}  # a requeued request's saved tokens it continues from
        self.resumed: dict[str, fx.Resumption] = {}
        self.counts = fx.FleetCounts()
        self.join_errors: list[str] = []
        self.reloading: set[str] | None = None  # the reload phase's instances still pulling
        self._opened: set[str] = set()  # windows granted so far
        self._leaving: dict[str, _Leaving] = {}  # preempted, waiting for their saved tokens
        self._dispatches = 0
        self._by_slot = params.refill is fx.Refill.SLOT
        self._scaled = 0
        self._out: list[fx.Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            fx.Arrived: self._arrived,
            fx.StreamEnded: self._stream_ended,
            fx.Begun: self._begun,
            fx.Tick: self._tick,
            fx.PullDone: self._pull_done,
            fx.Published: self._published,
            fx.ReloadAsked: self._reload_asked,
            fx.Added: self._added,
            fx.Scaled: self._scaled_by_user,
            fx.Replenish: self._replenish,
            fx.Reclaimed: self._reclaimed,
            fx.SavedRead: self._saved_read,
        }

    # -- the interface -----------------------------------------------------------------------------

    def handle(self, event: fx.Event) -> list[fx.Effect]:
        """Take in one event; the effects, in the order they are to be carried out."""
        kind = type(event)
        self._handlers[kind](event)
        if self.pending and (kind is not fx.Arrived or self._by_slot):  # an arrival frees a row only
            self._dispatch()
        out, self._out = self._out, []
        return out

    @property
    def generating(self) -> bool:
        """Requests of this iteration are still to arrive."""
        return self.outstanding > 0

    def admissible(self, version: int) -> bool:
        return self.weights.admissible(version)

    def live(self, name: str) -> bool:
        """An instance of that name exists and has not been released."""
        m = self.members.get(name)
        return m is not None and m.state is not _S.RELEASED

    def serving(self) -> list[str]:
        return [m.name for m in self.members.values() if self._serves(m)]

    def serving_versions(self) -> dict[str, int]:
        """The version each serving instance holds."""
        return {m.name: m.version for m in self.members.values() if self._serves(m)}

    def pulling(self) -> list[str]:
        return [m.name for m in self.members.values() if m.pull is not None]

    def stranded(self) -> bool:
        """Requests wait, yet nothing serves, joins or is due to join: only a user can help now."""
        return bool(self.pending) and not self.serving() and not self.pulling() and self.next_wakeup() is None

    def next_wakeup(self) -> float | None:
        """When the next transient window opens or closes, if any is due."""
        if not self.params.windows:
            return None
        waits = []
        if self.generating:
            for w in self.params.windows:
                if w.name not in self._opened and w.join_iteration == self.iteration:
                    waits.append(self.gen_start + w.join_at_s)
        for m in self.members.values():
            end = m.window
            if end is None or m.state in _GONE or m.state is _S.DRAINING:
                continue
            if end.available_s is not None:
                waits.append(m.granted_at + end.available_s)
            elif end.reclaim_iteration == self.iteration and self.generating:
                waits.append(self.gen_start + end.reclaim_at_s)
        return min(waits) if waits else None

    def snapshot(self) -> dict[str, Any]:
        """The fleet as `rlsched scale` shows it."""
        return {
            "iteration": self.iteration,
            "latest_version": self.weights.latest,
            "instances": {
                n: {"state": str(m.state), "version": m.version, "running": len(m.running)}
                for n, m in self.members.items()
            },
        }

    def _emit(self, effect: fx.Effect) -> None:
        self._out.append(effect)

    def _serves(self, m: _Member) -> bool:
        return m.state is _S.READY and self.weights.admissible(m.version)

    # -- membership --------------------------------------------------------------------------------

    def _added(self, e: fx.Added) -> None:
        self._add(e.name, e.ingress_bps, None, e.at)

    def _add(self, name: str, ingress_bps: float, window: fx.Window | None, at: float) -> None:
        old = self.members.get(name)
        if old is not None and old.state is not _S.RELEASED:
            raise ValueError(f"an instance named {name} already exists")
        self.members.pop(name, None)
        m = self.members[name] = _Member(name, ingress_bps, window, at)
        self._emit(fx.StartInstance(name, ingress_bps))
        if self.weights.latest is not None:
            self._pull(m, at)

    def _scaled_by_user(self, e: fx.Scaled) -> None:
        for _ in range(e.add):
            self._scaled += 1
            name = f"scaled-{self._scaled}"
            self._add(name, e.ingress_bps, None, e.at)
            self._emit(fx.Note(f"scale: {name} allocated; it serves once it has the latest version"))
        for name in e.remove:
            m = self.members.get(name)
            if m is None or m.state in _GONE:
                live = ", ".join(n for n, x in self.members.items() if x.state is not _S.RELEASED)
                self._emit(fx.Note(f"scale: no live instance named {name} (live: {live})"))
                continue
            self._leave(m, e.leave, "rlsched scale", e.at)

    def _reclaimed(self, e: fx.Reclaimed) -> None:
        m = self.members.get(e.name)
        if m is not None and m.state not in _GONE:
            self._leave(m, e.leave, e.why, e.at)
            if e.replace and m.window is None:
                self._replace(m, e.at)

    def _replenish(self, e: fx.Replenish) -> None:
        own = [m for m in self.members.values() if m.window is None and m.name not in e.exclude]
        live = sum(m.state not in _GONE for m in own)
        gone = [m for m in own if m.state in _GONE]
        for m in gone[: max(e.target - live, 0)]:
            self._replace(m, e.at)

    def _replace(self, dead: _Member, at: float) -> None:
        """A dead instance of the job's own: a new one joins under the next free name (`NAME-rK`), so
        the fleet keeps its generation capacity."""
        base = re.sub(r"-r\d+$", "", dead.name)
        k = 1
        while f"{base}-r{k}" in self.members:
            k += 1
        name = f"{base}-r{k}"
        self.counts.replaced += 1
        self._add(name, dead.ingress_bps, None, at)
        self._emit(fx.Note(f"{name} replaces {dead.name}; it serves once it has the latest version"))

    def _leave(self, m: _Member, leave: Leave, why: str, at: float) -> None:
        if leave is Leave.DRAINING and m.state is _S.DRAINING:  # asked again: it is finishing already
            self._emit(fx.Note(f"{m.name} is already draining: {len(m.running)} request(s) to finish"))
            return
        if leave is Leave.PREEMPTED or m.state is not _S.READY:  # one not serving has nothing to finish
            self._preempt(m, why, at)
            return
        m.to(_S.DRAINING)
        m.why = why
        self._emit(fx.Note(f"{m.name} draining ({why}): {len(m.running)} request(s) to finish"))
        self._release_if_drained(m, at)

    def _release_if_drained(self, m: _Member, at: float) -> None:
        if m.state is _S.DRAINING and not m.streams:
            m.to(_S.RELEASED)
            self.weights.gone(m.name)
            self.counts.drained += 1
            self._emit(fx.KillInstance(m.name))
            self._emit(fx.Left(m.name, Leave.DRAINING, m.why, 0, at))

    def _preempt(self, m: _Member, why: str, at: float) -> None:
        """Reclaimed at once: the instance is killed, its unfinished requests go back once the store
        says what it saved of them."""
        m.to(_S.PREEMPTED)
        m.pull, m.why = None, why
        m.streams.clear()
        self.weights.gone(m.name)
        self.counts.preempted += 1
        self._emit(fx.KillInstance(m.name))
        self._reloaded(m.name)
        if m.running:
            self._leaving[m.name] = _Leaving(why, at)
            self._emit(fx.ReadSaved(m.name, tuple(m.running)))
        else:
            self._requeue(m, {}, _Leaving(why, at))

    def _saved_read(self, e: fx.SavedRead) -> None:
        leaving = self._leaving.pop(e.name)
        self._requeue(self.members[e.name], dict(e.saved), leaving)

    def _requeue(self, m: _Member, saved: dict[str, int], leaving: _Leaving) -> None:
        """A reclaimed instance's unfinished requests, to the front of the queue, group by group."""
        groups: dict[str, list[str]] = {}
        for rid in m.running:
            groups.setdefault(self.requests[rid].group, []).append(rid)
        m.running = {}
        back: list[str] = []
        for members in groups.values():
            back.extend(self._resume_group(members, saved, m.name, leaving.at))
        self.pending.extendleft(reversed(back))
        m.to(_S.RELEASED)
        self._emit(fx.Left(m.name, Leave.PREEMPTED, leaving.why, len(back), leaving.at))
        self._emit(
            fx.Note(f"{m.name} preempted ({leaving.why}): {len(back)} request(s) go back to the queue")
        )

    def _resume_group(self, rids: list[str], saved: dict[str, int], source: str, at: float) -> list[str]:
        lengths = {rid: saved.get(rid, 0) for rid in rids}
        cut = truncate_group(lengths, finished=())
        for rid in rids:
            spec = self.requests[rid]
            keep = cut[rid]
            choice = resume_or_restart(spec.prompt_tokens, keep, self._cost(spec)).choice
            if choice is Restart.RESTART:
                keep = 0
                self.counts.restarted += 1
            else:
                self.counts.resumed += 1
            reused, regenerated = reuse({rid: lengths[rid]}, {rid: keep})  # a restart redoes all it saved
            self.counts.reused_tokens += reused
            self.counts.regenerated_tokens += regenerated
            self._emit(fx.CutSaved(rid, keep))
            self.resume_from[rid] = keep
            self.resumed[rid] = fx.Resumption(keep, lengths[rid], at, source, choice)
        return rids

    def _cost(self, spec: fx.RequestSpec) -> ResumeCost:
        c = self.params.cost  # the request's own decode speed prices the tokens a restart redoes
        if spec.decode_tokens_per_s is None:
            return c
        return ResumeCost(c.prefill_tokens_per_s, max(spec.decode_tokens_per_s, _EPS), c.setup_s)

    # -- weights -----------------------------------------------------------------------------------

    def _published(self, e: fx.Published) -> None:
        self.weights.publish(e.version, e.nbytes)

    def _relays(self) -> frozenset[str]:
        """The instances that relay (with relays on, every live one)."""
        if self.params.relay is None:
            return frozenset()
        return frozenset(n for n, m in self.members.items() if m.state not in _GONE)

    def _pull(
        self, m: _Member, at: float, reload: bool = False, sources: tuple[str, ...] | None = None
    ) -> None:
        latest = self.weights.latest
        assert latest is not None
        why = (
            fx.PullWhy.JOIN
            if m.state is _S.ALLOCATED
            else fx.PullWhy.RELOAD
            if reload
            else fx.PullWhy.CATCH_UP
        )
        if sources is None:
            sources = self._lone_sources(m, latest)
        m.to(_S.TRANSFERRING)
        m.pull = _Pull(why, latest, self.iteration, at)
        self.weights.pull_started(m.name, latest, sources)
        self._emit(fx.StartPull(m.name, latest, why, sources))

    def _reload_asked(self, e: fx.ReloadAsked) -> None:
        if self.weights.latest is None:
            raise ValueError("a reload before any version was published")
        targets = [
            m
            for m in self.members.values()
            if m.state is _S.READY or (m.state is _S.ALLOCATED and m.pull is None)
        ]
        held = self._held(targets, e.hold)
        targets = [m for m in targets if m.name not in held]
        self.reloading = {m.name for m in targets}
        if not self.params.swap_in_flight:  # a pipelined job's busy ones finish their batch first
            for m in targets:
                m.reload_due = bool(m.running)
            targets = [m for m in targets if not m.running]
        plan = self._reload_plan(targets)
        for m in targets:
            self._pull(m, e.at, reload=True, sources=plan.get(m.name, ()))
        if not self.reloading:
            self._reload_finished()

    def _held(self, targets: list[_Member], hold: tuple[str, ...]) -> set[str]:
        """The READY instances of `hold` whose version stays admissible, leaving one to reload."""
        held = {
            m.name
            for m in targets
            if m.name in hold and m.state is _S.READY and self.weights.admissible(m.version)
        }
        if held and len(held) == len(targets):
            held.discard(min(held))
        for name in sorted(held):
            self._emit(fx.Note(f"{name} stays at v{self.members[name].version} for the endpoint's episodes"))
        return held

    def _lone_sources(self, m: _Member, version: int) -> tuple[str, ...]:
        """A lone pull's peers (`WeightBook.peers_for`), if the best of them would feed it at least
        as fast as the trainer's egress would now (each link shared max-min by the pulls it feeds
        first-hand); otherwise the trainer alone."""
        relay = self.params.relay
        if relay is None:
            return ()
        peers = self.weights.peers_for(m.name, version, self._relays())
        if not peers:
            return ()
        from_origin = self._share(self.weights.fed_by(None), m, relay.egress_bps)
        from_peer = self._share(self.weights.fed_by(peers[0]), m, relay.upload_bps)
        return peers if from_peer >= from_origin * (1 - _EPS) else ()

    def _share(self, fed: list[str], m: _Member, link_bps: float) -> float:
        """The rate `m` would get on a link of `link_bps` beside the pulls `fed` (max-min)."""
        caps = [self._cap(self.members[n], link_bps) for n in fed if n in self.members]
        return max_min_rates([*caps, self._cap(m, link_bps)], link_bps)[-1]

    @staticmethod
    def _cap(m: _Member, link_bps: float) -> float:
        return m.ingress_bps if m.ingress_bps > 0 else link_bps

    def _reload_plan(self, targets: list[_Member]) -> dict[str, tuple[str, ...]]:
        """Who relays to whom in a reload: `relay_plan`'s forest of pipelined chains over the
        instances' ingress and upload caps (an uncapped ingress counts as the egress); each pulls
        from the one before it in its chain. Empty without relays."""
        relay = self.params.relay
        if relay is None or len(targets) < 2:
            return {}
        latest = self.weights.latest
        assert latest is not None
        nbytes = self.weights.versions[latest].nbytes or 64 * relay.chunk_bytes
        ingress = [m.ingress_bps if m.ingress_bps > 0 else relay.egress_bps for m in targets]
        uploads = [relay.upload_bps] * len(targets)
        plan = relay_plan(nbytes, relay.chunk_bytes, ingress, relay.egress_bps, uploads)
        out: dict[str, tuple[str, ...]] = {}
        for i, m in enumerate(targets):
            source = plan.source(i)
            out[m.name] = (targets[source].name,) if source is not None else ()
        return out

    def _reloaded(self, name: str) -> None:
        if self.reloading is not None and name in self.reloading:
            self.reloading.discard(name)
            if not self.reloading:
                self._reload_finished()

    def _reload_finished(self) -> None:
        self.reloading = None
        self._emit(fx.ReloadDone())

    def _pull_done(self, e: fx.PullDone) -> None:
        m = self.members.get(e.name)
        if m is None or m.pull is None:  # it left meanwhile
            return
        pull, m.pull = m.pull, None
        if e.error:
            self._join_failed(m, e.error)
        else:
            for target in (_S.LOADING, _S.CONFIRMING, _S.READY):
                m.to(target)
            m.version = e.version
            self.weights.confirmed(m.name, e.version)
            if pull.why is fx.PullWhy.JOIN:
                self.counts.joined += 1
            self._emit(fx.Joined(m.name, e.version, pull.why, pull.iteration, pull.started))
            if not self.weights.admissible(m.version):  # a newer version was published meanwhile
                self._pull(m, e.at)
        self._reloaded(m.name)

    def _join_failed(self, m: _Member, error: str) -> None:
        """It released itself (it could not confirm a version) or died; it never served this one."""
        self.counts.join_failures += 1
        self.join_errors.append(f"{m.name} could not join: {error}")
        self.weights.gone(m.name)
        m.to(_S.RELEASED)
        self._emit(fx.Note(self.join_errors[-1]))
        self._emit(fx.KillInstance(m.name))

    # -- an iteration's generation -----------------------------------------------------------------

    def _begun(self, e: fx.Begun) -> None:
        self.iteration, self.gen_start = e.iteration, e.at
        if self.outstanding:  # a pipelined job: the next iteration's requests queue behind these
            self.requests.update((r.request_id, r) for r in e.requests)
            self.pending.extend(r.request_id for r in e.requests)
            self.outstanding += len(e.requests)
        else:
            self.requests = {r.request_id: r for r in e.requests}
            self.pending = deque(self.requests)
            self.outstanding = len(self.requests)
            self.resumed, self.resume_from = {}, {}
        self._windows(e.at)

    def _tick(self, e: fx.Tick) -> None:
        self._windows(e.at)

    def _windows(self, now: float) -> None:
        """Transient windows that open or close now."""
        for w in self.params.windows:
            if w.name not in self._opened and self._due(w.join_iteration, w.join_at_s, now):
                self._opened.add(w.name)
                self._add(w.name, w.ingress_bps, w, now)
        for m in list(self.members.values()):
            end = m.window
            if end is None or m.state in _GONE or m.state is _S.DRAINING:
                continue
            ends = (end.available_s is not None and now >= m.granted_at + end.available_s) or (
                end.reclaim_iteration is not None and self._due(end.reclaim_iteration, end.reclaim_at_s, now)
            )
            if ends:
                self._leave(m, end.leave, "its availability window ended", now)

    def _due(self, iteration: int, at_s: float, now: float) -> bool:
        """Past `at_s` into iteration `iteration`'s generation (or that iteration is over)."""
        if self.iteration != iteration:
            return self.iteration > iteration
        return self.generating and now >= self.gen_start + at_s

    def _dispatch(self) -> None:
        rows, by_slot = self.params.request_batch, self._by_slot
        least = min(self.params.refill_min, rows)
        for m in self.members.values():
            if not self.pending:
                return
            free = rows - len(m.running) if by_slot else 0 if m.streams else rows
            if free < min(least, len(self.pending)) or not self._takes(m):  # least, pending >= 1
                continue
            pending = self.pending
            batch = tuple([pending.popleft() for _ in range(min(free, len(pending)))])
            self._dispatches += 1
            m.running.update(dict.fromkeys(batch, self._dispatches))
            m.streams[self._dispatches] = None
            resume = self.resume_from
            kept = tuple([resume.get(r, 0) for r in batch]) if resume else (0,) * len(batch)
            self._emit(fx.Route(m.name, batch, self._dispatches, kept))

    def _takes(self, m: _Member) -> bool:
        """It may take requests: READY at an admissible version, not due to reload."""
        return m.state is _S.READY and not m.reload_due and self.weights.admissible(m.version)

    def _arrived(self, e: fx.Arrived) -> None:
        accepted = self.arrived(e.name, e.request_id)
        if accepted is not None:
            self._out.append(accepted)

    def arrived(self, name: str, request_id: str) -> fx.Accepted | None:
        """`handle(Arrived(...))` without the event around it: the simulator's per-sample call (an
        arrival decides nothing else, so its only effect is this one)."""
        m = self.members.get(name)
        if m is None or request_id not in m.running:  # accepted already from where it ran, or never sent
            self.counts.duplicates_dropped += 1
            return None
        del m.running[request_id]
        self.outstanding -= 1
        return fx.Accepted(name, request_id, self.resumed.get(request_id))

    def _stream_ended(self, e: fx.StreamEnded) -> None:
        m = self.members.get(e.name)
        if m is None:
            return
        ended = [d for d in (m.streams if e.dispatch is None else (e.dispatch,)) if d in m.streams]
        if not ended:
            return
        for d in ended:
            del m.streams[d]
        left = [rid for rid, d in m.running.items() if d in ended]
        if left:  # it ended without these (e.g. aborted): they go back
            self.pending.extendleft(reversed(left))
            for rid in left:
                del m.running[rid]
        if m.streams:  # its other routes run on
            return
        if m.reload_due:
            m.reload_due = False
            if m.state is _S.READY:
                self._pull(m, e.at, reload=True)
            else:  # it is leaving: the reload no longer waits for it
                self._reloaded(m.name)
        self._release_if_drained(m, e.at)


FleetTrace = Trace[FleetCore, fx.Event, fx.Effect]
