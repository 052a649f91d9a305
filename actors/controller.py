"""The job controller: one RL iteration as numbered phases over the Ray actors, in the order the
iteration's core (`rlsched.core.iteration`) asks for them.

1. `request_samples`      - group_size samples per prompt, queued for the rollout fleet
                            (`actors.fleet`: READY instances at an admissible version take batches
                            as they free up, joiners included; under `distrs`, problems with the
                            longest expected verification first);
2. `generate_and_verify`  - every finished sample goes to verification (`actors.verification`) when
                            the core says: at once, verified while generation goes on, or, with
                            `schedule.overlap: false`, once all exist (the sequential baseline);
3. `assemble`             - group-relative advantages over fully judged groups at an allowed version;
4. `update`               - the training group's GRPO step (all ranks, gradients all-reduced);
5. `publish`              - rank 0's new BF16 version, held by its weight service;
6. `reload`               - every serving instance pulls it over the weight link, loads it and
                            confirms the checksum;
7. `commit`               - the iteration record (`actors.records`), appended and fsync'ed by the caller.

With `rollout.endpoint.enabled`, the OpenAI endpoint (`actors.endpoint`) serves the same fleet: step
3 adds the episodes its clients ended and rewarded since the last iteration to the batch
(`rlsched.rl.episodes`), and step 6 leaves in place the instances its open episodes are pinned to
(`rlsched.policy.routing.hold_back`), then tells it the fleet and the version.

The controller runs in the driver and holds only handles and bookkeeping; every span it records is
on its own clock (request sent -> sample arrived, dispatched -> outcome received).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray

from actors.agent_episodes import AgentIterations
from actors.cluster import ClusterClient
from actors.fleet import Fleet, store_path
from actors.interrupt import ctrl_c
from actors.orders import Orders
from actors.pipelined import PipelinedRun
from actors.pool import step
from actors.records import IterationRecord, generate_attrs, record_of, unjudgeable
from actors.trainer import PublishedVersion, TrainingGroup
from actors.verification import JobVerification
from rlsched.config import JobConfig
from rlsched.config_params import pipeline_params
from rlsched.core import iteration as it
from rlsched.engine.protocol import FinishReason, GenerationRequest, RequestId, Sample, WeightVersion
from rlsched.metrics.spans import Span, SpanKind
from rlsched.model.checkpoint import inspect_checkpoint, load_prompting, write_checkpoint
from rlsched.policy.lifecycle import IterationPhase
from rlsched.policy.routing import InstanceView, hold_back
from rlsched.policy.verify import DispatchPolicy, generation_order
from rlsched.policy.versions import PipelineMode
from rlsched.rl.agent import spec_of
from rlsched.rl.assemble import assemble
from rlsched.rl.episodes import episode_batch
from rlsched.rl.evaluate import EvalResult, eval_requests, score
from rlsched.rl.grpo import LossStats, importance
from rlsched.rl.pending import PendingWork
from rlsched.rl.requests import group_requests, run_seed_for_requests, sampling_params
from rlsched.rl.task import JsonlProblem, TaskProblem
from rlsched.rl.tasks import build_task
from rlsched.rl.update import TrainItem, skipped_note
from rlsched.transfer.client import WeightClient
from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, Verdict, client_reference_refusal


@dataclass(frozen=True)
class Start:
    """Where the controller begins: a new job, or a resumed one after `iteration`, with the training
    state in `state` (a checkpoint directory; None: the model as loaded), at weight version `version`
    and data position `cursor` (training problems already drawn); a pipelined job's work held beside
    that checkpoint in `pending`; `attempt`: the run's number (1, then one more per resume)."""

    iteration: int = 0
    version: int = 0
    cursor: int = 0
    state: Path | None = None
    pending: PendingWork | None = None
    attempt: int = 1


