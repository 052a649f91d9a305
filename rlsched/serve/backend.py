"""What the HTTP layer generates through: token ids in, each sampled token and then the finished
sample out, on the server's asyncio loop.

`LocalEngine` runs a torch engine in this process: one thread drives `TorchRolloutEngine.serve` over
an open `Intake`, so requests join the running batch between two decoding steps (continuous
batching), lowest `priority` first. The engine thread hands each step's tokens to the loop in one
`call_soon_threadsafe`, and each request reads its own queue. A request whose client went away is
withdrawn from the intake, or aborted between two steps if it already runs, freeing its row.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rlsched.engine.intake import Intake, IntakeClosed
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, TokenEvent
from rlsched.engine.torch_engine import TorchRolloutEngine

if TYPE_CHECKING:
    from rlsched.engine.vllm import VllmRolloutEngine

log = logging.getLogger(__name__)

Event = list[TokenEvent] | Sample | BaseException


class EngineStopped(RuntimeError):
    """The engine's serving loop failed or was closed: nothing more can be generated (503)."""


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

    def submit(self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event]) -> None:
        """Queue `req`; its tokens (lists of events), then its `Sample` (or an exception) arrive on
        `events`, which several requests may share (a request's `n` choices). Call on the server's
        loop; raises `RequestRejected` for a request the engine cannot run."""
        ...

    def cancel(self, request_id: RequestId) -> None:
        """The client went away: withdraw or abort the request (its queue sees the sample, ABORT)."""
        ...

    def close(self) -> None: ...


class LocalEngine:
    """A torch engine served from a thread of this process (`rlsched serve`, the tests)."""

    def __init__(self, engine: TorchRolloutEngine) -> None:
        self.engine = engine
        self._intake = Intake()
        self._queues: dict[RequestId, asyncio.Queue[Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def waiting(self) -> int:
        return len(self._intake)

    @property
    def running(self) -> int:
        return len(self._queues) - len(self._intake)

    @property
    def backlog(self) -> int:
        return max(0, self.waiting - (self.engine.max_batch - self.running))

    def submit(self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event]) -> None:
        if self._failed is not None:
            raise EngineStopped(f"the engine stopped: {self._failed}")
        self._start()
        self.engine.check(req)
        self._queues[req.request_id] = events
        try:
            self._intake.put(req, priority)
        except IntakeClosed as err:
            del self._queues[req.request_id]
            raise EngineStopped(str(err)) from None

    def cancel(self, request_id: RequestId) -> None:
        if self._queues.pop(request_id, None) is None:
            return
        if not self._intake.remove(request_id):
            self.engine.abort(request_id)  # running: it finishes (ABORT) at the next step

    def close(self) -> None:
        self._intake.close()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._loop is not None
        loop = self._loop
        try:
            for sample in self.engine.serve(self._intake, self._on_tokens):
                loop.call_soon_threadsafe(self._deliver_sample, sample)
        except BaseException as err:  # every waiting request is told, then it is logged
            log.exception("the engine's serving loop failed")
            self._failed = err
            loop.call_soon_threadsafe(self._fail_all, err)

    def _on_tokens(self, events: Sequence[TokenEvent]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver_tokens, list(events))

    # -- on the loop ------------------------------------------------------------------------------
    def _deliver_tokens(self, events: list[TokenEvent]) -> None:
        by_request: dict[RequestId, list[TokenEvent]] = defaultdict(list)
        for ev in events:
            by_request[ev.request_id].append(ev)
        for rid, evs in by_request.items():
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(evs)

    def _deliver_sample(self, sample: Sample) -> None:
        queue = self._queues.pop(sample.request_id, None)
        if queue is not None:
            queue.put_nowait(sample)

    def _fail_all(self, err: BaseException) -> None:
        queues, self._queues = self._queues, {}
        for queue in queues.values():
            queue.put_nowait(err)


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

    def submit(self, req: GenerationRequest, priority: int, events: asyncio.Queue[Event]) -> None:
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
