"""Exact-answer verifier for math-style tasks: the answer text must equal the reference.

The sample's text is stripped of surrounding whitespace; nothing else is forgiven (the toy task's
answers are digit strings written least-significant digit first, so "975" and "579" differ).
An empty answer is a wrong answer, not a fault: the policy produced it.
"""

from __future__ import annotations

from verifiers.protocol import Outcome, Verdict, VerifyRequest


class ExactAnswerVerifier:
    name = "exact_answer"
    reference_is_data = True  # compared with, never run

    def verify(self, request: VerifyRequest) -> Outcome:
        if not isinstance(request.text, str) or not isinstance(request.reference, str):
            raise TypeError("text and reference must be strings")
        answer = request.text.strip()
        correct = answer == request.reference.strip()
        detail = "" if correct else f"expected {request.reference!r}, got {answer[:40]!r}"
        return Verdict(request.sample_id, 1.0 if correct else 0.0, correct, detail)
