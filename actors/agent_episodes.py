"""A multi-turn job's episodes on the rollout fleet. A wave's episodes are the fleet core's requests like
any single-turn job's: it routes them (`rlsched.core.fleet`: refilled slot by slot or batch by batch,
held off an instance due to reload, handed again when an instance is reclaimed), and each route is a
streaming `episodes` call on its instance, whose one loop of rounds runs every episode routed there
(`rlsched.rl.episode_server`: the turns on its engine, the tools sandboxed on its node, each round
journaled in the run's `rounds.sqlite`). An episode comes back as it ends.

An instance whose actor dies has its episodes routed again, to one that serves (the fleet replaces
the dead one, as for any reclaimed instance); there each resumes from its last committed round, so a
tool call that ran is not run again.

An evaluation's greedy episodes (`FleetEpisodes`) are spread over the serving instances in even
shares, as a single-turn evaluation's requests are (`actors.controller`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray

from actors.fleet import Fleet
from rlsched.config import JobConfig
from rlsched.core import fleet_io as fx
from rlsched.core import iteration as it
from rlsched.engine.protocol import FinishReason, RequestId, Sample, SamplingParams, WeightVersion
from rlsched.job.arrivals import Arrival, Batch
from rlsched.job.interrupt import ctrl_c
from rlsched.job.records import generate_attrs
from rlsched.rl import episode_runs as er
from rlsched.rl.agent import AgentSpec
from rlsched.rl.episode_runs import EpisodeRun, EpisodeTask, group_tasks
from rlsched.rl.evaluate import EvalResult, score
from rlsched.rl.feed import ProblemFeed
from rlsched.rl.task import TaskProblem
from rlsched.store.round_journal import RoundJournal
from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, Verdict
from verifiers.sandbox import sweep_orphans


@dataclass
class _Share:
    name: str
    places: list[int]
    ref: Any


class FleetEpisodes:
    """An evaluation's episodes: the groups in even shares over the serving instances, each share one
    `run_episodes` call; a share whose instance dies goes to another."""

    def __init__(self, fleet: Fleet, spec: AgentSpec, log: Callable[[str], None] = print) -> None:
        self.fleet, self.spec, self.log = fleet, spec, log
        self._problems: list[TaskProblem] = []
        self._queue: deque[int] = deque()  # places of the groups no instance runs
        self._shares: list[_Share] = []
        self._prefix, self._group_size = "", 1
        self._params: SamplingParams | None = None

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
            runs = []
        self.pump()
        return runs


class Episodes:
    """A multi-turn job's producer of arrivals (`rlsched.job.arrivals.Producer`) for the iteration's driver:

    1. a wave's `group_size` episodes of each problem are the fleet core's requests, each route of
       them an `episodes` call on its instance;
    2. each ended episode arrives as the sample its verifier judges (its final answer), carrying the
       oldest version of its turns; one whose environment failed past its retries arrives judged, an
       execution fault, never trained;
    3. the update trains whole episodes (`rlsched.rl.episode_runs.train_batch`), observations masked;
       the journal lets go of the rounds of iterations committed before the wave.
    """

    def __init__(
        self, cfg: JobConfig, feed: ProblemFeed, fleet: Fleet, spec: AgentSpec, log: Callable[[str], None],
        fresh: bool,
    ) -> None:  # fmt: skip
        self.cfg, self.feed, self.fleet, self.spec, self.log = cfg, feed, fleet, spec, log
        self.evaluation = FleetEpisodes(fleet, spec, log)
        self.journal = RoundJournal(Path(spec.journal)) if spec.journal is not None else None
        if self.journal is not None and fresh:
            self.journal.reset()  # nothing of an earlier run in this directory carries over
        self.tasks: dict[str, EpisodeTask] = {}  # the waves' episodes not yet arrived
        self.runs: dict[str, EpisodeRun] = {}
        self.last_stats: dict[str, Any] = {}
        fleet.route_other = self._route

    @property
    def handed_again(self) -> int:
        """Episodes routed again since the job started, their instance having died under them."""
        return self.fleet.counts.resumed + self.fleet.counts.restarted

    def begin(self, wave: int, prefix: str) -> tuple[str, ...]:
        if self.journal is not None:
            self.journal.forget_before(wave)  # their records are committed
        problems = [self.feed.next()[1] for _ in range(self.cfg.grpo.prompts_per_step)]
        tasks = group_tasks(problems, self.cfg.grpo.group_size, prefix)
        self.tasks.update((t.episode_id, t) for t in tasks)
        self.fleet.begin(wave, [fx.RequestSpec(t.episode_id, t.group_id, 0) for t in tasks])
        return tuple(t.episode_id for t in tasks)

    def _route(self, e: fx.Route) -> None:
        self.fleet.instances.episodes(e.name, e.dispatch, self.spec, [self.tasks[r] for r in e.requests])

    def waitables(self) -> list[Any]:
        return []  # the fleet's streams: the driver waits on the fleet's waitables anyway

    def on_ready(self, ref: Any) -> list[Arrival]:
        again = self.handed_again
        self.fleet.on_ready(ref)
        if self.handed_again > again:
            self.log(
                f"{self.handed_again - again} episode(s) routed again, their instance having died under "
                "them: each resumes from its last committed round"
            )
        arrived, self.fleet.episodes = self.fleet.episodes, []
        out = []
        for lane, run in arrived:
            self.tasks.pop(run.episode.id, None)
            self.runs[run.episode.id] = run
            sample = episode_sample(run)
            versions = run.episode.versions  # its turns': the oldest counts, as a sample's oldest token
            attrs = generate_attrs(lane, sample) | {
                "turns": run.turns, "tool_calls": run.tool_calls, "versions": versions,
            }  # fmt: skip
            fault = er.fault_outcome(run) if run.fault is not None else None
            version = min(versions, default=None)  # none: a fault before its first turn
            out.append(Arrival(lane, sample, run.problem, version, attrs, fault))
        return out

    def idle(self) -> None:
        return None

    def batch(
        self, update: it.Update, samples: dict[RequestId, Sample], outcomes: dict[RequestId, Outcome]
    ) -> Batch:
        runs = [self.runs.pop(r) for r in update.request_ids if r in self.runs]
        for run in runs:
            outcome = outcomes.get(RequestId(run.episode.id))
            run.episode.reward = outcome.reward if isinstance(outcome, Verdict) else None
        batch = er.train_batch(runs, self.cfg.agent.train_truncated)
        summary = er.stats(runs)
        self.last_stats = asdict(summary) | {"handed_again": self.handed_again}
        counts = {"faults": summary.faults, "stale_dropped": 0}
        batch_samples = {RequestId(r.episode.id): samples[RequestId(r.episode.id)] for r in runs}
        return Batch(
            batch.items, set(batch.episode_ids), counts, batch_samples, {"episodes": self.last_stats}
        )

    def forget(self, rid: str) -> None:
        self.runs.pop(rid, None)
        self.tasks.pop(rid, None)

    def close(self) -> None:
        """The job is over: its journal closed, and what killed instances left on this machine swept
        (`verifiers.sandbox.sweep_orphans`; an instance that starts on a node sweeps it too)."""
        if self.journal is not None:
            self.journal.close()
        if swept := sweep_orphans():
            self.log(f"removed {len(swept)} sandbox director(ies) that killed processes left")

    def evaluate(
        self, problems: Sequence[TaskProblem], sampling: SamplingParams, verifiers: VerifierSet
    ) -> EvalResult:
        """Greedy episodes on the held-out problems, spread over the fleet, their final answers scored
        (an episode whose environment failed counts as not passed)."""
        greedy = dataclasses.replace(sampling, temperature=0.0)
        self.evaluation.begin("eval", list(problems), 1, greedy)
        runs: list[EpisodeRun] = []
        while not self.evaluation.done:
            ctrl_c.check()
            others = [*self.evaluation.waitables(), *self.fleet.waitables()]
            if not others:
                self.fleet.wait_serving()
                self.evaluation.pump()
                continue
            ready, _ = ray.wait(others, num_returns=1, timeout=1.0)
            for ref in ready:
                if self.evaluation.owns(ref):
                    runs += self.evaluation.on_ready(ref)
                else:
                    self.fleet.on_ready(ref)
                    self.evaluation.pump()
        samples = [
            dataclasses.replace(episode_sample(r), request_id=RequestId(r.episode.id.split("-")[1]))
            for r in runs
        ]
        return score(problems, samples, verifiers)


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