class JobController:
    def __init__(
        self,
        cfg: JobConfig,
        log: Callable[[str], None] = print,
        out_dir: Path | None = None,
        inbox: Any = None,
        cluster: ClusterClient | None = None,
        groups: Sequence[Any] = (),
        start: Start | None = None,
    ) -> None:
        self.cfg, self.log, self.clock = cfg, log, time.monotonic
        self.spans: list[Span] = []
        self.redone_spans: list[Span] = []  # of iterations a recovery ran again (the timeline's)
        self.tokenizer, self.template = load_prompting(cfg.model.checkpoint, cfg.model.template)
        self.task = build_task(cfg.task)
        self.verifiers = VerifierSet(
            cfg.verifier.kind,
            cfg.verifier.sandbox.policy(),
            cfg.task.rewards(),
            cfg.verifier.timeout.params(),
        )
        resume_after = None if start is None else start.iteration  # a resumed run: its episodes come back
        start = start or Start()
        self.attempt = start.attempt
        self.train_stream, self.cursor = self._stream_at(start.cursor)
        self.redo = self._problems_at(start.pending.problems if start.pending else ())
        self.position_of: dict[str, int] = {}  # a pipelined job's groups in flight: their problem's position
        self.consumed: list[tuple[str, str]] = []  # (request id, how) of the last iteration
        self.sampling = sampling_params(cfg.sampling, self.template)
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        # under the cluster scheduler: the training gang's and the workers' placement groups
        trainer_pg, workers_pg = (groups[0], groups[1]) if groups else (None, None)
        self._trainer_pg = trainer_pg
        self.group = self._training_group(start)
        self.fleet = Fleet(cfg, checkpoint, store_path(cfg, out_dir), self.spans, self.clock, log)
        self.fleet.pg = workers_pg
        for i in range(cfg.rollout.instances):
            self.fleet.add(f"rollout-{i}")
        self.orders = Orders(self.fleet, cluster, inbox, self.clock, log)
        self.verification = JobVerification(cfg, self.verifiers, self.spans, self.clock, log, workers_pg)
        self.estimator = self.verification.estimator
        self.core = self._iteration_core(start.version)
        async_mode = cfg.schedule.mode is PipelineMode.ASYNC
        self.pipeline = (
            PipelinedRun(self, start.version, start.iteration, pending=start.pending) if async_mode else None
        )
        self.trace: it.IterationTrace | None = None
        self.phases = it.Phases()  # what the core asked for: `run_iteration` runs them in order
        self.fleet.publish(self.group.publish(start.version))
        self.fleet.reload()
        self.fleet.wait_serving()
        self.endpoint: Any = (
            self._start_endpoint(out_dir, resume_after) if cfg.rollout.endpoint.enabled else None
        )
        self._judging: dict[RequestId, str] = {}  # the endpoint's episodes the verifiers judge
        self.faulted: dict[RequestId, Outcome] = {}  # samples judged faults without a verifier
        self._faults_due: list[RequestId] = []  # ... that the core has asked to verify
        self.agent = self._agent_iterations(out_dir, resume_after is None) if cfg.agent.enabled else None

    def _agent_iterations(self, out_dir: Path | None, fresh: bool) -> AgentIterations:
        """A multi-turn job's iterations (`actors.agent_episodes`), its rounds journaled in the run's
        `rounds.sqlite`."""
        journal = out_dir / "rounds.sqlite" if out_dir is not None else None
        return AgentIterations(self, spec_of(self.cfg, self.sampling, journal), fresh)

    # -- where the job starts, and where it starts again ----------------------------------------------

    def _stream_at(self, cursor: int) -> tuple[Iterator[TaskProblem], int]:
        """The training problems from position `cursor` on (the same seed draws the same sequence)."""
        stream = self.task.train_problems(random.Random(self.cfg.run.seed))
        for _ in range(cursor):
            next(stream)
        return stream, cursor

    def _problems_at(self, positions: Sequence[int]) -> deque[tuple[int, TaskProblem]]:
        """The training problems at `positions` (a pipelined job's groups that were in flight at its
        checkpoint): drawn again before any new one."""
        wanted = set(positions)
        stream, _ = self._stream_at(0)
        drawn = [next(stream) for _ in range(max(wanted, default=-1) + 1)]
        return deque((position, drawn[position]) for position in sorted(wanted))

    def _training_group(self, start: Start) -> TrainingGroup:
        cfg = self.cfg
        checkpoint = str(cfg.model.checkpoint) if cfg.model.checkpoint else None
        group = TrainingGroup(cfg.trainer, cfg.grpo, cfg.weights, checkpoint, cfg.run.seed, self._trainer_pg)
        if start.state is not None:
            steps = group.load_state(start.state)
            self.log(
                f"training state of iteration {start.iteration} loaded from {start.state} (step {steps})"
            )
        return group

    def _iteration_core(self, version: int) -> it.IterationCore:
        cfg = self.cfg
        p = pipeline_params(cfg)  # the sync run's core takes the same parameters (issue 42: one core next)
        params = it.IterationParams(p.overlap, p.cost_rate, p.max_staleness)
        return it.IterationCore(params, version=version)

    def restart_training(self, start: Start) -> int:
        """The training group failed: a new one from `start`'s training state, the data rewound to its
        cursor, and its weights published to the fleet under a new version number (a number names
        one set of weights, so the fleet never sees one reused). Returns that version."""
        self.group.shutdown()
        self._set_aside_spans(start.iteration)
        self.group = self._training_group(start)
        self.train_stream, self.cursor = self._stream_at(start.cursor)
        self.redo = self._problems_at(start.pending.problems if start.pending else ())
        version = self.version + 1
        self.core, self.phases = self._iteration_core(version), it.Phases()
        if self.pipeline is not None:  # the waves in flight are abandoned: their samples are ignored
            restarts = self.pipeline.restarts + 1
            self.pipeline = PipelinedRun(self, version, start.iteration, restarts, start.pending)
        self.reload(self.group.publish(version), replenish=True)
        if self.endpoint is not None:
            back = ray.get(self.endpoint.restore.remote(start.iteration))
            self.log(f"endpoint: {back} episode(s) taken by the iterations run again are back in its store")
        return version

    def episodes_checkpointed(self, iteration: int) -> None:
        """Every checkpoint kept holds the iterations up to `iteration`: the endpoint's journal lets
        go of the episodes they took."""
        if self.endpoint is not None:
            ray.get(self.endpoint.checkpointed.remote(iteration))

    def _set_aside_spans(self, after: int) -> None:
        """The spans of iterations that run again leave the phase times; the timeline keeps them,
        marked `redone` (the list is shared with the fleet and the verifiers: changed in place)."""
        gone = [s for s in self.spans if s.iteration > after]
        self.spans[:] = [s for s in self.spans if s.iteration <= after]
        self.redone_spans += [
            Span(s.kind, s.id, s.start, s.end, s.iteration, {**s.attrs, "redone": True}) for s in gone
        ]

    # -- the iteration's core ----------------------------------------------------------------------

    def record(self) -> it.IterationTrace:
        """Keep every event and its effects from now on (the trace-equivalence test's record)."""
        self.trace = it.IterationTrace.begin(self.core)
        return self.trace

    def _feed(self, event: it.Event) -> None:
        effects = self.core.handle(event)
        if self.trace is not None:
            self.trace.add(event, effects)
        for e in effects:
            if isinstance(e, it.Verify):
                self._faults_due += [RequestId(r) for r in e.request_ids if r in self.faulted]
                if rest := tuple(r for r in e.request_ids if r not in self.faulted):
                    self.verification.verify(rest)
            else:
                self.phases.ask(e)

    @property
    def version(self) -> int:
        """The newest published version: what the instances hold."""
        return self.pipeline.core.version if self.pipeline is not None else self.core.version

    def stop_training(self, iteration: int) -> bool:
        """The job means to stop before `iteration`: a pipelined job starts no more updates. Whether
        its ranks have already stepped on `iteration` (which must then be committed too)."""
        if self.pipeline is None:
            return False
        self.pipeline.stopping = True
        return self.pipeline.step_started(iteration)

    @property
    def training_ahead(self) -> bool:
        """A pipelined job's ranks hold (or are computing) a step past the last committed one."""
        p = self.pipeline
        return p is not None and (p.updating is not None or p.last_updated > p.core.committed)

    # -- phases ----------------------------------------------------------------------------------

    def request_samples(
        self, iteration: int, prefix: str | None = None
    ) -> tuple[list[GenerationRequest], dict[RequestId, TaskProblem]]:
        """The next problems' requests, named `PREFIX-PROBLEM-MEMBER` (the prefix: the iteration)."""
        drawn = [self._next_problem() for _ in range(self.cfg.grpo.prompts_per_step)]
        v = self.cfg.verifier
        if v.dispatch is DispatchPolicy.DISTRS and v.order_generation:  # longest verification first
            kinds = [self.verification.kind_key(p) for _, p in drawn]
            drawn = [drawn[i] for i in generation_order(kinds, self.verification.estimators)]
        prefix = prefix or str(iteration)
        if self.pipeline is not None:
            self.position_of.update((f"{prefix}-{i}", position) for i, (position, _) in enumerate(drawn))
        problems = [p for _, p in drawn]
        return group_requests(
            problems,
            self.cfg.grpo.group_size,
            prefix,
            self.tokenizer,
            self.template,
            self.sampling,
            run_seed_for_requests(self.cfg),
        )

    def _next_problem(self) -> tuple[int, TaskProblem]:
        """The next training problem with its position in the stream: one a pipelined job had in
        flight at its checkpoint first, then a new one."""
        if self.redo:
            return self.redo.popleft()
        self.cursor += 1
        return self.cursor - 1, next(self.train_stream)

    def pending_work(self) -> PendingWork | None:
        """What a pipelined job holds beyond its last committed step (None in `sync` mode)."""
        return self.pipeline.pending_work() if self.pipeline is not None else None

    def generate_and_verify(
        self, iteration: int, requests: list[GenerationRequest], references: dict[RequestId, TaskProblem]
    ) -> tuple[dict[RequestId, Sample], dict[RequestId, Outcome]]:
        """Until the core has every sample in and judged: samples stream from the fleet, each goes to
        verification when the core says, and every settled outcome is reported back."""
        start = self.clock()
        fleet, verification = self.fleet, self.verification
        fleet.begin(iteration, requests)
        samples: dict[RequestId, Sample] = {}
        outcomes: dict[RequestId, Outcome] = {}
        warned = False
        while self._judged(outcomes):
            ctrl_c.check()  # a Ctrl-C swallowed where it landed stops the job here
            self.orders.poll()
            fleet.tick()
            self._offer_episodes(iteration)
            verification.dispatch(self.core.batch_state())
            wait_s = min(0.5, fleet.next_event_in() or 0.5)
            others = fleet.waitables()
            warned = self.orders.stranded(iteration, warned)
            if not others and verification.idle:
                time.sleep(min(wait_s, 0.05))  # only a transient window to wait for
                continue
            step(
                verification.pools,
                others,
                lambda ref: self._on_samples(iteration, fleet.on_ready(ref), start, samples, references),
                timeout_s=wait_s,
            )
        return samples, outcomes

    def _judged(self, outcomes: dict[RequestId, Outcome]) -> bool:
        """Report the outcomes settled since the last look; whether the core still waits for more."""
        settled = self.verification.settled()
        settled |= {rid: self.faulted.pop(rid) for rid in self._faults_due}
        self._faults_due = []
        for request_id, outcome in settled.items():
            outcomes[request_id] = outcome
            self._feed(it.Judged(self.clock(), request_id))
        return self.core.waiting

    def _on_samples(
        self,
        iteration: int,
        arrived: list[tuple[str, Sample]],
        start: float,
        samples: dict[RequestId, Sample],
        references: dict[RequestId, TaskProblem],
    ) -> None:
        for lane, sample in arrived:
            now, rid = self.clock(), sample.request_id
            samples[rid] = sample
            attrs = generate_attrs(lane, sample)
            self.spans.append(Span(SpanKind.GENERATE, rid, start, now, iteration, attrs))
            self.verification.arrived(sample, references[rid], iteration, self.core.batch_id)
            self._feed(it.SampleArrived(now, rid, sample.oldest_version))

    def assemble(
        self, update: it.Update, samples: dict[RequestId, Sample], outcomes: dict[RequestId, Outcome]
    ) -> tuple[list[TrainItem], dict[str, int]]:
        """Fully judged groups whose samples all come from an allowed version (`rlsched.rl.assemble`)."""
        ids = [RequestId(r) for r in update.request_ids if RequestId(r) in samples]  # not episodes
        batch = assemble(ids, samples, outcomes, self.cfg.grpo.group_size, update.oldest)
        used = set(batch.used)
        self.consumed = [(r, "used" if r in used else "left_out") for r in update.request_ids]
        return batch.items, {"faults": batch.faults, "stale_dropped": batch.stale_dropped}

    def update(self, iteration: int, items: list[TrainItem]) -> LossStats:
        """The training group's steps on the batch (`grpo.minibatches` of them); their figures."""
        stats, start, end = self.group.update(items)
        if (note := skipped_note(stats, iteration)) is not None:
            self.log(note)
        attrs = {"lane": "trainer", "samples": len(items), "steps": self.cfg.grpo.minibatches}
        self.spans.append(Span(SpanKind.UPDATE, f"update-{iteration}", start, end, iteration, attrs))
        return stats

    def publish(self, iteration: int, version: int) -> PublishedVersion:
        start = self.clock()
        meta = self.group.publish(version)
        attrs = {"lane": "trainer", "bytes": meta.nbytes, "checksum": meta.checksum[:16]}
        self.spans.append(Span(SpanKind.PUBLISH, f"v{meta.version}", start, self.clock(), iteration, attrs))
        return meta

    def reload(self, meta: PublishedVersion, replenish: bool = False) -> None:
        """Every serving instance takes `meta`'s version. With `replenish`, instances the job lost
        without a replacement (their reload died with an old training group's weight service) are
        replaced first, and join at this version."""
        self.fleet.publish(meta)
        if replenish:
            self.fleet.replenish(self.cfg.rollout.instances)
        failed = self.fleet.counts.join_failures
        self.fleet.reload(self._held(meta.version))
        if self.fleet.counts.join_failures > failed:  # were they unable to reach rank 0's service?
            self.group.check("reload")
        if self.endpoint is not None:
            ray.get(self.endpoint.sync.remote(self.fleet.live_handles(), meta.version))

    # -- the OpenAI endpoint -----------------------------------------------------------------------

    def _start_endpoint(self, out_dir: Path | None, resume_after: int | None) -> Any:
        """The endpoint over this job's fleet (`actors.endpoint`), its address printed. Its episodes
        are journaled in the run's `episodes.sqlite`; a resumed run takes back those the crash left."""
        from actors.endpoint import EndpointActor

        cfg = self.cfg
        journal = str(out_dir / "episodes.sqlite") if out_dir is not None else None
        handle = EndpointActor.remote(  # type: ignore[attr-defined]
            self.fleet.live_handles(), str(inspect_checkpoint(cfg.model.checkpoint).path),
            cfg.rollout.endpoint, max_staleness=cfg.rollout.max_staleness, template=cfg.model.template,
            journal=journal, resume_after=resume_after, rewards=self.verifiers.rewards,
            reference_refusal=client_reference_refusal(self.verifiers.get()),
        )  # fmt: skip
        if resume_after is not None and journal is not None:
            back = len(ray.get(handle.episodes.remote()))
            self.log(f"endpoint: {back} episode(s) of the earlier run taken back from {journal}")
        host, port, name, context = ray.get(handle.address.remote())
        self.log(
            f"endpoint: {name} at http://{host}:{port}/v1 over the rollout fleet (context {context} "
            "tokens); rewarded episodes join each iteration's batch (docs/endpoint.md)"
        )
        return handle

    def _held(self, version: int) -> list[str]:
        """Instances a reload to `version` leaves in place for the endpoint's pinned episodes."""
        if self.endpoint is None:
            return []
        pins = ray.get(self.endpoint.pins.remote())
        views = [InstanceView(n, True, v) for n, v in self.fleet.serving_versions().items()]
        return sorted(hold_back(views, pins, version, self.cfg.rollout.max_staleness))

    def _offer_episodes(self, iteration: int) -> None:
        """Episodes ended with a reference and no reward join this batch's verification (`Offered`)
        while it generates: the verifier pool judges their final answer like any sample."""
        if self.endpoint is None or self.core.phase is not IterationPhase.GENERATING:
            return
        offered = []
        for j in ray.get(self.endpoint.to_judge.remote()):
            rid = RequestId(f"episode/{j.episode_id}")
            self._judging[rid] = j.episode_id
            sample = Sample(
                rid, (), j.token_ids, (0.0,) * len(j.token_ids), j.text, FinishReason.STOP,
                WeightVersion(j.version),
            )  # fmt: skip
            problem = JsonlProblem(j.episode_id, (), j.reference)
            self.verification.arrived(sample, problem, iteration, self.core.batch_id)
            offered.append((rid, j.version))
        if offered:
            self._feed(it.Offered(self.clock(), tuple(offered)))

    def _reward_episodes(self, outcomes: dict[RequestId, Outcome]) -> dict[str, int]:
        """The verifiers' rewards for the offered episodes, sent to the endpoint (their outcomes
        leave the task's); one the verifier could not judge waits for the reward timeout."""
        counts = {"episodes_judged": 0, "episodes_unjudged": 0}
        for rid in [r for r in self._judging if r in outcomes]:
            episode_id, outcome = self._judging.pop(rid), outcomes.pop(rid)
            if isinstance(outcome, Verdict):
                ray.get(self.endpoint.judged.remote(episode_id, outcome.reward))
                counts["episodes_judged"] += 1
            else:
                counts["episodes_unjudged"] += 1
                self.log(f"episode {episode_id}: the verifier could not judge it ({outcome.detail})")
        return counts if self.endpoint is not None else {}

    def episodes(self, iteration: int) -> tuple[list[TrainItem], dict[str, int]]:
        """The endpoint's episodes ready since the last iteration, as train items, and the counts of
        those taken, trained and left out."""
        if self.endpoint is None:
            return [], {}
        taken = ray.get(self.endpoint.take_ready.remote(iteration))
        batch = episode_batch(taken, keep_mixed=self.cfg.rollout.endpoint.train_mixed)
        trained = set(batch.episode_ids)
        self.consumed += [
            (f"episode/{e.id}", "episode" if e.id in trained else "episode_left_out") for e in taken
        ]
        counts = {
            "episodes": len(taken),
            "episodes_trained": len(batch.items),
            "episodes_mixed_dropped": len(batch.mixed),
            "episodes_not_stitched": len(batch.not_stitched),
        }
        return batch.items, counts

    def run_iteration(self, iteration: int) -> IterationRecord:
        """One iteration, phase by phase; its spans are recorded as it goes. A pipelined job's
        (`schedule.mode: async`) runs until that step is committed, the next ones going on."""
        if self.pipeline is not None:
            rec = self.pipeline.run_until(iteration)
            self.consumed = self.pipeline.consumed.pop(iteration)
            return rec
        if self.agent is not None:
            return self.agent.run_iteration(iteration)
        start, phases = self.clock(), self.phases
        requests, references = self.request_samples(iteration)  # 1
        self._feed(it.Started(start, iteration, tuple(r.request_id for r in requests)))
        samples, outcomes = self.generate_and_verify(iteration, requests, references)  # 2
        judged = self._reward_episodes(outcomes)
        items, counts = self.assemble(phases.take(it.Update), samples, outcomes)  # 3
        episode_items, episode_counts = self.episodes(iteration)  # the endpoint's, if it runs
        episode_counts |= judged
        items = [*items, *episode_items]
        stats, version = self.train_and_publish(iteration, start, items)  # 4-6
        if bad := unjudgeable(outcomes):
            self.log(f"iteration {iteration}: {len(bad)} sample(s) cannot be judged, e.g. {bad[0].detail}")
        extra = self.record_extra(stats) | ({"endpoint": episode_counts} if self.endpoint is not None else {})
        return record_of(iteration, version, samples, outcomes, len(items), counts, stats.loss, extra)  # 7

    def train_and_publish(
        self, iteration: int, start: float, items: list[TrainItem]
    ) -> tuple[LossStats, int]:
        """Phases 4-6 as the core asks (update, publish, reload; the span closed), for single- and
        multi-turn iterations alike. The update's figures and the committed version."""
        phases = self.phases
        stats = self.update(iteration, items)  # 4
        self._feed(it.Updated(self.clock()))
        meta = self.publish(iteration, phases.take(it.Publish).version)  # 5
        self._feed(it.VersionPublished(self.clock(), meta.version))
        phases.take(it.Reload)
        self.reload(meta)  # 6
        self._feed(it.Reloaded(self.clock()))
        version = phases.take(it.Committed).version
        attrs = {"lane": "controller"}
        self.spans.append(
            Span(SpanKind.ITERATION, f"iter-{iteration}", start, self.clock(), iteration, attrs)
        )
        return stats, version

    def record_extra(self, stats: LossStats) -> dict[str, Any]:
        """What every iteration's record adds, in either mode: the pool's and the fleet's counts since
        the job started, the instances serving, and the update's importance weights."""
        return {
            "verifier_pool": asdict(self.verification.pool.counts),
            "fleet": asdict(self.fleet.counts),
            "serving": sorted(self.fleet.serving()),
            "importance": importance(stats, self.cfg.grpo),
            "skipped_steps": stats.skipped,
        }

    # -- evaluation, the trained policy and shutdown ----------------------------------------------

    def evaluate(self, problems: tuple[TaskProblem, ...] | list[TaskProblem]) -> EvalResult:
        """`rlsched.rl.evaluate`'s requests, spread over the serving instances, scored alike (a
        multi-turn job's: greedy episodes)."""
        if self.agent is not None:
            return self.agent.evaluate(problems)
        requests = eval_requests(
            self.tokenizer, self.template, problems, max_tokens=self.cfg.sampling.max_tokens
        )
        for _ in range(3):  # an instance that dies meanwhile is replaced, and the evaluation rerun
            if not self.fleet.serving():
                self.fleet.wait_serving()
            names = self.fleet.serving()
            refs = [
                self.fleet.handles[n].complete.remote(requests[i :: len(names)]) for i, n in enumerate(names)
            ]
            batches, dead = [], []
            for name, ref in zip(names, refs, strict=True):
                try:
                    batches.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    dead.append(name)
            if not dead:
                return score(problems, (s for batch in batches for s in batch), self.verifiers)
            for name in dead:
                self.fleet.died(name)
        raise RuntimeError("the held-out evaluation lost an instance three times in a row")

    def save_policy(self, out: Path) -> Path:
        """The latest published version as a checkpoint directory (`rlsched generate --checkpoint`),
        pulled from the weight service like any instance would."""
        latest = self.fleet.latest
        assert latest is not None
        with WeightClient(latest.address) as client:
            pulled = client.pull(latest.version, receiver="driver")
        source = inspect_checkpoint(self.cfg.model.checkpoint).path
        return write_checkpoint(source, bytes(pulled.blob), out, self.cfg.model.template)

    def weights_check(self) -> dict[str, Any]:
        """Whether every rank holds the latest published weights (its SHA-256 of the BF16 bytes) and
        every serving instance holds that version (each confirmed the same checksum when it loaded)."""
        latest = self.fleet.latest
        assert latest is not None
        versions = self.fleet.serving_versions()
        return {
            "version": latest.version,
            "sha256": latest.checksum,
            "ranks_agree": all(s == latest.checksum for s in self.group.checksums()),
            "instances": versions,
            "instances_at_latest": all(v == latest.version for v in versions.values()),
        }

    def shutdown(self) -> None:
        if self.endpoint is not None:
            ray.get(self.endpoint.stop.remote())
            ray.kill(self.endpoint)
        self.fleet.shutdown()
        self.verification.shutdown()
        self.group.shutdown()
        if self.agent is not None:
            self.agent.close()


def run_silently(cfg: JobConfig, iterations: int) -> JobController:
    """A job for benchmarks and validation: `iterations` iterations without output, its actors
    released afterwards; the controller's spans and estimator stay readable."""
    controller = JobController(cfg, log=lambda _: None)
    try:
        for n in range(1, iterations + 1):
            controller.run_iteration(n)
    finally:
        controller.shutdown()
    return controller
