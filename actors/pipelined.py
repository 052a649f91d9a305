"""The Ray driver of the pipelined iteration (`schedule.mode: async`): the pipeline core
(`rlsched.core.pipeline`) decides when each iteration's requests go out, which judged groups the
trainer takes and which are too stale; this module carries its effects out over the controller's
actors, so that instances generate while the training group updates.

One loop waits on everything at once: the instances' sample streams and weight pulls, the verifier
pools, and the training group's update in flight. `Generate` sends an iteration's requests to the
fleet (queued behind the running ones); each sample goes to verification as the core says;
`Update` assembles the batch and starts the ranks' steps without waiting for them; `Publish` hands
the new version to rank 0's weight service; `Reload` starts every instance's pull without waiting
(an instance in the middle of a batch finishes it on its version first); `Committed` makes the
step's record. `run_until(step)` returns that record, so the job's loop commits, logs and
checkpoints each step as in `sync` mode, while the actors go on between its calls.

A checkpoint holds the training state after its step: when one is due at step s, the update of step
s + 1 waits until the job has taken it (the job's next `run_until`). No update starts past
`grpo.steps`, nor once the job's loop means to stop (`stopping`); `step_started` tells that loop
that the ranks have already stepped past its last commit, so that it commits that step too.

Each span carries the iteration it serves: a sample's span its iteration's (from that iteration's
requests going out), an update's and a publish's their step's, and an iteration's span runs from the
commit before to its own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.interrupt import ctrl_c
from actors.pool import step
from actors.records import IterationRecord, generate_attrs, record_of
from rlsched.config_params import pipeline_params
from rlsched.core import iteration as it
from rlsched.core.pipeline import PipelineCore
from rlsched.engine.protocol import RequestId, Sample
from rlsched.metrics.spans import Span, SpanKind
from rlsched.policy.durability import checkpoint_due
from rlsched.rl.assemble import assemble
from rlsched.rl.pending import JudgedGroup, PendingWork
from rlsched.rl.requests import group_of
from rlsched.rl.task import TaskProblem
from rlsched.rl.update import skipped_note
from verifiers.protocol import Outcome

if TYPE_CHECKING:
    from actors.controller import JobController


class PipelinedRun:
    def __init__(
        self,
        controller: JobController,
        version: int,
        committed: int = 0,
        restarts: int = 0,
        pending: PendingWork | None = None,
    ) -> None:
        """The pipeline from weight version `version`, after `committed` steps; a rebuilt training
        group's (`restarts` > 0) and a resumed run's name their requests apart from those the abandoned
        waves left. `pending`: the judged groups the checkpoint held, back in the buffer."""
        self.c = controller
        self.restarts = restarts
        cfg = controller.cfg
        self.core = PipelineCore(
            pipeline_params(cfg),
            version=version,
            at=controller.clock(),
            steps=committed,
        )
        self.samples: dict[RequestId, Sample] = {}
        self.outcomes: dict[RequestId, Outcome] = {}
        self.references: dict[RequestId, TaskProblem] = {}
        self.wave_of: dict[str, int] = {}
        self.wave_start: dict[int, float] = {}
        self.records: dict[int, IterationRecord] = {}
        self.updating: tuple[it.Update, list[Any], dict[str, Any]] | None = None
        self._update_left: list[Any] = []  # the ranks' calls of the update in flight not yet done
        self.held: it.Update | None = None  # waits for a checkpoint of the step before
        self.last_updated = 0
        self.target = 0  # the step the job's loop waits for now
        self.consumed: dict[int, list[tuple[str, str]]] = {}  # a step's samples: used or left out
        self.steps: dict[int, dict[str, Any]] = {}  # a step's batch figures, until it is committed
        self.published: Any = None
        self.reloading = False
        self.started = False
        self.stopping = False  # the job's loop is about to stop: no update starts any more
        if pending is not None:
            self._restore(pending)

    def _restore(self, pending: PendingWork) -> None:
        core = self.core
        for g in pending.groups:
            for sample, outcome in zip(g.samples, g.outcomes, strict=True):
                self.samples[sample.request_id] = sample
                self.outcomes[sample.request_id] = outcome
                self.wave_of[sample.request_id] = core.steps
        versions = [{str(s.request_id): s.oldest_version for s in g.samples} for g in pending.groups]
        core.restore(versions, self.c.clock(), pending.dropped_groups, pending.buffer_peak)
        if pending.groups or pending.problems:
            self.c.log(
                f"{len(pending.groups)} judged group(s) the checkpoint held are back in the buffer; "
                f"{len(pending.problems)} problem(s) then in flight are generated again"
            )

    def pending_work(self) -> PendingWork:
        """What this pipeline holds beyond its last committed step: judged groups (a batch held for a
        checkpoint, then the buffer) and the positions of the problems still in flight."""
        size = self.c.cfg.grpo.group_size
        held = list(self.held.request_ids) if self.held is not None else []
        chunks = [tuple(held[i : i + size]) for i in range(0, len(held), size)]
        chunks += [g.members for g in self.core.buffer]
        groups = tuple(
            JudgedGroup(
                self.wave_of[rids[0]],
                tuple(self.samples[RequestId(r)] for r in rids),
                tuple(self.outcomes[RequestId(r)] for r in rids),
            )
            for rids in chunks
        )
        flying = {group_of(rid) for rid in self.core.groups}
        positions = sorted(self.c.position_of[g] for g in flying if g in self.c.position_of)
        return PendingWork(groups, tuple(positions), self.core.dropped_groups, self.core.buffer_peak)

    # -- the loop ------------------------------------------------------------------------------------

    def run_until(self, step_no: int) -> IterationRecord:
        """Drive everything until step `step_no` is committed; its record."""
        c = self.c
        self.target = step_no
        if not self.started:
            self.started = True
            self._apply(self.core.start())
        if self.held is not None and not self._hold(self.held):
            held, self.held = self.held, None
            self._start_update(held)
        warned = False
        while step_no not in self.records:
            ctrl_c.check()
            c.orders.poll()
            c.fleet.tick()
            for rid, outcome in c.verification.settled().items():
                self.outcomes[rid] = outcome
                self._feed(it.Judged(c.clock(), rid))
            if self.reloading and c.fleet.reload_done:
                self.reloading = False
                self._feed(it.Reloaded(c.clock()))
                continue
            c.verification.dispatch(*self.core.batch_states())
            warned = c.orders.stranded(self.core.iteration, warned)
            others = [*c.fleet.waitables(), *self._update_left]
            wait_s = min(0.5, c.fleet.next_event_in() or 0.5)
            if not others and c.verification.idle:
                time.sleep(min(wait_s, 0.05))
                continue
            step(c.verification.pools, others, self._on_ready, timeout_s=wait_s)
        return self.records.pop(step_no)

    def _hold(self, e: it.Update) -> bool:
        """Whether step `e` must wait: past the job's last step, or the job has not yet taken the
        checkpoint due after the step before it."""
        before = e.iteration - 1
        if self.stopping or e.iteration > self.c.cfg.grpo.steps:
            return True
        return (
            checkpoint_due(before, self.c.cfg.checkpoint.every, last_iteration=False)
            and self.target <= before
        )

    def step_started(self, step_no: int) -> bool:
        """The ranks have stepped (or are stepping) on step `step_no`."""
        return self.last_updated >= step_no or (
            self.updating is not None and self.updating[0].iteration == step_no
        )

    def _on_ready(self, ref: Any) -> None:
        left = self._update_left
        if any(ref is r for r in left):
            left[:] = [r for r in left if r is not ref]
            if not left:
                self._finish_update()
            return
        self._on_samples(self.c.fleet.on_ready(ref))

    def _feed(self, event: it.Event) -> None:
        self._apply(self.core.handle(event))

    def _apply(self, effects: list[it.Effect]) -> None:
        c = self.c
        for e in effects:
            if isinstance(e, it.Verify):
                c.verification.verify(e.request_ids)
            elif isinstance(e, it.Generate):
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
                c.fleet.reload_begin()
                self.reloading = True
            elif isinstance(e, it.Committed):
                self._committed(e)

    # -- generation ----------------------------------------------------------------------------------

    def _generate(self, wave: int) -> None:
        c = self.c
        tags = (f"a{c.attempt}" if c.attempt > 1 else "") + (f"r{self.restarts}" if self.restarts else "")
        requests, references = c.request_samples(wave, f"{wave}{tags}" if tags else None)
        now = c.clock()
        self.wave_start[wave] = now
        self.references.update(references)
        for r in requests:
            self.wave_of[r.request_id] = wave
        c.fleet.begin(wave, requests)
        self._feed(it.Started(now, wave, tuple(r.request_id for r in requests)))

    def _on_samples(self, arrived: list[tuple[str, Sample]]) -> None:
        c = self.c
        for lane, sample in arrived:
            now, rid = c.clock(), sample.request_id
            wave = self.wave_of.get(rid)
            if wave is None:  # not one of this pipeline's (a recovery abandoned it)
                continue
            self.samples[rid] = sample
            version = sample.oldest_version  # staleness counts from it
            attrs = generate_attrs(lane, sample)
            c.spans.append(Span(SpanKind.GENERATE, rid, self.wave_start[wave], now, wave, attrs))
            c.verification.arrived(sample, self.references[rid], wave, self.core.batch_id(wave))
            self._feed(it.SampleArrived(now, rid, version))

    def _drop(self, e: it.Dropped) -> None:
        self.c.log(f"{len(e.request_ids)} sample(s) left out: generated before v{e.oldest}, past the bound")
        for rid in e.request_ids:
            self._forget(RequestId(rid))

    def _forget(self, rid: RequestId) -> None:
        self.c.position_of.pop(group_of(rid), None)
        self.samples.pop(rid, None)
        self.outcomes.pop(rid, None)
        self.references.pop(rid, None)
        self.wave_of.pop(rid, None)

    # -- training ------------------------------------------------------------------------------------

    def _start_update(self, e: it.Update) -> None:
        c = self.c
        ids = [RequestId(r) for r in e.request_ids]
        batch = assemble(ids, self.samples, self.outcomes, c.cfg.grpo.group_size, e.oldest)
        verdicts = {r: self.outcomes[r] for r in ids}
        figures = {
            "samples": {r: self.samples[r] for r in ids},
            "outcomes": verdicts,
            "used": len(batch.items),
            "counts": {"faults": batch.faults, "stale_dropped": batch.stale_dropped},
            "staleness": {str(k): n for k, n in e.staleness},
        }
        used = set(batch.used)
        self.consumed[e.iteration] = [(r, "used" if r in used else "left_out") for r in ids]
        for r in ids:
            self._forget(r)
        refs = c.group.update_begin(batch.items)
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
        c.spans.append(
            Span(
                SpanKind.ITERATION,
                f"iter-{e.iteration}",
                e.started,
                c.clock(),
                e.iteration,
                {"lane": "controller"},
            )
        )
        extra = c.record_extra(f["stats"]) | {
            "staleness": f["staleness"],
            "stale_groups_dropped": self.core.dropped_groups,  # since the job started
            "buffer_peak": self.core.buffer_peak,
        }
        self.records[e.iteration] = record_of(
            e.iteration,
            e.version,
            f["samples"],
            f["outcomes"],
            f["used"],
            f["counts"],
            f["stats"].loss,
            extra,
        )
