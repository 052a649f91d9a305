"""Verifiers that misbehave in-process, for the pool's tests (imported by name on Ray workers)."""

from __future__ import annotations

import os
import time

from verifiers.protocol import Verdict, VerifyRequest


def crash_first(request: VerifyRequest) -> Verdict:
    """Kills its own worker process on the first attempt; judges exactly on a retry."""
    if request.attempt == 0:
        os._exit(3)
    return Verdict(
        request.sample_id, float(request.text == request.reference), request.text == request.reference
    )


def hang(request: VerifyRequest) -> Verdict:
    """Never answers: loops until its process is killed (no timeout inside the call can stop it)."""
    while True:
        time.sleep(0.01)


def slow(request: VerifyRequest) -> Verdict:
    """Takes as many seconds as the text says, then judges it right."""
    time.sleep(float(request.text))
    return Verdict(request.sample_id, 1.0, True)
