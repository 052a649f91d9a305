"""A multi-turn job's episodes on the rollout fleet: each serving instance is handed a share of the
batch's groups and runs them to their end on its own engine (`Instance.run_episodes`: the turns on
its engine, the tools sandboxed on its node, each round journaled in the run's `rounds.sqlite`).

An instance whose actor dies has its groups handed again to one that serves (the fleet replaces the
dead one, as for any reclaimed instance); there each episode resumes from its last committed round,
so a tool call that ran is not run again. Groups wait for an instance that has none under way: one
instance runs one share at a time, on its one engine.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from actors.fleet import Fleet
from actors.interrupt import ctrl_c
from actors.pool import step
from actors.records import IterationRecord, generate_attrs, record_of
from rlsched.core import iteration as it
from rlsched.engine.protocol import FinishReason, RequestId, Sample, SamplingParams, WeightVersion
from rlsched.metrics.spans import Span, SpanKind
from rlsched.rl import episode_runs as er
from rlsched.rl.agent import AgentSpec
from rlsched.rl.episode_runs import EpisodeRun
from rlsched.rl.evaluate import EvalResult, score
from rlsched.rl.task import TaskProblem
from rlsched.store.round_journal import RoundJournal
from verifiers.protocol import Outcome, Verdict
from verifiers.sandbox import sweep_orphans

if TYPE_CHECKING:
    from actors.controller import JobController


@dataclass
class _Share:
    name: str
    places: list[int]
    ref: Any


class FleetEpisodes:
    def __init__(self, fleet: Fleet, spec: AgentSpec, log: Callable[[str], None] = print) -> None:
        self.fleet, self.spec, self.log = fleet, spec, log
        self._problems: list[TaskProblem] = []
        self._queue: deque[int] = deque()  # places of the groups no instance runs
        self._shares: list[_Share] = []
        self._prefix, self._group_size = "", 1
        self._params: SamplingParams | None = None
        self.handed_again = 0  # groups whose instance died under them, since the job started

    def begin(
        self, prefix: str, problems: list[TaskProblem], group_size: int, params: SamplingParams | None = None
    ) -> None:
        """A batch: `group_size` episodes of each problem, ids `PREFIX-PLACE-MEMBER`."""
        self._prefix, self._problems, self._group_size, self._params = prefix, problems, group_size, params
        self._queue = deque(range(len(problems)))
        self.pump()

    @property
    def done(self) -> bool:
        return not self._queue and not self._shares

    def pump(self) -> None:
        """Hand the waiting groups to the serving instances that run none, in even shares."""
        busy = {s.name for s in self._shares}
        idle = [n for n in self.fleet.serving() if n not in busy]
        if not self._queue or not idle:
            return
        size = math.ceil(len(self._queue) / len(idle))
        for name in idle:
            places = [self._queue.popleft() for _ in range(min(size, len(self._queue)))]
            if not places:
                break
            ref = self.fleet.handles[name].run_episodes.remote(
                self.spec, [self._problems[p] for p in places], places, self._group_size, self._prefix,
                self._params,
            )  # fmt: skip
            self._shares.append(_Share(name, places, ref))

    def waitables(self) -> list[Any]:
        return [s.ref for s in self._shares]

    def owns(self, ref: Any) -> bool:
        return any(s.ref is ref for s in self._shares)

    def on_ready(self, ref: Any) -> list[EpisodeRun]:
        """A share's episodes, ended; none where its instance died (its groups wait for another)."""
        share = next(s for s in self._shares if s.ref is ref)
        self._shares.remove(share)
        try:
            runs: list[EpisodeRun] = ray.get(ref)
        except ray.exceptions.RayActorError:
            self.log(
                f"{share.name} died running {len(share.places)} group(s) of episodes: handed to another "
                "instance, each resuming from its last committed round"
            )
            self.fleet.died(share.name)
            self._queue.extend(share.places)
            self.handed_again += len(share.places)
            runs = []
        self.pump()
        return runs


