"""What a verifier takes and returns.

A verifier gets a sample's text and the problem's reference and returns one of two typed outcomes:
a `Verdict` (the answer was judged; its reward, right or wrong) or an `ExecutionFault` (the verifier
itself could not judge: it crashed, timed out, or ran out of resources). A fault is retried by
whoever dispatched the work and is never turned into a zero reward: scoring a crashed verifier as a
wrong answer teaches the policy that correct answers are bad.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol


@dataclass(frozen=True)
class VerifyRequest:
    sample_id: str
    text: str
    reference: str
    attempt: int = 0
    # set by the pool that dispatched it (None: the verifier's own defaults): when to stop this
    # attempt (the adaptive timeout), and the task's time limit, past which an answer is wrong
    timeout_s: float | None = None
    limit_s: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The answer was judged. `reward` is finite and in the task's range (`RewardRange`, [0, 1] unless
    the task declares another: `run_stage` makes any other reward a fault); `correct` says whether it
    matched exactly."""

    sample_id: str
    reward: float
    correct: bool
    detail: str = ""


class FaultKind(StrEnum):
    CRASH = "crash"  # the verifier raised or its process died
    TIMEOUT = "timeout"  # it did not answer in time (and was stopped)
    RESOURCES = "resources"  # out of memory, no device, sandbox refused
    INPUT = "input"  # the sample cannot be judged as given (no reference, no such verifier kind)

    @property
    def retryable(self) -> bool:
        """A retry may succeed: not for bad input, which judges the same way every time."""
        return self is not FaultKind.INPUT


@dataclass(frozen=True)
class ExecutionFault:
    """The verifier could not judge the answer. Retry; never score it."""

    sample_id: str
    kind: FaultKind
    detail: str
    attempt: int = 0


Outcome = Verdict | ExecutionFault


@dataclass(frozen=True)
class RewardRange:
    """The rewards a task's verifier may give (`task.reward_range`): finite numbers from `low` to
    `high`. A reward outside it never reaches training: from a verifier it becomes a fault, from an
    endpoint's client a 4xx."""

    low: float = 0.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(
                f"a reward range is two finite numbers, low below high; got [{self.low}, {self.high}]"
            )

    def problem(self, reward: object) -> str | None:
        """Why `reward` cannot be trained on (a message naming the rule), or None."""
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            return f"reward {reward!r} is not a number"
        if not math.isfinite(reward):
            return f"reward {reward} is not a finite number"
        if not self.low <= reward <= self.high:
            bounds = f"[{self.low:g}, {self.high:g}]"
            return f"reward {reward:g} is outside the task's reward range {bounds} (task.reward_range)"
        return None


UNIT_REWARDS = RewardRange()  # [0, 1]: every task's unless it declares another


@dataclass(frozen=True)
class Prepared:
    """A two-stage verifier's CPU stage is done; `payload` (a compiled binary, say) goes to its GPU
    stage, which runs on a worker holding a device of its own."""

    sample_id: str
    payload: bytes
    detail: str = ""


class Verifier(Protocol):
    name: str

    def verify(self, request: VerifyRequest) -> Outcome: ...


Stage = Literal["whole", "cpu", "gpu"]  # a whole verification, or one stage of a two-stage verifier


class TwoStageVerifier(Verifier, Protocol):
    """A verifier whose work splits into a CPU stage and a GPU stage (e.g. compile, then run). With
    GPU workers in the pool the stages run on different workers; without, `verify` runs both."""

    def prepare(self, request: VerifyRequest) -> Outcome | Prepared: ...

    def run_prepared(self, request: VerifyRequest, payload: bytes) -> Outcome: ...


def is_two_stage(verifier: Verifier) -> bool:
    return callable(getattr(verifier, "prepare", None)) and callable(getattr(verifier, "run_prepared", None))


def run_stage(
    verifier: Verifier,
    request: VerifyRequest,
    call: Callable[[], Outcome | Prepared],
    rewards: RewardRange = UNIT_REWARDS,
) -> Outcome | Prepared:
    """One stage of a two-stage verifier, with `run_verifier`'s guarantees: a missing reference is an
    INPUT fault, an exception an `ExecutionFault`, never a zero reward, and a reward that is not a
    finite number in `rewards` a CRASH fault (a verifier's bug: it never reaches training)."""
    if (fault := missing_reference(verifier, request)) is not None:
        return fault
    try:
        out = call()
        if isinstance(out, Verdict) and (problem := rewards.problem(out.reward)) is not None:
            detail = f"{verifier.name}: {problem}; a verifier's rewards must lie in the task's range"
            return ExecutionFault(request.sample_id, FaultKind.CRASH, detail, request.attempt)
        return out
    except MemoryError as err:
        return ExecutionFault(
            request.sample_id, FaultKind.RESOURCES, f"{verifier.name}: {err!r}", request.attempt
        )
    except Exception as err:  # noqa: BLE001 - the boundary where any verifier bug becomes a typed fault
        return ExecutionFault(
            request.sample_id, FaultKind.CRASH, f"{verifier.name}: {err!r}", request.attempt
        )


def missing_reference(verifier: Verifier, request: VerifyRequest) -> ExecutionFault | None:
    """An INPUT fault when the sample has no reference to judge against (None or blank) and the
    verifier needs one; a verifier that judges without one sets `needs_reference = False`."""
    if not getattr(verifier, "needs_reference", True):
        return None
    if isinstance(request.reference, str) and request.reference.strip():
        return None
    return ExecutionFault(
        request.sample_id,
        FaultKind.INPUT,
        f"{verifier.name}: sample {request.sample_id} has no reference to judge against; give its "
        "problem a non-empty 'reference' (or use a verifier with needs_reference = False)",
        request.attempt,
    )


def run_verifier(verifier: Verifier, request: VerifyRequest, rewards: RewardRange = UNIT_REWARDS) -> Outcome:
    """Call a verifier in-process; an exception becomes an `ExecutionFault`, never a zero reward, a
    reward outside `rewards` a fault, and a sample without a reference an INPUT fault without calling
    the verifier at all."""
    out = run_stage(verifier, request, lambda: verifier.verify(request), rewards)
    assert not isinstance(out, Prepared)
    return out


def client_reference_refusal(verifier: Verifier) -> str | None:
    """Why a reference sent by an endpoint's client may not reach this verifier, or None when it may.

    A reference is what the verifier judges against. Kinds that only compare with it (exact_answer,
    math) declare `reference_is_data = True`; kinds that run what it holds (code's tests, cuda's
    harness, synthetic's time to spend) do not, nor does a researcher's own kind until it declares so:
    a client's reference there would run as code, or hold a worker, on the job's machines."""
    if getattr(verifier, "reference_is_data", False):
        return None
    return (
        f"the job's verifier '{verifier.name}' runs what a reference holds, so it takes references "
        "only from the job's own task; send the episode's reward (POST /v1/episodes/ID/reward) "
        "instead, or use a verifier that declares reference_is_data = True"
    )


def fenced_code(text: str, languages: tuple[str, ...]) -> str:
    """The first fenced block (```lang ... ```) whose tag is one of `languages` or empty; else the
    whole text. Models often wrap their code in prose; the verifier judges the code."""
    tags = "|".join(re.escape(lang) for lang in languages)
    found = re.search(rf"```(?:{tags})?\s*\n(.*?)```", text, re.DOTALL)
    return found.group(1) if found else text
