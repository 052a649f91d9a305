"""Verifier pool workers: one Ray actor per slot, each judging one sample at a time.

A worker runs a verifier in-process through `run_verifier`, so a crash comes back as an
`ExecutionFault` (to be retried), never as a zero reward. `delay_s` adds a fixed duration to every
verification, to benchmark overlap before the synthetic and sandboxed verifiers exist.
"""

from __future__ import annotations

import time

import ray

from verifiers.loading import VerifierSet
from verifiers.protocol import Outcome, VerifyRequest, run_verifier


@ray.remote
class VerifierWorker:
    def __init__(self, worker_id: str, kind: str = "exact_answer", delay_s: float = 0.0) -> None:
        self.worker_id = worker_id
        self.delay_s = delay_s
        self.verifiers = VerifierSet(kind)

    def verify(self, request: VerifyRequest, kind: str | None = None) -> tuple[Outcome, float, float]:
        """The outcome and the span (start, end) of the work, on this node's monotonic clock."""
        start = time.monotonic()
        if self.delay_s:
            time.sleep(self.delay_s)
        outcome = run_verifier(self.verifiers.get(kind), request)
        return outcome, start, time.monotonic()
