"""`rlsched run --local`'s OpenAI endpoint: the same server and episode store a Ray job hosts
(`rlsched.serve.hosted`), over the loop's own engine instead of the fleet.

The server runs on a thread of this process. Its requests join the engine's batch loop in turn with
the wave's own generation (`rlsched.engine.turns`: one batch loop at a time on the engine's cache),
and keep being served while the policy trains; a new version is loaded between two decoding steps, so
a request that spans a publish records the version of each token, as on an instance that swaps in
flight. With one engine there is one version, so an episode's pin asks for nothing.

The loop meets the episodes as the Ray driver does (`rlsched.rl.episodes`): while a wave generates,
those ended with a reference and no reward are offered to the iteration core and judged by the job's
verifier like its own samples; at the update, those ended and rewarded join the batch, one older than
the update's bound dropped as a sample would be.
"""

from __future__ import annotations

from collections.abc import Callable

from rlsched.config import JobConfig
from rlsched.engine.protocol import RequestId, Sample
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import inspect_checkpoint
from rlsched.rl.episodes import endpoint_items, judgeable_sample, send_rewards
from rlsched.rl.task import JsonlProblem
from rlsched.rl.update import TrainItem
from rlsched.serve.backend import LocalEngine
from rlsched.serve.hosted import HostedEndpoint
from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, client_reference_refusal

Judge = Callable[[str, str, JsonlProblem], Outcome]


class LocalEndpoint:
    def __init__(
        self,
        cfg: JobConfig,
        engine: TorchRolloutEngine,
        verifiers: VerifierSet,
        log: Callable[[str], None],
    ) -> None:
        """The endpoint over `engine`, its address printed with `log`."""
        self.cfg, self.log = cfg, log
        self.host = HostedEndpoint(
            LocalEngine(engine), inspect_checkpoint(cfg.model.checkpoint).path, cfg.rollout.endpoint,
            template=cfg.model.template, rewards=verifiers.rewards,
            reference_refusal=client_reference_refusal(verifiers.get()),
        )  # fmt: skip
        self._judging: dict[RequestId, str] = {}  # offered: sample id -> episode id
        self._offered: dict[RequestId, tuple[Sample, JsonlProblem]] = {}
        host, port, name, context = self.host.address()
        log(
            f"endpoint: {name} at http://{host}:{port}/v1 over this process's engine (context {context} "
            "tokens); rewarded episodes join each iteration's batch (docs/endpoint.md)"
        )

    def offer(self) -> tuple[tuple[str, int], ...]:
        """The episodes ended with a reference and no reward, as samples to judge: each one's request
        id and oldest version, for the core's `Offered`."""
        offered = []
        for j in self.host.to_judge():
            sample, problem = judgeable_sample(j)
            self._judging[sample.request_id] = j.episode_id
            self._offered[sample.request_id] = (sample, problem)
            offered.append((str(sample.request_id), sample.oldest_version))
        return tuple(offered)

    def owns(self, request_id: str) -> bool:
        return RequestId(request_id) in self._offered

    def judge(self, request_id: str, judge: Judge) -> Outcome:
        """An offered episode's final answer judged by the job's verifier (`judge`)."""
        sample, problem = self._offered.pop(RequestId(request_id))
        return judge(request_id, sample.text, problem)

    def reward(self, outcomes: dict[RequestId, Outcome]) -> dict[str, int]:
        """The verdicts of the offered episodes sent to the store (their outcomes leave `outcomes`)."""
        return send_rewards(self._judging, outcomes, self.host.judged, self.log)

    def take(self, iteration: int, oldest: int) -> tuple[list[TrainItem], dict[str, int]]:
        """The episodes ready since the last update, as train items, and the counts of those taken,
        trained and left out (one older than `oldest`, the update's bound, dropped)."""
        taken = self.host.take_ready(iteration)
        items, _, counts = endpoint_items(taken, oldest, self.cfg.rollout.endpoint.train_mixed)
        return items, counts

    def stop(self) -> None:
        """Stop serving; the engine stays the loop's."""
        self.host.stop()
