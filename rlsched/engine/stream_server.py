"""A torch engine serving streams: requests arrive at any time, each one's tokens leave as sampled.

One thread drives `TorchRolloutEngine.serve` over an open `Intake`, so requests join the running
batch between two decoding steps (continuous batching), lowest `priority` first. Each request names
a `deliver` callback, called on the engine's thread with each step's tokens for it (a list of
`TokenEvent`), then its `Sample`; an exception instead if the serving loop fails. A request withdrawn
before it ran gets `Withdrawn`; one aborted while running finishes at the next step (ABORT).

Both places that serve one request at a time use it: the endpoint's in-process backend
(`rlsched.serve.backend.LocalEngine`, which hops each event onto its asyncio loop) and a rollout
instance's streaming method (`actors.rollout`, which yields each event to the endpoint over Ray).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

from rlsched.engine.intake import Intake, IntakeClosed
from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, TokenEvent
from rlsched.engine.torch_engine import TorchRolloutEngine

log = logging.getLogger(__name__)

Event = list[TokenEvent] | Sample | BaseException
Deliver = Callable[[Event], None]


class EngineStopped(RuntimeError):
    """The engine's serving loop failed or was closed: nothing more can be generated (503)."""


class Withdrawn(Exception):
    """The request was withdrawn before an engine row took it: nothing was generated."""


class StreamServer:
    def __init__(self, engine: TorchRolloutEngine) -> None:
        self.engine = engine
        self._intake = Intake()
        self._deliver: dict[RequestId, Deliver] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def waiting(self) -> int:
        """Requests submitted that no engine row has taken yet."""
        return len(self._intake)

    @property
    def running(self) -> int:
        return len(self._deliver) - len(self._intake)

    @property
    def backlog(self) -> int:
        """Requests waiting beyond the rows that are free (those the next step admits)."""
        return max(0, self.waiting - (self.engine.max_batch - self.running))

    def submit(self, req: GenerationRequest, priority: int, deliver: Deliver) -> None:
        """Queue `req`; raises `RequestRejected` for one the engine cannot run, `EngineStopped`
        once the serving loop has failed or been closed."""
        if self._failed is not None:
            raise EngineStopped(f"the engine stopped: {self._failed}")
        self.engine.check(req)
        with self._lock:
            self._deliver[req.request_id] = deliver
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
                self._thread.start()
        try:
            self._intake.put(req, priority)
        except IntakeClosed as err:
            with self._lock:
                del self._deliver[req.request_id]
            raise EngineStopped(str(err)) from None

    def cancel(self, request_id: RequestId) -> None:
        """Withdraw `request_id` (it gets `Withdrawn`), or abort it if it runs (its sample: ABORT)."""
        if self._intake.remove(request_id):
            with self._lock:
                deliver = self._deliver.pop(request_id, None)
            if deliver is not None:
                deliver(Withdrawn(request_id))
        elif request_id in self._deliver:
            self.engine.abort(request_id)

    def close(self) -> None:
        self._intake.close()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            for sample in self.engine.serve(self._intake, self._on_tokens):
                with self._lock:
                    deliver = self._deliver.pop(sample.request_id, None)
                if deliver is not None:
                    deliver(sample)
        except BaseException as err:  # every waiting request is told, then it is logged
            log.exception("the engine's serving loop failed")
            self._failed = err
            with self._lock:
                delivers, self._deliver = self._deliver, {}
            for deliver in delivers.values():
                deliver(err)

    def _on_tokens(self, events: Sequence[TokenEvent]) -> None:
        by_request: dict[RequestId, list[TokenEvent]] = defaultdict(list)
        for ev in events:
            by_request[ev.request_id].append(ev)
        with self._lock:
            delivers = [(self._deliver.get(rid), evs) for rid, evs in by_request.items()]
        for deliver, evs in delivers:
            if deliver is not None:
                deliver(evs)
