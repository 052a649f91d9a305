"""What the HTTP layer generates through: token ids in, each sampled token and then the finished
sample out, on the server's asyncio loop.

`LocalEngine` runs a torch engine in this process through a `StreamServer`
(`rlsched.engine.stream_server`): requests join the running batch between two decoding steps
(continuous batching), lowest `priority` first, and each request reads its own queue. A request whose
client went away is withdrawn, or aborted between two steps if it already runs, freeing its row.
`VllmEngine` hands each request to vLLM's `AsyncLLM`. `actors.endpoint.FleetBackend` routes each
request to a rollout instance of the Ray fleet. `pin` asks for the weight version an episode began
on; a backend with one engine has one version.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, TokenEvent
from rlsched.engine.stream_server import Event, StreamServer
from rlsched.engine.torch_engine import TorchRolloutEngine

if TYPE_CHECKING:
    from rlsched.engine.vllm import VllmRolloutEngine

log = logging.getLogger(__name__)


class Backend(Protocol):
    @property
    def context_length(self) -> int: ...

    @property
    def waiting(self) -> int:
        """Requests submitted that no engine row has taken yet."""
        ...

    @property
    def running(self) -> int: ...

    @property
    def backlog(self) -> int:
        """Requests waiting beyond the rows that are free (those the next step admits)."""
        ...

    def submit(
        self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event], pin: int | None = None
    ) -> None:
        """Queue `req`, on an instance holding weight version `pin` where the backend can (an
        episode's later turns); its tokens (lists of events), then its `Sample` (or an exception)
        arrive on `events`, which several requests may share (a request's `n` choices). Call on the
        server's loop; raises `RequestRejected` for a request the engine cannot run, `EngineStopped`
        when nothing can serve it."""
        ...

    def cancel(self, request_id: RequestId) -> None:
        """The client went away: withdraw or abort the request (its queue sees the sample, ABORT)."""
        ...

    def close(self) -> None: ...


class LocalEngine:
    """A torch engine served from a thread of this process (`rlsched serve --in-process`, the tests):
    a `StreamServer` whose events hop onto the server's loop, one `call_soon_threadsafe` each."""

    def __init__(self, engine: TorchRolloutEngine) -> None:
        self.engine = engine
        self._server = StreamServer(engine)

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def waiting(self) -> int:
        return self._server.waiting

    @property
    def running(self) -> int:
        return self._server.running

    @property
    def backlog(self) -> int:
        return self._server.backlog

    def submit(
        self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event], pin: int | None = None
    ) -> None:
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._server.submit(req, priority, deliver)

    def cancel(self, request_id: RequestId) -> None:
        self._server.cancel(request_id)  # a withdrawn request's `Withdrawn` reaches a run that has left

    def close(self) -> None:
        self._server.close()


class VllmEngine:
    """A vLLM engine in this process: each request goes to `AsyncLLM` on the engine's own loop
    (`VllmRolloutEngine.stream`), with its `priority`; vLLM batches and schedules them. A request
    counts as waiting until its first token."""

    def __init__(self, engine: VllmRolloutEngine) -> None:
        self.engine = engine
        self._queues: dict[RequestId, asyncio.Queue[Event]] = {}
        self._started: set[RequestId] = set()

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def waiting(self) -> int:
        return len(self._queues) - len(self._started)

    @property
    def running(self) -> int:
        return len(self._started)

    @property
    def backlog(self) -> int:
        return max(0, self.waiting - (self.engine.max_batch - self.running))

    def submit(
        self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event], pin: int | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        self.engine.check(req)
        self._queues[req.request_id] = events
        rid = req.request_id
        self.engine.stream(
            req,
            priority,
            lambda evs: loop.call_soon_threadsafe(self._tokens, rid, evs),
            lambda out: loop.call_soon_threadsafe(self._done, rid, out),
        )

    def cancel(self, request_id: RequestId) -> None:
        if self._queues.pop(request_id, None) is not None:
            self._started.discard(request_id)
            self.engine.abort(request_id)

    def close(self) -> None:
        self.engine.shutdown()

    def _tokens(self, rid: RequestId, events: list[TokenEvent]) -> None:
        queue = self._queues.get(rid)
        if queue is not None:
            self._started.add(rid)
            queue.put_nowait(events)

    def _done(self, rid: RequestId, out: Sample | BaseException) -> None:
        self._started.discard(rid)
        queue = self._queues.pop(rid, None)
        if queue is not None:
            queue.put_nowait(out)
