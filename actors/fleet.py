"""The rollout fleet: which instances serve, which are joining or leaving, and where every request
of an iteration is, so that each sample is produced exactly once.

Routing: requests wait in one queue; a READY instance at an admissible version (at most
`rollout.max_staleness` behind the latest) that is not running anything takes the next
`rollout.request_batch` of them. So a joiner that becomes READY mid-iteration is served at once
from what is left; it does not wait for the next update.

Joining: a new instance (static at start, transient when its window opens, or `rlsched scale`) is
ALLOCATED and pulls the latest version over the weight link (`actors.rollout.Instance.join`); the
join's transfer, load and confirm are spans. An instance that confirmed a version that has since
become inadmissible pulls the latest before it is routed anything.

Leaving: DRAINING takes nothing new and is released when what it runs is done; PREEMPTED is abrupt
(the actor is killed). A preempted instance's unfinished requests go back to the front of the queue
with the tokens the durable store holds for them: the interrupted members of a group are cut back
to the shortest saved length among them (`rlsched.policy.resume.truncate_group`), and each resumes
or restarts by the cost model. When a resumed sample arrives, its saved log-probabilities are
concatenated with the new ones, and a RESUME span records what was reused.

Exactly once: each dispatch has its own attempt number; the store refuses writes from an older
attempt, and a sample is accepted only from the instance currently running its request and only
if its request is not done yet (anything else is counted and dropped).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.rollout import JoinReport, RolloutInstance
from actors.scale import ScaleCommand
from actors.trainer import PublishedVersion
from rlsched.config import JobConfig, Leave, TransientInstance
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample
from rlsched.errors import UserError
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.lifecycle import InstanceState, transition
from rlsched.policy.resume import Restart, ResumeCost, resume_or_restart, reuse, truncate_group
from rlsched.policy.versions import admissible
from rlsched.store.partial import PartialStore, Saved

_S = InstanceState


class PullWhy(StrEnum):
    """Why an instance pulls the latest version (its spans say so; only RELOAD is a phase)."""

    JOIN = "join"  # its first version: it serves once this one is confirmed
    CATCH_UP = "catch-up"  # a newer version made the one it holds inadmissible
    RELOAD = "reload"  # the reload phase between iterations, for every serving instance


@dataclass(frozen=True)
class Pull:
    """One `RolloutInstance.join` call in flight: transfer, load and confirm of one version."""

    ref: Any  # its ObjectRef
    why: PullWhy
    iteration: int
    started: float


@dataclass
class Member:
    name: str
    handle: Any
    ingress_bps: float
    transient: TransientInstance | None = None
    state: InstanceState = _S.ALLOCATED  # the controller's view, moved by the same transition table
    version: int = -1
    granted_at: float = 0.0
    pull: Pull | None = None  # the weight pull under way, if any
    stream: Any = None
    running: dict[RequestId, GenerationRequest] = field(default_factory=dict)

    def to(self, target: InstanceState) -> None:
        self.state = transition(self.state, target)


@dataclass(frozen=True)
class Resumed:
    saved: Saved  # what the new attempt starts from (after the group cut)
    preempted_at: float
    from_instance: str
    saved_before_cut: int
    choice: Restart


@dataclass
class FleetCounts:
    joined: int = 0
    preempted: int = 0
    drained: int = 0
    resumed: int = 0
    restarted: int = 0
    reused_tokens: int = 0
    regenerated_tokens: int = 0
    duplicates_dropped: int = 0
    join_failures: int = 0


class Fleet:
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
        self.store = PartialStore(store_path) if store_path is not None else None
        if self.store is not None:
            self.store.reset()  # request ids repeat across runs: start empty
        self.store_path = store_path
        self.pg: Any = None  # the cluster scheduler's placement group for the static instances
        self.members: dict[str, Member] = {}
        self.latest: PublishedVersion | None = None
        self.pending: deque[GenerationRequest] = deque()
        self.done: set[RequestId] = set()
        self.resumed: dict[RequestId, Resumed] = {}
        self.counts = FleetCounts()
        self.iteration = 0
        self.gen_start = 0.0
        self._dispatches = 0
        self._seeds = 0
        self._transient_added: set[int] = set()
        self._scaled = 0
        self.join_reports: list[JoinReport] = []
        self.join_errors: list[str] = []
        self.cost = ResumeCost(
            cfg.rollout.prefill_tokens_per_s, cfg.rollout.decode_tokens_per_s, cfg.rollout.resume_setup_s
        )

    # -- membership -----------------------------------------------------------------------------
    def add(
        self,
        name: str,
        transient: TransientInstance | None = None,
        receiver_gbps: float | None = None,
        pg: Any = None,
    ) -> Member:
        """A new instance: ALLOCATED now, READY once it has pulled and confirmed the latest version."""
        if name in self.members:
            raise ValueError(f"an instance named {name} already exists")
        r, w = self.cfg.rollout, self.cfg.weights
        gbps = receiver_gbps or (transient.receiver_gbps if transient else None) or w.receiver_gbps
        group = pg if pg is not None else self.pg
        where = {"scheduling_strategy": PlacementGroupSchedulingStrategy(group)} if group is not None else {}
        handle = RolloutInstance.options(num_cpus=r.cpus_per_instance, resources=r.resources, **where).remote(
            name,
            self.checkpoint,
            self.cfg.engine.max_batch,
            self.cfg.engine.use_cache,
            self.cfg.run.seed + self._seeds,
            str(self.store_path) if self.store_path else None,
            self.cfg.store.flush_s,
            str(self.cfg.engine.kind),
            str(self.cfg.engine.dtype),
        )
        self._seeds += 1
        member = Member(name, handle, (gbps or 0.0) * 1e9, transient, granted_at=self.clock())
        self.members[name] = member
        if self.latest is not None:
            self._start_join(member)
        return member

    def _start_join(self, m: Member, for_reload: bool = False) -> None:
        assert self.latest is not None
        why = PullWhy.JOIN if m.state is _S.ALLOCATED else PullWhy.RELOAD if for_reload else PullWhy.CATCH_UP
        m.to(_S.TRANSFERRING)
        ref = m.handle.join.remote(
            self.latest.address, self.latest.version, m.ingress_bps, str(self.cfg.weights.plane)
        )
        m.pull = Pull(ref, why, self.iteration, self.clock())

    def admissible(self, version: int) -> bool:
        latest = self.latest.version if self.latest else 0
        return admissible(version, latest, self.cfg.rollout.max_staleness)

    def serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.state is _S.READY and self.admissible(m.version)]

    def preempt(self, m: Member, why: str) -> None:
        """Reclaimed at once: the actor is killed, its unfinished requests go back with their saved tokens."""
        now = self.clock()
        m.to(_S.PREEMPTED)
        ray.kill(m.handle)
        requeued = self._requeue(m, now)
        m.stream, m.pull = None, None
        m.to(_S.RELEASED)
        self.counts.preempted += 1
        self.spans.append(
            Span(
                SpanKind.PREEMPT,
                m.name,
                now,
                self.clock(),
                self.iteration,
                {"lane": m.name, "why": why, "requeued": requeued},
            )
        )
        self.log(f"{m.name} preempted ({why}): {requeued} request(s) go back to the queue")

    def drain(self, m: Member, why: str) -> None:
        """Takes nothing new; released once what it runs is done."""
        if m.state is _S.READY:
            m.to(_S.DRAINING)
            self.log(f"{m.name} draining ({why}): {len(m.running)} request(s) to finish")
            self._release_if_drained(m)
        else:  # not serving yet: nothing to finish
            self.preempt(m, why)

    def _release_if_drained(self, m: Member) -> None:
        if m.state is _S.DRAINING and m.stream is None:
            m.to(_S.RELEASED)
            ray.kill(m.handle)
            self.counts.drained += 1

    def scale(self, command: ScaleCommand) -> None:
        """`rlsched scale`: add instances (they join like any other), remove some by name."""
        for _ in range(command.add):
            self._scaled += 1
            self.add(f"scaled-{self._scaled}", receiver_gbps=command.receiver_gbps)
            self.log(f"scale: scaled-{self._scaled} allocated; it serves once it has the latest version")
        for name in command.remove:
            m = self.members.get(name)
            if m is None or m.state in (_S.RELEASED, _S.PREEMPTED):
                live = ", ".join(n for n, x in self.members.items() if x.state is not _S.RELEASED)
                self.log(f"scale: no live instance named {name} (live: {live})")
                continue
            if command.leave is Leave.PREEMPTED:
                self.preempt(m, "rlsched scale")
            else:
                self.drain(m, "rlsched scale")

    def snapshot(self) -> dict[str, Any]:
        """The fleet as `rlsched scale` shows it."""
        return {
            "iteration": self.iteration,
            "latest_version": self.latest.version if self.latest else None,
            "instances": {
                n: {"state": str(m.state), "version": m.version, "running": len(m.running)}
                for n, m in self.members.items()
            },
        }

    # -- an iteration's generation ----------------------------------------------------------------
    def begin(self, iteration: int, requests: Sequence[GenerationRequest]) -> None:
        self.iteration, self.gen_start = iteration, self.clock()
        self.pending = deque(requests)
        self.done = set()
        self.resumed = {}
        self.tick()

    @property
    def generating(self) -> bool:
        return bool(self.pending) or any(m.running for m in self.members.values())

    def stranded(self) -> bool:
        """Requests wait, yet nothing serves, joins or is due to join: only a user can help now."""
        joining = any(m.pull is not None for m in self.members.values())
        return bool(self.pending) and not self.serving() and not joining and self.next_event_in() is None

    def waitables(self) -> list[Any]:
        refs = []
        for m in self.members.values():
            if m.pull is not None:
                refs.append(m.pull.ref)
            if m.stream is not None:
                refs.append(m.stream)
        return refs

    def owner(self, ref: Any) -> Member | None:
        return next((m for m in self.members.values() if ref is m.stream or _pulling(m, ref)), None)

    def tick(self) -> None:
        """Transient windows that open or close now; then hand out work."""
        now = self.clock()
        for k, spec in enumerate(self.cfg.rollout.transient):
            if k not in self._transient_added and self._due(spec.join_iteration, spec.join_at_s, now):
                self._transient_added.add(k)
                self.add(f"transient-{k}", spec)
        for m in list(self.members.values()):
            if m.transient is None or m.state in (_S.RELEASED, _S.PREEMPTED, _S.DRAINING):
                continue
            spec = m.transient
            ends = (spec.available_s is not None and now - m.granted_at >= spec.available_s) or (
                spec.reclaim_iteration is not None
                and self._due(spec.reclaim_iteration, spec.reclaim_at_s, now)
            )
            if ends:
                why = "its availability window ended"
                self.preempt(m, why) if spec.leave is Leave.PREEMPTED else self.drain(m, why)
        self.dispatch()

    def _due(self, iteration: int, at_s: float, now: float) -> bool:
        return self.iteration > iteration or (self.iteration == iteration and now - self.gen_start >= at_s)

    def next_event_in(self) -> float | None:
        """Seconds until the next transient window opens or closes during this generation, if any."""
        now, waits = self.clock(), []
        for k, spec in enumerate(self.cfg.rollout.transient):
            if k not in self._transient_added and spec.join_iteration == self.iteration:
                waits.append(self.gen_start + spec.join_at_s - now)
        for m in self.members.values():
            end = m.transient
            if end is None or m.state in (_S.RELEASED, _S.PREEMPTED):
                continue
            if end.available_s is not None:
                waits.append(m.granted_at + end.available_s - now)
            elif end.reclaim_iteration == self.iteration:
                waits.append(self.gen_start + end.reclaim_at_s - now)
        return max(0.0, min(waits)) if waits else None

    def dispatch(self) -> None:
        for m in self.serving():
            if m.stream is not None or not self.pending:
                continue
            batch = [
                self.pending.popleft() for _ in range(min(self.cfg.rollout.request_batch, len(self.pending)))
            ]
            self._dispatches += 1
            m.running = {r.request_id: r for r in batch}
            m.stream = m.handle.generate.options(num_returns="streaming").remote(batch, self._dispatches)

    def on_ready(self, ref: Any) -> list[tuple[str, Sample]]:
        """A join finished, or a stream produced a sample, ended or failed; returns new samples with
        the instance that made each."""
        m = self.owner(ref)
        if m is None:
            return []
        if _pulling(m, ref):
            self._on_join(m)
            self.dispatch()
            return []
        out = self._on_stream(m, ref)
        self.dispatch()
        return [(m.name, s) for s in out]

    def _on_join(self, m: Member) -> None:
        pull, m.pull = m.pull, None
        assert pull is not None
        try:
            report: JoinReport = ray.get(pull.ref)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            cause = err.cause if isinstance(err, ray.exceptions.RayTaskError) else err
            self.counts.join_failures += 1
            self.join_errors.append(f"{m.name} could not join: {cause}")
            self.log(self.join_errors[-1])
            m.to(_S.RELEASED)  # it released itself (JoinFailed) or died; it never served
            ray.kill(m.handle)
            return
        for target in (_S.LOADING, _S.CONFIRMING, _S.READY):
            m.to(target)
        m.version = report.version
        self._join_spans(m, pull, report)
        if pull.why is PullWhy.JOIN:
            self.counts.joined += 1
            self.join_reports.append(report)
            self.log(report.line())
        if not self.admissible(m.version):  # a newer version was published meanwhile
            self._start_join(m)

    def _join_spans(self, m: Member, pull: Pull, r: JoinReport) -> None:
        # the instance's clock is time.monotonic on its node; on one node it is the controller's
        # only the reload phase's pulls are a phase of the iteration (phase_times skips join=True)
        phase = pull.why is PullWhy.RELOAD
        attrs = {"lane": m.name, "version": r.version, "join": not phase, "why": str(pull.why)}
        detail = {"bytes": r.nbytes, "gbps": round(r.gbps, 4), "streams": r.streams, "corrupt": r.corrupt}
        it = pull.iteration
        self.spans.append(Span(SpanKind.TRANSFER, f"{m.name}-v{r.version}", *r.transfer, it, attrs | detail))
        self.spans.append(Span(SpanKind.LOAD, f"{m.name}-v{r.version}", *r.load, it, attrs))
        self.spans.append(Span(SpanKind.CONFIRM, f"{m.name}-v{r.version}", *r.confirm, it, attrs))
        if pull.why is PullWhy.JOIN:
            self.spans.append(Span(SpanKind.JOIN, m.name, pull.started, r.confirm[1], it, attrs))

    def _on_stream(self, m: Member, ref: Any) -> list[Sample]:
        try:
            sample: Sample = ray.get(next(ref))
        except StopIteration:
            m.stream = None
            if m.running:  # ended without these (e.g. aborted): they go back
                self.pending.extendleft(reversed(list(m.running.values())))
                m.running = {}
            self._release_if_drained(m)
            return []
        except ray.exceptions.RayActorError:  # the instance died under us: reclaimed from outside
            if m.state not in (_S.PREEMPTED, _S.RELEASED):
                self.preempt(m, "its actor died")
            return []
        rid = sample.request_id
        if rid in self.done or rid not in m.running:
            self.counts.duplicates_dropped += 1
            return []
        del m.running[rid]
        self.done.add(rid)
        if self.store is not None:
            self.store.clear([rid])
        return [self._stitch(sample)]

    def _stitch(self, sample: Sample) -> Sample:
        """A resumed sample carries the saved log-probabilities for the tokens it did not generate."""
        info = self.resumed.get(sample.request_id)
        if info is None or not info.saved.tokens:
            return sample
        n = len(info.saved)
        if sample.token_ids[:n] != info.saved.tokens:
            raise RuntimeError(
                f"{sample.request_id}: the resumed output does not start with its saved tokens"
            )
        drift = max(
            (abs(a - b) for a, b in zip(sample.logprobs[:n], info.saved.logprobs, strict=True)), default=0.0
        )
        stitched = dataclasses.replace(sample, logprobs=info.saved.logprobs + sample.logprobs[n:])
        self.spans.append(
            Span(
                SpanKind.RESUME,
                str(sample.request_id),
                info.preempted_at,
                self.clock(),
                self.iteration,
                {
                    "lane": "controller",
                    "from": info.from_instance,
                    "saved": info.saved_before_cut,
                    "resumed_from": n,
                    "choice": str(info.choice),
                    "final_tokens": sample.num_tokens,
                    "logprob_drift": drift,
                },
            )
        )
        return stitched

    def _requeue(self, m: Member, now: float) -> int:
        """A reclaimed instance's unfinished requests, to the front of the queue, from saved tokens."""
        lost = list(m.running.values())
        m.running = {}
        groups: dict[str, list[GenerationRequest]] = {}
        for r in lost:
            groups.setdefault(r.request_id.rsplit("-", 1)[0], []).append(r)
        back: list[GenerationRequest] = []
        for members in groups.values():
            back.extend(self._resume_group(members, m.name, now))
        self.pending.extendleft(reversed(back))
        return len(back)

    def _resume_group(
        self, members: list[GenerationRequest], source: str, now: float
    ) -> list[GenerationRequest]:
        saved = {
            r.request_id: self.store.saved(r.request_id) if self.store else Saved((), ()) for r in members
        }
        lengths = {str(rid): len(s) for rid, s in saved.items()}
        cut = truncate_group(lengths, finished=())
        reused, regenerated = reuse(lengths, cut)
        out = []
        for r in members:
            keep = cut[str(r.request_id)]
            choice = resume_or_restart(len(r.prompt_ids), keep, self.cost).choice
            if choice is Restart.RESTART:
                keep = 0
            kept = self.store.truncate(r.request_id, keep) if self.store else Saved((), ())
            self.resumed[r.request_id] = Resumed(kept, now, source, lengths[str(r.request_id)], choice)
            if choice is Restart.RESUME:
                self.counts.resumed += 1
            else:
                self.counts.restarted += 1
            out.append(dataclasses.replace(r, resume_ids=kept.tokens))
        self.counts.reused_tokens += reused if any(o.resume_ids for o in out) else 0
        self.counts.regenerated_tokens += regenerated
        return out

    # -- between iterations -------------------------------------------------------------------------
    def publish(self, published: PublishedVersion) -> None:
        self.latest = published

    def reload(self) -> None:
        """Every serving instance (and any allocated one not yet pulling) takes the latest version,
        blocking; joiners already pulling catch up on their own."""
        targets = [
            m
            for m in self.members.values()
            if m.state is _S.READY or (m.state is _S.ALLOCATED and m.pull is None)
        ]
        for m in targets:
            self._start_join(m, for_reload=True)
        for m in targets:
            assert m.pull is not None
            ray.wait([m.pull.ref], timeout=None)
            self._on_join(m)
        for m in list(self.members.values()):  # joiners whose join finished meanwhile
            if m.pull is not None and ray.wait([m.pull.ref], timeout=0)[0]:
                self._on_join(m)

    def wait_serving(self, timeout_s: float = 300.0) -> None:
        """Block until at least one instance serves (at start-up)."""
        give_up = time.monotonic() + timeout_s
        while not self.serving():
            refs = [m.pull.ref for m in self.members.values() if m.pull is not None]
            if not refs:  # every instance failed: say why (the usual cause is the same for all)
                raise UserError("no rollout instance could start. " + "; ".join(self.join_errors[:2]))
            if time.monotonic() > give_up:
                raise UserError(
                    f"no rollout instance took the first version within {timeout_s:g} s; see the log"
                )
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, give_up - time.monotonic()))
            for ref in ready:
                m = self.owner(ref)
                if m is not None:
                    self._on_join(m)

    def shutdown(self) -> None:
        for m in self.members.values():
            if m.state is not _S.RELEASED:
                ray.kill(m.handle)
                m.state = _S.RELEASED
        if self.store is not None:
            self.store.close()


def _pulling(m: Member, ref: Any) -> bool:
    return m.pull is not None and ref is m.pull.ref
