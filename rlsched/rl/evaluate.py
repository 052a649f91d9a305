"""Held-out evaluation: pass rate of the engine's answers on the task's eval problems."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlsched.engine.protocol import GenerationRequest, RequestId, RolloutEngine, SamplingParams
from rlsched.model.template import PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.rl.task import TaskProblem
from verifiers.loading import VerifierSet
from verifiers.protocol import Verdict, VerifyRequest, run_verifier


@dataclass(frozen=True)
class EvalResult:
    pass_rate: float
    passed: int
    total: int
    carry_pass_rate: float  # on problems with at least one carry: where the base model errs

    def __str__(self) -> str:
        return f"{100 * self.pass_rate:.1f}% ({self.passed}/{self.total})"


def evaluate(
    engine: RolloutEngine,
    tokenizer: Tokenizer,
    template: PromptFormat,
    problems: Sequence[TaskProblem],
    *,
    max_tokens: int = 8,
    temperature: float = 0.0,
    verifiers: VerifierSet | None = None,
) -> EvalResult:
    """Greedy (by default) pass@1 over `problems`, judged by the exact-answer verifier."""
    params = SamplingParams(
        temperature=temperature, max_tokens=max_tokens, stop_token_ids=template.stop_token_ids
    )
    requests = [
        GenerationRequest(RequestId(str(i)), tuple(template.encode(tokenizer, p.messages())), params)
        for i, p in enumerate(problems)
    ]
    verifiers = verifiers or VerifierSet("exact_answer")
    correct: dict[int, bool] = {}
    for sample in engine.generate(requests):
        i = int(sample.request_id)
        problem = problems[i]
        outcome = run_verifier(
            verifiers.get(problem.verifier), VerifyRequest(sample.request_id, sample.text, problem.answer)
        )
        correct[i] = isinstance(outcome, Verdict) and outcome.correct
    passed = sum(correct.values())
    carry = [i for i, p in enumerate(problems) if p.has_carry()]
    carry_passed = sum(correct[i] for i in carry)
    return EvalResult(
        pass_rate=passed / len(problems),
        passed=passed,
        total=len(problems),
        carry_pass_rate=carry_passed / max(len(carry), 1),
    )
