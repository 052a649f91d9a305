"""The rollout instance as a Ray actor: `rlsched.rollout.instance.Instance` (the engine, the
lifecycle, the weight pulls, the saved partial outputs) with its methods put in concurrency groups, so
that status, the endpoint's cancel and the endpoint's streams never wait behind a join or a batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import ray

from rlsched.engine.protocol import GenerationRequest, Sample
from rlsched.engine.stream_server import Event
from rlsched.rl.agent import AgentSpec
from rlsched.rl.episode_runs import EpisodeRun, EpisodeTask
from rlsched.rollout import instance

STREAMS = 256  # routes and endpoint requests one instance streams at once (each holds a thread)


class Instance(instance.Instance):  # named as before: `ray::Instance` is its processes' title
    # the overrides only put methods in groups; ray.method's stubs type each as a remote method

    @ray.method(concurrency_group="control")
    def status(self) -> tuple[str, int, int]:  # type: ignore[override]
        return super().status()

    @ray.method(concurrency_group="control")
    def describe(self) -> tuple[int, int]:  # type: ignore[override]
        return super().describe()

    @ray.method(num_returns="streaming", concurrency_group="stream")
    def generate(  # type: ignore[override]
        self, requests: Sequence[GenerationRequest], attempt: int = 1, refill: str = "batch"
    ) -> Iterator[Sample]:
        yield from super().generate(requests, attempt, refill)

    @ray.method(num_returns="streaming", concurrency_group="stream")
    def mux(self, reader: str) -> Iterator[list[tuple[str, Event]]]:  # type: ignore[override]
        yield from super().mux(reader)

    @ray.method(concurrency_group="control")
    def submit_stream(self, request: GenerationRequest, priority: int, reader: str) -> None:  # type: ignore[override]
        super().submit_stream(request, priority, reader)

    @ray.method(num_returns="streaming", concurrency_group="stream")
    def episodes(self, spec: AgentSpec, tasks: Sequence[EpisodeTask]) -> Iterator[EpisodeRun]:  # type: ignore[override]
        yield from super().episodes(spec, tasks)

    @ray.method(concurrency_group="control")
    def streams(self) -> tuple[int, int]:  # type: ignore[override]
        return super().streams()

    @ray.method(concurrency_group="control")
    def cancel(self, request_id: str) -> None:  # type: ignore[override]
        super().cancel(request_id)


# one thread joins, the other answers abort and drain; status and the endpoint's requests and cancels
# never wait behind a join; each route of the job's requests (or episodes) streams on a thread of its
# own, and each endpoint's requests on one thread for all of them (`mux`)
RolloutInstance = ray.remote(max_concurrency=2, concurrency_groups={"control": 2, "stream": STREAMS})(
    Instance
)
