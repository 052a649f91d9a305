"""What produces a job's samples, as the iteration's driver (`rlsched.job.iterations`) sees it: one port
for single-turn samples and multi-turn episodes alike.

A producer starts a wave (`begin`: its request ids, group by group), turns what its calls
return into arrivals (`on_ready`), each carrying the oldest version of its tokens (staleness counts
from it), and, when the core asks for an update, makes the training batch of the samples it names
(`batch`). `Requests` here is the single-turn one: the job's generation requests on the rollout
fleet's streams. The multi-turn one, `actors.agent_episodes.Episodes`, runs whole episodes on the
instances and is a producer like this one, not a second loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlsched.config import JobConfig
from rlsched.core import iteration as it
from rlsched.engine.protocol import RequestId, Sample, SamplingParams
from rlsched.job.ports import FleetPort
from rlsched.job.records import generate_attrs
from rlsched.job.verification import JobVerification
from rlsched.model.template import PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.policy.verify import DispatchPolicy, generation_order
from rlsched.rl.assemble import assemble
from rlsched.rl.feed import ProblemFeed
from rlsched.rl.requests import group_of, group_requests, run_seed_for_requests
from rlsched.rl.task import TaskProblem
from rlsched.rl.update import TrainItem
from verifiers.protocol import Outcome


@dataclass(frozen=True)
class Arrival:
    """A sample (or an ended episode, as the sample its verifier judges) that has just come in."""

    lane: str  # what produced it: an instance's name, or "episodes"
    sample: Sample
    problem: TaskProblem
    version: int | None  # the oldest version of its tokens (None: it has none; the newest counts)
    attrs: dict[str, Any]  # its generate span's
    fault: Outcome | None = None  # judged already, by no verifier (an episode whose environment failed)


@dataclass
class Batch:
    """An update's training batch: its items, the request ids they came from, the record's counts
    (faults, stale_dropped) and what the record adds; `samples`: the batch's, as the record counts them."""

    items: list[TrainItem]
    used: set[str]
    counts: dict[str, int]
    samples: dict[RequestId, Sample]
    extra: dict[str, Any] = field(default_factory=dict)


class Producer(Protocol):
    def begin(self, wave: int, prefix: str) -> tuple[str, ...]: ...

    def waitables(self) -> list[Any]: ...

    def on_ready(self, ref: Any) -> list[Arrival]: ...

    def idle(self) -> None: ...

    def batch(
        self, update: it.Update, samples: dict[RequestId, Sample], outcomes: dict[RequestId, Outcome]
    ) -> Batch: ...

    def forget(self, rid: str) -> None: ...


class Requests:
    """Single-turn: `prompts_per_step` problems a wave, `group_size` requests each, queued for the
    fleet (under `distrs` with `order_generation`, the longest expected verification first)."""

    def __init__(
        self,
        cfg: JobConfig,
        feed: ProblemFeed,
        fleet: FleetPort,
        verification: JobVerification[Any],
        prompting: tuple[Tokenizer, PromptFormat],
        sampling: SamplingParams,
    ) -> None:
        self.cfg, self.feed, self.fleet, self.verification = cfg, feed, fleet, verification
        self.tokenizer, self.template = prompting
        self.sampling = sampling
        self.references: dict[RequestId, TaskProblem] = {}
        self.position_of: dict[str, int] = {}  # a group in flight: its problem's place in the data

    def begin(self, wave: int, prefix: str) -> tuple[str, ...]:
        drawn = [self.feed.next() for _ in range(self.cfg.grpo.prompts_per_step)]
        v = self.cfg.verifier
        if v.dispatch is DispatchPolicy.DISTRS and v.order_generation:  # longest verification first
            kinds = [self.verification.kind_key(p) for _, p in drawn]
            drawn = [drawn[i] for i in generation_order(kinds, self.verification.estimators)]
        self.position_of.update((f"{prefix}-{i}", position) for i, (position, _) in enumerate(drawn))
        requests, references = group_requests(
            [p for _, p in drawn], self.cfg.grpo.group_size, prefix, self.tokenizer, self.template,
            self.sampling, run_seed_for_requests(self.cfg),
        )  # fmt: skip
        self.references.update(references)
        self.fleet.begin(wave, requests)
        return tuple(r.request_id for r in requests)

    def waitables(self) -> list[Any]:
        return []  # the fleet's streams: the driver waits on the fleet's waitables anyway

    def on_ready(self, ref: Any) -> list[Arrival]:
        out = []
        for lane, sample in self.fleet.on_ready(ref):
            problem = self.references.get(sample.request_id)
            if problem is None:  # not one of this run's (a recovery abandoned it)
                continue
            out.append(Arrival(lane, sample, problem, sample.oldest_version, generate_attrs(lane, sample)))
        return out

    def idle(self) -> None:
        return None

    def batch(
        self, update: it.Update, samples: dict[RequestId, Sample], outcomes: dict[RequestId, Outcome]
    ) -> Batch:
        """Fully judged groups whose samples all come from an allowed version (`rlsched.rl.assemble`)."""
        ids = [RequestId(r) for r in update.request_ids if RequestId(r) in samples]  # not episodes
        b = assemble(ids, samples, outcomes, self.cfg.grpo.group_size, update.oldest)
        counts = {"faults": b.faults, "stale_dropped": b.stale_dropped}
        return Batch(b.items, set(b.used), counts, {r: samples[r] for r in ids})

    def forget(self, rid: str) -> None:
        self.references.pop(RequestId(rid), None)
        self.position_of.pop(group_of(rid), None)
