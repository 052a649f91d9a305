"""The runtime's driver of the iteration core (`rlsched.core.pipeline`), for every mode: sync, async
(`schedule.mode`) and multi-turn alike. The core decides when each wave of requests goes out, when
a sample goes to verification, which judged groups the trainer takes and which are too stale; this
module only carries its effects out over the job's parts, through ports (`rlsched.job.ports`: on
Ray, the controller's actors), and turns what they return into the core's events.

One loop waits on everything at once (`Job.wait`: on Ray, one turn of `ray.wait`): the producer's
calls (the fleet's sample streams, or the episode shares of a multi-turn job:
`rlsched.job.arrivals`), the instances' weight pulls, the verifier pools, and the training group's
update in flight. `Generate` starts a wave on the producer; each
arrival goes to verification as the core says (an episode that arrived judged skips the verifiers);
`Update` makes the batch and starts the ranks' steps without waiting for them; `Publish` hands the
new version to rank 0's weight service; `Reload` starts every instance's pull without waiting (an
instance in the middle of a batch finishes it on its version first); `Committed` makes the step's
record. `run_until(step)` returns that record, so the job's loop commits, logs and checkpoints each
step, while the actors go on between its calls.

- Sync (the pipeline zero versions ahead): the next wave goes out only once the job's loop asks for
  its step, so evaluations and checkpoints between iterations see an idle fleet, as before.
- Async: a checkpoint holds the training state after its step, so when one is due at step s, the
  update of step s + 1 waits until the job has taken it (its next `run_until`). No update starts
  past `grpo.steps`, nor once the job's loop means to stop (`stopping`); `step_started` tells that
  loop that the ranks have already stepped past its last commit, so that it commits that step too.
- With the OpenAI endpoint (on Ray, `actors.endpoint_link`), its ended episodes are offered to the wave
  while it generates, rewarded ones join each update, and a reload keeps the pinned instances.

Each span carries the iteration it serves: a sample's span its wave's (from the wave going out), an
update's and a publish's their step's, and an iteration's span runs from the commit before (async)
or its wave's start (sync) to its own commit.
"""

from __future__ import annotations

import time
from typing import Any

from rlsched.config_params import pipeline_params, run_rules
from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore, PipelineTrace
from rlsched.engine.protocol import RequestId
from rlsched.job.arrivals import Arrival, Producer
from rlsched.job.interrupt import ctrl_c
from rlsched.job.ports import Job
from rlsched.job.records import IterationRecord, record_of, unjudgeable
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.versions import PipelineMode
from rlsched.rl.pending import PendingWork, SampleBook
from rlsched.rl.requests import group_of
from rlsched.rl.update import skipped_note
from verifiers.protocol import Outcome


