"""The queue in front of an engine's rows: requests wait here until a row frees, the lowest
`priority` value first (the OpenAI extension: lower runs sooner), then in arrival order.

A closed intake holds one batch (`TorchRolloutEngine.generate`); an open one keeps taking requests
from other threads while the engine runs (the endpoint's serving loop), and the engine waits on it
when it has nothing to run. A request still waiting can be withdrawn (a client that went away).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterable

from rlsched.engine.protocol import GenerationRequest, RequestId


class IntakeClosed(RuntimeError):
    """A request put into an intake that no longer takes any (the serving loop stopped)."""


class Intake:
    def __init__(self, requests: Iterable[GenerationRequest] = ()) -> None:
        self._heap: list[tuple[int, int, GenerationRequest]] = []
        self._waiting: dict[RequestId, GenerationRequest] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._open = True
        for req in requests:
            self.put(req)

    @property
    def open(self) -> bool:
        return self._open

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, req: GenerationRequest, priority: int = 0) -> None:
        with self._cond:
            if not self._open:
                raise IntakeClosed(f"request {req.request_id}: the engine's intake is closed")
            heapq.heappush(self._heap, (priority, next(self._seq), req))
            self._waiting[req.request_id] = req
            self._cond.notify()

    def take(self, n: int) -> list[GenerationRequest]:
        """Up to `n` waiting requests, first in priority order."""
        out: list[GenerationRequest] = []
        with self._cond:
            while self._heap and len(out) < n:
                _, _, req = heapq.heappop(self._heap)
                if self._waiting.get(req.request_id) is req:
                    del self._waiting[req.request_id]
                    out.append(req)
        return out

    def pending(self) -> list[GenerationRequest]:
        with self._cond:
            return list(self._waiting.values())

    def remove(self, request_id: RequestId) -> bool:
        """Withdraw a request that still waits; False if it was taken (or never put)."""
        with self._cond:
            return self._waiting.pop(request_id, None) is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a request waits or the intake closes; False once closed and empty."""
        with self._cond:
            while self._open and not self._waiting:
                if not self._cond.wait(timeout):
                    break
            return bool(self._waiting) or self._open

    def close(self) -> None:
        """Take nothing more; what waits is still served."""
        with self._cond:
            self._open = False
            self._cond.notify_all()
