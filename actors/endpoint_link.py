"""A job's side of the OpenAI endpoint (`actors.endpoint`) that serves its fleet
(`rollout.endpoint.enabled`): what the iteration's driver asks of it, as calls on its actor.

- While a wave generates, episodes its clients ended with a reference and no reward are offered to
  the batch (`to_judge`): the verifier pool judges their final answer like any sample, and `reward`
  sends the verdicts back.
- At each update, the episodes ended and rewarded since the last one join the batch (`take`).
- A reload leaves in place the instances the endpoint's open episodes are pinned to (`held`,
  `rlsched.policy.routing.hold_back`). The endpoint learns the fleet as its core has it on every join,
  pull, departure and reload (`push`): it reads no instance's state itself.
- Checkpoints and recoveries tell its journal which episodes are committed and which come back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from actors.fleet import Fleet
from rlsched.config import JobConfig
from rlsched.engine.protocol import RequestId, Sample
from rlsched.job.ports import VerificationPort
from rlsched.model.checkpoint import inspect_checkpoint
from rlsched.policy.routing import InstanceView, hold_back
from rlsched.policy.verify import BatchId
from rlsched.rl.episodes import endpoint_items, judgeable_sample, send_rewards
from rlsched.rl.task import JsonlProblem
from rlsched.rl.update import TrainItem
from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, client_reference_refusal


class EndpointLink:
    def __init__(
        self,
        cfg: JobConfig,
        fleet: Fleet,
        verifiers: VerifierSet,
        log: Callable[[str], None],
        out_dir: Path | None,
        resume_after: int | None,
    ) -> None:
        """The endpoint over the job's fleet, its address printed. Its episodes are journaled in the
        run's `episodes.sqlite`; a resumed run takes back those the crash left."""
        from actors.endpoint import EndpointActor

        self.cfg, self.fleet, self.log = cfg, fleet, log
        self._judging: dict[RequestId, str] = {}  # offered episodes the verifiers judge
        journal = str(out_dir / "episodes.sqlite") if out_dir is not None else None
        self.handle = EndpointActor.remote(  # type: ignore[attr-defined]
            self.members(), str(inspect_checkpoint(cfg.model.checkpoint).path), cfg.rollout.endpoint,
            max_staleness=cfg.rollout.max_staleness, latest=fleet.reloaded_to, template=cfg.model.template,
            journal=journal, resume_after=resume_after, rewards=verifiers.rewards,
            reference_refusal=client_reference_refusal(verifiers.get()),
        )  # fmt: skip
        if resume_after is not None and journal is not None:
            back = len(ray.get(self.handle.episodes.remote()))
            log(f"endpoint: {back} episode(s) of the earlier run taken back from {journal}")
        fleet.watchers.append(self.push)
        host, port, name, context = ray.get(self.handle.address.remote())
        log(
            f"endpoint: {name} at http://{host}:{port}/v1 over the rollout fleet (context {context} "
            "tokens); rewarded episodes join each iteration's batch (docs/endpoint.md)"
        )

    def to_judge(self) -> list[tuple[Sample, JsonlProblem]]:
        """Episodes ended with a reference and no reward, as samples for the verifiers to judge."""
        out = []
        for j in ray.get(self.handle.to_judge.remote()):
            sample, problem = judgeable_sample(j)
            self._judging[sample.request_id] = j.episode_id
            out.append((sample, problem))
        return out

    def offer(self, verification: VerificationPort, wave: int, batch: BatchId) -> tuple[tuple[str, int], ...]:
        """Hand the episodes to judge to the verifiers as wave `wave`'s samples (batch `batch`); each
        one's request id and oldest version, for the core's `Offered`."""
        offered = []
        for sample, problem in self.to_judge():
            verification.arrived(sample, problem, wave, batch)
            offered.append((str(sample.request_id), sample.oldest_version))
        return tuple(offered)

    def reward(self, outcomes: dict[RequestId, Outcome]) -> dict[str, int]:
        """The verifiers' rewards for the offered episodes, sent to the endpoint (their outcomes leave
        `outcomes`); one the verifier could not judge waits for the reward timeout."""

        def judged(episode_id: str, reward: float) -> None:
            ray.get(self.handle.judged.remote(episode_id, reward))

        return send_rewards(self._judging, outcomes, judged, self.log)

    def take(
        self, iteration: int, oldest: int
    ) -> tuple[list[TrainItem], list[tuple[str, str]], dict[str, int]]:
        """The episodes ready since the last iteration, as train items (`endpoint_items`: one older
        than the update's bound `oldest` is dropped as a sample would be)."""
        taken = ray.get(self.handle.take_ready.remote(iteration))
        return endpoint_items(taken, oldest, self.cfg.rollout.endpoint.train_mixed)

    def held(self, version: int) -> list[str]:
        """Instances a reload to `version` leaves in place for the endpoint's pinned episodes."""
        pins = ray.get(self.handle.pins.remote())
        views = [InstanceView(n, True, v) for n, v in self.fleet.serving_versions().items()]
        return sorted(hold_back(views, pins, version, self.cfg.rollout.max_staleness))

    def reloaded(self, version: int) -> None:
        """The fleet holds `version`: the endpoint routes to its instances at it."""
        self.push()

    def push(self) -> None:
        """The fleet as its core has it, to the endpoint (on every join, pull, departure and reload:
        the endpoint reads no instance's state itself)."""
        ray.get(self.handle.sync.remote(self.members(), self.fleet.reloaded_to))

    def members(self) -> dict[str, tuple[Any, str, int]]:
        """Every instance of the fleet not released, with its state and version, as the core has it."""
        live = self.fleet.snapshot()["instances"]
        return {
            n: (h, live[n]["state"], live[n]["version"])
            for n, h in self.fleet.handles.items()
            if self.fleet.core.live(n)
        }

    def checkpointed(self, iteration: int) -> None:
        ray.get(self.handle.checkpointed.remote(iteration))

    def restore(self, iteration: int) -> None:
        back = ray.get(self.handle.restore.remote(iteration))
        self.log(f"endpoint: {back} episode(s) taken by the iterations run again are back in its store")

    def stop(self) -> None:
        ray.get(self.handle.stop.remote())
        ray.kill(self.handle)
