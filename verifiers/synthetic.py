"""A verifier that takes as long as it is told: for benchmarks of verification scheduling.

The reference is JSON: `{"answer": "586", "seconds": 0.4, "burn": false}`. The verifier spends
`seconds` (sleeping, or with `burn` busy on the CPU, as a compile or a test run would be) and then
judges the answer exactly. A plain-text reference is an exact answer with no extra time, so the
verifier also runs on an ordinary task file. `scripts/bench_verify.py --ray` writes task files whose
problems carry durations drawn from a tail shape, so the same problem always takes about as long and
its history predicts it.
"""

from __future__ import annotations

import json
import time

from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Verdict, VerifyRequest


def _spend(seconds: float, burn: bool) -> None:
    if not burn:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class SyntheticVerifier:
    name = "synthetic"

    def verify(self, request: VerifyRequest) -> Outcome:
        answer, seconds, burn = request.reference, 0.0, False
        if request.reference.lstrip().startswith("{"):
            try:
                spec = json.loads(request.reference)
                answer, seconds, burn = (
                    str(spec["answer"]),
                    float(spec.get("seconds", 0.0)),
                    bool(spec.get("burn")),
                )
            except (ValueError, KeyError, TypeError) as err:
                return ExecutionFault(
                    request.sample_id, FaultKind.CRASH, f"synthetic: bad reference ({err})", request.attempt
                )
            if not 0.0 <= seconds <= 3600.0:
                return ExecutionFault(
                    request.sample_id,
                    FaultKind.CRASH,
                    f"synthetic: seconds {seconds} out of [0, 3600]",
                    request.attempt,
                )
        _spend(seconds, burn)
        got = request.text.strip()
        correct = got == answer.strip()
        return Verdict(
            request.sample_id, 1.0 if correct else 0.0, correct, "" if correct else f"expected {answer!r}"
        )