class AgentIterations:
    """A multi-turn job's iteration and evaluation, over the controller's fleet, verifiers, iteration
    core and training group (the controller's `run_iteration` and `evaluate` hand over to these):

    1. the batch's groups run on the fleet (`FleetEpisodes`);
    2. each ended episode is one of the core's samples: its final answer goes to the verifier pool
       when the core says, as a single turn's would; an episode whose environment failed past its
       retries is an execution fault, judged without a verifier and never trained;
    3. the update trains whole episodes (`rlsched.rl.agent.train_items`), observations masked;
    4-6. publish and reload as for any job; the journal lets go of the iterations committed before.
    """

    def __init__(self, ctl: JobController, spec: AgentSpec, fresh: bool) -> None:
        self.ctl = ctl
        self.episodes = FleetEpisodes(ctl.fleet, spec, ctl.log)
        self.journal = RoundJournal(Path(spec.journal)) if spec.journal is not None else None
        if self.journal is not None and fresh:
            self.journal.reset()  # nothing of an earlier run in this directory carries over
        self.last_stats: dict[str, Any] = {}

    def run_iteration(self, iteration: int) -> IterationRecord:
        ctl, start = self.ctl, self.ctl.clock()
        if self.journal is not None:
            self.journal.forget_before(iteration)  # their records are committed
        drawn = [ctl._next_problem() for _ in range(ctl.cfg.grpo.prompts_per_step)]
        problems, prefix, k = [p for _, p in drawn], str(iteration), ctl.cfg.grpo.group_size
        ids = tuple(f"{prefix}-{i}-{m}" for i in range(len(problems)) for m in range(k))
        ctl._feed(it.Started(start, iteration, ids))
        self.episodes.begin(prefix, problems, k)
        runs, outcomes = self._episodes_and_verify(iteration, start)
        for run in runs.values():
            outcome = outcomes.get(RequestId(run.episode.id))
            run.episode.reward = outcome.reward if isinstance(outcome, Verdict) else None
        ctl.phases.take(it.Update)
        batch = er.train_batch(list(runs.values()), ctl.cfg.agent.train_truncated)
        items, trained = batch.items, set(batch.episode_ids)
        ctl.consumed = [(r, "used" if r in trained else "left_out") for r in ids]
        stats, version = ctl.train_and_publish(iteration, start, items)  # 4-6
        summary = er.stats(list(runs.values()))
        self.last_stats = asdict(summary) | {"handed_again": self.episodes.handed_again}
        counts = {"faults": summary.faults, "stale_dropped": 0}
        samples = {RequestId(r.episode.id): episode_sample(r) for r in runs.values()}
        extra = ctl.record_extra(stats) | {"episodes": self.last_stats}
        return record_of(iteration, version, samples, outcomes, len(items), counts, stats.loss, extra)

    def _episodes_and_verify(
        self, iteration: int, start: float
    ) -> tuple[dict[str, EpisodeRun], dict[RequestId, Outcome]]:
        """Until the core has every episode in and judged (the controller's generate-and-verify loop,
        with shares of episodes where it waits on generation streams)."""
        ctl, fleet, verification = self.ctl, self.ctl.fleet, self.ctl.verification
        runs: dict[str, EpisodeRun] = {}
        outcomes: dict[RequestId, Outcome] = {}

        def on_ready(ref: Any) -> None:
            if not self.episodes.owns(ref):
                fleet.on_ready(ref)  # a replacement instance's join
                self.episodes.pump()
                return
            for run in self.episodes.on_ready(ref):
                runs[run.episode.id] = run
                self._arrived(iteration, run, start)

        while ctl._judged(outcomes):
            ctrl_c.check()
            ctl.orders.poll()
            fleet.tick()
            verification.dispatch(ctl.core.batch_state())
            others = [*self.episodes.waitables(), *fleet.waitables()]
            if not others and verification.idle:
                time.sleep(0.05)
                self.episodes.pump()
                continue
            step(verification.pools, others, on_ready, timeout_s=0.5)
        return runs, outcomes

    def _arrived(self, iteration: int, run: EpisodeRun, start: float) -> None:
        ctl, rid, now = self.ctl, RequestId(run.episode.id), self.ctl.clock()
        sample = episode_sample(run)
        attrs = generate_attrs("episodes", sample) | {"turns": run.turns, "tool_calls": run.tool_calls}
        ctl.spans.append(Span(SpanKind.GENERATE, rid, start, now, iteration, attrs))
        if run.fault is not None:  # judged now, by no verifier: a fault, never a zero reward
            ctl.faulted[rid] = er.fault_outcome(run)
        else:
            ctl.verification.arrived(sample, run.problem, iteration, ctl.core.batch_id)
        ctl._feed(it.SampleArrived(now, rid, min(run.episode.versions, default=ctl.version)))

    def close(self) -> None:
        """The job is over: its journal closed, and what killed instances left on this machine swept
        (`verifiers.sandbox.sweep_orphans`; an instance that starts on a node sweeps it too)."""
        if self.journal is not None:
            self.journal.close()
        if swept := sweep_orphans():
            self.ctl.log(f"removed {len(swept)} sandbox director(ies) that killed processes left")

    def evaluate(self, problems: Sequence[TaskProblem]) -> EvalResult:
        """Greedy episodes on the held-out problems, spread over the fleet, their final answers scored
        (an episode whose environment failed counts as not passed)."""
        ctl = self.ctl
        greedy = dataclasses.replace(ctl.sampling, temperature=0.0)
        self.episodes.begin("eval", list(problems), 1, greedy)
        runs: list[EpisodeRun] = []
        while not self.episodes.done:
            ctrl_c.check()
            others = [*self.episodes.waitables(), *ctl.fleet.waitables()]
            if not others:
                ctl.fleet.wait_serving()
                self.episodes.pump()
                continue
            ready, _ = ray.wait(others, num_returns=1, timeout=1.0)
            for ref in ready:
                if self.episodes.owns(ref):
                    runs += self.episodes.on_ready(ref)
                else:
                    ctl.fleet.on_ready(ref)
                    self.episodes.pump()
        samples = [
            dataclasses.replace(episode_sample(r), request_id=RequestId(r.episode.id.split("-")[1]))
            for r in runs
        ]
        return score(problems, samples, ctl.verifiers)


def episode_sample(run: EpisodeRun) -> Sample:
    """An ended episode as the sample its verifier judges: its final reply (an episode that never
    replied, e.g. a fault, has none)."""
    last = run.episode.turns[-1] if run.episode.turns else None
    tokens = last.token_ids if last is not None else ()
    logprobs = last.logprobs if last is not None else ()
    version = last.weight_version if last is not None else 0
    text = run.answer if run.fault is None else ""
    return Sample(
        RequestId(run.episode.id), (), tuple(tokens), tuple(logprobs), text, FinishReason.STOP,
        WeightVersion(version),
    )  # fmt: skip
