"""Held-out evaluation: pass rate of the engine's answers on the task's eval problems.

`eval_requests` and `score` are the whole rule; `evaluate` runs them on one in-process engine (the
`--local` loop), the Ray controller on its serving instances.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlsched.engine.protocol import GenerationRequest, RequestId, RolloutEngine, Sample, SamplingParams
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


def eval_requests(
    tokenizer: Tokenizer,
    template: PromptFormat,
    problems: Sequence[TaskProblem],
    *,
    max_tokens: int = 8,
    temperature: float = 0.0,
) -> list[GenerationRequest]:
    """One request per problem, its id the problem's index: greedy (by default), stopping at the
    template's stop tokens. Both drivers evaluate these, so their prompts are token for token equal."""
    params = SamplingParams(
        temperature=temperature, max_tokens=max_tokens, stop_token_ids=template.stop_token_ids
    )
    return [
        GenerationRequest(RequestId(str(i)), tuple(template.encode(tokenizer, p.messages())), params)
        for i, p in enumerate(problems)
    ]


def score(problems: Sequence[TaskProblem], samples: Iterable[Sample], verifiers: VerifierSet) -> EvalResult:
    """Pass@1 of the samples answering `eval_requests(problems)`, each judged by its problem's verifier."""
    correct: dict[int, bool] = {}
    for sample in samples:
        i = int(sample.request_id)
        problem = problems[i]
        outcome = run_verifier(
            verifiers.get(problem.verifier),
            VerifyRequest(sample.request_id, sample.text, problem.answer),
            verifiers.rewards,
        )
        correct[i] = isinstance(outcome, Verdict) and outcome.correct
    missing = len(problems) - len(correct)
    if missing:
        raise RuntimeError(f"evaluation got answers for {len(correct)} of {len(problems)} problems")
    passed = sum(correct.values())
    carry = [i for i, p in enumerate(problems) if p.has_carry()]
    carry_passed = sum(correct[i] for i in carry)
    return EvalResult(
        pass_rate=passed / len(problems),
        passed=passed,
        total=len(problems),
        carry_pass_rate=carry_passed / max(len(carry), 1),
    )


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
    """Greedy (by default) pass@1 over `problems` on one in-process engine."""
    requests = eval_requests(tokenizer, template, problems, max_tokens=max_tokens, temperature=temperature)
    return score(problems, engine.generate(requests), verifiers or VerifierSet("exact_answer"))