class IterationRun:
    def __init__(
        self,
        controller: Job,
        producer: Producer,
        version: int,
        committed: int = 0,
        restarts: int = 0,
        pending: PendingWork | None = None,
    ) -> None:
        """The iterations from weight version `version`, after `committed` steps; a rebuilt training
        group's (`restarts` > 0) and a resumed run's async waves name their requests apart from those
        the abandoned waves left. `pending`: the judged groups the checkpoint held, back in the buffer."""
        self.c, self.producer, self.restarts = controller, producer, restarts
        cfg = controller.cfg
        self.sync = cfg.schedule.mode is PipelineMode.SYNC
        self.rules = run_rules(cfg)
        self.core = PipelineCore(
            pipeline_params(cfg), version=version, at=controller.clock(), steps=committed
        )
        self.trace: PipelineTrace | None = None
        self._recording = False
        self.book = SampleBook()
        self.samples, self.outcomes, self.wave_of = self.book.samples, self.book.outcomes, self.book.wave_of
        self.faulted: dict[RequestId, Outcome] = {}  # arrived judged, by no verifier
        self._faults_due: list[RequestId] = []  # ... that the core has asked to verify
        self.wave_start: dict[int, float] = {}
        self.records: dict[int, IterationRecord] = {}
        self.updating: tuple[it.Update, list[Any], dict[str, Any]] | None = None
        self._update_left: list[Any] = []  # the ranks' calls of the update in flight not yet done
        self.held: it.Update | None = None  # waits for a checkpoint of the step before
        self.due_wave: int | None = None  # sync: the next wave, until the job's loop asks for its step
        self.last_updated = 0
        self._join_failures = 0  # the fleet's, when the reload began
        self.target = 0  # the step the job's loop waits for now
        self.consumed: dict[int, list[tuple[str, str]]] = {}  # a step's samples: used or left out
        self.steps: dict[int, dict[str, Any]] = {}  # a step's batch figures, until it is committed
        self.published: Any = None
        self.reloading = False
        self.started = False
        self.stopping = False  # the job's loop is about to stop: no update starts any more
        if pending is not None:
            self._restore(pending)

    def record(self) -> None:
        """Keep every event and its effects from the start on (the trace-equivalence test's record)."""
        self._recording = True

    def _restore(self, pending: PendingWork) -> None:
        versions = self.book.restore(pending, self.core.steps)
        self.core.restore(versions, self.c.clock(), pending.dropped_groups, pending.buffer_peak)
        if pending.groups or pending.problems:
            self.c.log(
                f"{len(pending.groups)} judged group(s) the checkpoint held are back in the buffer; "
                f"{len(pending.problems)} problem(s) then in flight are generated again"
            )

    def pending_work(self, position_of: dict[str, int]) -> PendingWork:
        """What this pipeline holds beyond its last committed step: judged groups (a batch held for a
        checkpoint, then the buffer) and the positions of the problems still in flight."""
        size = self.c.cfg.grpo.group_size
        held = list(self.held.request_ids) if self.held is not None else []
        chunks = [tuple(held[i : i + size]) for i in range(0, len(held), size)]
        chunks += [g.members for g in self.core.buffer]
        groups = self.book.judged(chunks)
        flying = {group_of(rid) for rid in self.core.groups}
        positions = sorted(position_of[g] for g in flying if g in position_of)
        return PendingWork(groups, tuple(positions), self.core.dropped_groups, self.core.buffer_peak)

    # -- the loop ------------------------------------------------------------------------------------

    def run_until(self, step_no: int) -> IterationRecord:
        """Drive everything until step `step_no` is committed; its record."""
        c = self.c
        self.target = step_no
        if not self.started:
            self.started = True
            effects = self.core.start()
            if self._recording:
                self.trace = PipelineTrace.begin(self.core)
            self._apply(effects)
        if self.due_wave is not None and self.due_wave <= step_no:
            wave, self.due_wave = self.due_wave, None
            self._generate(wave)
        if self.held is not None and not self._hold(self.held):
            held, self.held = self.held, None
            self._start_update(held)
        warned = False
        while step_no not in self.records:
            ctrl_c.check()  # a Ctrl-C swallowed where it landed stops the job here
            if not (self.sync and self.training_ahead):  # a sync step's update, publish and reload
                c.orders.poll()  # run whole: a stop then checkpoints the step committed
            c.fleet.tick()
            self._take_settled()
            if self.reloading and c.fleet.reload_done:
                self._reloaded()
                continue
            self._offer_episodes()
            c.verification.dispatch(*self.core.batch_states())
            warned = c.orders.stranded(self.core.iteration, warned)
            others = [*self.producer.waitables(), *c.fleet.waitables(), *self._update_left]
            wait_s = min(0.5, c.fleet.next_event_in() or 0.5)
            if not others and c.verification.idle:
                time.sleep(min(wait_s, 0.05))  # only a transient window to wait for
                self.producer.idle()
                continue
            c.wait(others, self._on_ready, wait_s)
        return self.records.pop(step_no)

    def _take_settled(self) -> None:
        """Report the outcomes settled since the last look (the verifiers', then the faults')."""
        settled = self.c.verification.settled()
        settled |= {rid: self.faulted.pop(rid) for rid in self._faults_due}
        self._faults_due = []
        for rid, outcome in settled.items():
            self.outcomes[rid] = outcome
            self._feed(it.Judged(self.c.clock(), rid))

    def _hold(self, e: it.Update) -> bool:
        """Whether step `e` must wait: past the job's last step, or the job has not yet taken the
        checkpoint due after the step before it."""
        return self.rules.update_held(e.iteration, self.stopping, self.target)

    def step_started(self, step_no: int) -> bool:
        """The ranks have stepped (or are stepping) on step `step_no`."""
        return self.last_updated >= step_no or (
            self.updating is not None and self.updating[0].iteration == step_no
        )

    @property
    def training_ahead(self) -> bool:
        """The ranks hold (or are computing) a step past the last committed one."""
        return self.updating is not None or self.last_updated > self.core.committed

    def _on_ready(self, ref: Any) -> None:
        left = self._update_left
        if any(ref is r for r in left):
            left[:] = [r for r in left if r is not ref]
            if not left:
                self._finish_update()
            return
        for arrival in self.producer.on_ready(ref):
            self._arrived(arrival)

    def _feed(self, event: it.Event) -> None:
        effects = self.core.handle(event)
        if self.trace is not None:
            self.trace.add(event, effects)
        self._apply(effects)

    def _apply(self, effects: list[it.Effect]) -> None:
        c = self.c
        for e in effects:
            if isinstance(e, it.Verify):
                self._verify(e.request_ids)
            elif isinstance(e, it.Generate):
                if self.sync and e.iteration > self.target:
                    self.due_wave = e.iteration
                else:
                    self._generate(e.iteration)
            elif isinstance(e, it.Update):
                if self._hold(e):
                    self.held = e
                else:
                    self._start_update(e)
            elif isinstance(e, it.Dropped):
                self._drop(e)
            elif isinstance(e, it.Publish):
                self.published = c.publish(self.last_updated, e.version)
                self._feed(it.VersionPublished(c.clock(), self.published.version))
            elif isinstance(e, it.Reload):
                c.fleet.publish(self.published)
                c.fleet.reload_begin(c.held(e.version))
                self._join_failures = c.fleet.counts.join_failures
                self.reloading = True
            elif isinstance(e, it.Committed):
                self._committed(e)

    def _verify(self, request_ids: tuple[str, ...]) -> None:
        self._faults_due += [RequestId(r) for r in request_ids if r in self.faulted]
        if rest := tuple(r for r in request_ids if r not in self.faulted):
            self.c.verification.verify(rest)

    def _reloaded(self) -> None:
        self.reloading = False
        self.c.reload_ended(self._join_failures, self.core.version)
        self._feed(it.Reloaded(self.c.clock()))

    # -- generation ----------------------------------------------------------------------------------

    def _generate(self, wave: int) -> None:
        c = self.c
        tags = ""
        if not self.sync:  # async waves a recovery abandoned may still stream in: named apart
            tags = (f"a{c.attempt}" if c.attempt > 1 else "") + (f"r{self.restarts}" if self.restarts else "")
        ids = self.producer.begin(wave, f"{wave}{tags}")
        now = c.clock()
        self.wave_start[wave] = now
        for rid in ids:
            self.wave_of[rid] = wave
        self._feed(it.Started(now, wave, ids))

    def _arrived(self, a: Arrival) -> None:
        c, rid, now = self.c, a.sample.request_id, self.c.clock()
        wave = self.wave_of.get(rid)
        if wave is None:  # not one of this run's (a recovery abandoned it)
            return
        self.samples[rid] = a.sample
        c.spans.append(Span(SpanKind.GENERATE, rid, self.wave_start[wave], now, wave, a.attrs))
        if a.fault is not None:  # judged now, by no verifier: a fault, never a zero reward
            self.faulted[rid] = a.fault
        else:
            c.verification.arrived(a.sample, a.problem, wave, self.core.batch_id(wave))
        version = a.version if a.version is not None else self.core.version
        self._feed(it.SampleArrived(now, rid, version))

    def _offer_episodes(self) -> None:
        """The endpoint's episodes ended with a reference and no reward join the wave that generates
        (`Offered`): the verifier pool judges their final answer like any sample."""
        c, wave = self.c, self.core.iteration
        if c.endpoint is None or not self.core.takes_offers:
            return
        if offered := c.endpoint.offer(c.verification, wave, self.core.batch_id(wave)):
            self._feed(it.Offered(c.clock(), offered))

    def _drop(self, e: it.Dropped) -> None:
        self.c.log(f"{len(e.request_ids)} sample(s) left out: generated before v{e.oldest}, past the bound")
        for rid in e.request_ids:
            self._forget(RequestId(rid))

    def _forget(self, rid: RequestId) -> None:
        self.producer.forget(rid)
        self.book.forget(rid)

    # -- training ------------------------------------------------------------------------------------

    def _start_update(self, e: it.Update) -> None:
        c = self.c
        ids = [RequestId(r) for r in e.request_ids]
        judged = c.endpoint.reward(self.outcomes) if c.endpoint is not None else {}
        batch = self.producer.batch(e, self.samples, self.outcomes)
        outcomes = {r: self.outcomes[r] for r in batch.samples}
        if bad := unjudgeable(outcomes):
            c.log(f"iteration {e.iteration}: {len(bad)} sample(s) cannot be judged, e.g. {bad[0].detail}")
        items, extra = batch.items, dict(batch.extra)
        self.consumed[e.iteration] = [(r, "used" if r in batch.used else "left_out") for r in ids]
        if c.endpoint is not None:  # the endpoint's episodes rewarded since the last update
            more, consumed, counts = c.endpoint.take(e.iteration, e.oldest)  # the samples' bound
            items = [*items, *more]
            self.consumed[e.iteration] += consumed
            extra["endpoint"] = counts | judged
        if not self.sync:
            extra["staleness"] = {str(k): n for k, n in e.staleness}
        for r in ids:
            self._forget(r)
        refs = c.group.update_begin(items)
        figures = {"batch": batch, "outcomes": outcomes, "used": len(items), "extra": extra}
        self.updating, self._update_left = (e, refs, figures), list(refs)

    def _finish_update(self) -> None:
        assert self.updating is not None
        e, refs, figures = self.updating
        self.updating = None
        stats, start, end = self.c.group.update_end(refs)
        if (note := skipped_note(stats, e.iteration)) is not None:
            self.c.log(note)
        attrs = {"lane": "trainer", "samples": figures["used"], "steps": self.c.cfg.grpo.minibatches}
        self.c.spans.append(Span(SpanKind.UPDATE, f"update-{e.iteration}", start, end, e.iteration, attrs))
        figures["stats"] = stats
        self.steps[e.iteration] = figures
        self.last_updated = e.iteration
        self._feed(it.Updated(self.c.clock()))

    def _committed(self, e: it.Committed) -> None:
        c = self.c
        f = self.steps.pop(e.iteration)
        attrs = {"lane": "controller"}
        c.spans.append(
            Span(SpanKind.ITERATION, f"iter-{e.iteration}", e.started, c.clock(), e.iteration, attrs)
        )
        extra = c.record_extra(f["stats"]) | f["extra"]
        if not self.sync:
            extra |= {
                "stale_groups_dropped": self.core.dropped_groups,  # since the job started
                "buffer_peak": self.core.buffer_peak,
            }
        batch = f["batch"]
        self.records[e.iteration] = record_of(
            e.iteration, e.version, batch.samples, f["outcomes"], f["used"], batch.counts, f["stats"].loss,
            extra,
        )  # fmt: skip
