"""A torch engine serving streams: requests arrive at any time, each one's tokens leave as sampled.

One thread drives `TorchRolloutEngine.serve` over an open `Intake`, so requests join the running
batch between two decoding steps (continuous batching), lowest `priority` first. Each request names
a `deliver` callback, called on the engine's thread with each step's tokens for it (a list of
`TokenEvent`), then its `Sample`; an exception instead if the serving loop fails while it runs. A
request withdrawn before it ran gets `Withdrawn`; one aborted while running finishes at the next step
(ABORT). Bad input never stops the engine: what a request carries is checked when it is submitted
(`TorchRolloutEngine.check`, on the caller's thread), and should the loop still fail, only the
requests it was running get the exception; those waiting are served by a fresh loop (`failures`
counts such failures).

The places that serve requests as they come use it: the endpoint's in-process backend
(`rlsched.serve.backend.LocalEngine`, which hops each event onto its asyncio loop), a rollout
instance's streaming method (`rlsched.rollout.instance`, which yields each event to the endpoint over
Ray), and a rollout instance's job routes refilled slot by slot, whose rows' new tokens it also hands
to the durable store (`on_partial`).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

from rlsched.engine.intake import Intake, IntakeClosed
from rlsched.engine.protocol import GenerationRequest, PartialSink, RequestId, Sample, TokenEvent
from rlsched.engine.torch_engine import TorchRolloutEngine

log = logging.getLogger(__name__)

Event = list[TokenEvent] | Sample | BaseException
Deliver = Callable[[Event], None]


class EngineStopped(RuntimeError):
    """The engine's serving loop failed or was closed: nothing more can be generated (503)."""


class Withdrawn(Exception):
    """The request was withdrawn before an engine row took it: nothing was generated."""


class StreamServer:
    def __init__(
        self, engine: TorchRolloutEngine, on_partial: PartialSink | None = None, partial_every_s: float = 0.25
    ) -> None:
        """`on_partial`: every running row's new tokens each `partial_every_s` (a rollout instance
        saves its job's requests' to the durable store)."""
        self.engine = engine
        self._partials = (on_partial, partial_every_s)
        self._intake = Intake()
        self._deliver: dict[RequestId, Deliver] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.failures = 0  # serving loops that failed (their running requests got the exception)
        engine.on_request_error = self._failed_alone

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
        once the server has been closed."""
        self.engine.check(req)
        with self._lock:
            self._deliver[req.request_id] = deliver
            self._start_loop()
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
    def _start_loop(self) -> None:
        """A serving loop, unless one runs (called with the lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            for sample in self.engine.serve(self._intake, self._on_tokens, *self._partials):
                with self._lock:
                    deliver = self._deliver.pop(sample.request_id, None)
                if deliver is not None:
                    deliver(sample)
        except BaseException as err:  # the running requests are told; the waiting ones served anew
            log.exception("the engine's serving loop failed: its running requests fail, the rest go on")
            waiting = {r.request_id for r in self._intake.pending()}
            with self._lock:
                failed = [(rid, d) for rid, d in self._deliver.items() if rid not in waiting]
                for rid, _ in failed:
                    del self._deliver[rid]
                self.failures += 1
                self._thread = None
                if self._deliver and self._intake.open:
                    self._start_loop()
            for _, deliver in failed:
                deliver(err)

    def _failed_alone(self, request_id: RequestId, err: BaseException) -> None:
        """A request the engine could not admit: it gets the exception, the batch goes on."""
        log.warning("request %s could not be admitted: %r", request_id, err)
        with self._lock:
            deliver = self._deliver.pop(request_id, None)
        if deliver is not None:
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
