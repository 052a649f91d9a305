"""Resolve a verifier spec from the config: a shipped kind, or a researcher's own `module:callable`.

`module:callable` names something importable on every Ray node: a class (instantiated with no
arguments) or a factory returning an object with `name` and `verify(request) -> Verdict |
ExecutionFault`, or a plain function `(VerifyRequest) -> Verdict | ExecutionFault | float | bool`,
whose number or truth value becomes the reward (1.0 or more counts as correct).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from rlsched.policy.timeouts import TimeoutParams
from verifiers.exact_answer import ExactAnswerVerifier
from verifiers.protocol import (
    UNIT_REWARDS,
    ExecutionFault,
    Outcome,
    RewardRange,
    Verdict,
    Verifier,
    VerifyRequest,
)
from verifiers.sandbox import SandboxPolicy

SHIPPED = ("exact_answer", "math", "math_strict", "code", "synthetic", "cuda")


class VerifierSpecError(ValueError):
    """The spec names nothing usable; the message says what and how to fix it."""


class _FunctionVerifier:
    def __init__(self, name: str, fn: Callable[[VerifyRequest], Any]) -> None:
        self.name = name
        self._fn = fn

    def verify(self, request: VerifyRequest) -> Outcome:
        result = self._fn(request)
        if isinstance(result, Verdict | ExecutionFault):
            return result
        if isinstance(result, bool | int | float):
            reward = float(result)
            return Verdict(request.sample_id, reward, reward >= 1.0)
        raise TypeError(
            f"{self.name} returned {type(result).__name__}; expected Verdict, ExecutionFault or a number"
        )


def load_verifier(
    spec: str, sandbox: SandboxPolicy | None = None, timeouts: TimeoutParams | None = None
) -> Verifier:
    """The verifier a spec names; `sandbox` is the policy of the kinds that run untrusted code and
    `timeouts` (`verifier.timeout`) their time limits when they are called without a pool's."""
    match spec:
        case "exact_answer":
            return ExactAnswerVerifier()
        case "math" | "math_strict":
            from verifiers.math import MathVerifier

            return MathVerifier(require_format=spec == "math_strict")
        case "code":
            from verifiers.code import CodeVerifier

            return CodeVerifier(policy=sandbox, timeouts=timeouts)
        case "synthetic":
            from verifiers.synthetic import SyntheticVerifier

            return SyntheticVerifier()
        case "cuda":
            from verifiers.cuda import CudaVerifier

            return CudaVerifier(policy=sandbox)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise VerifierSpecError(
            f"verifier {spec!r} is neither a shipped kind ({', '.join(SHIPPED)}) nor 'module:callable'"
        )
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except ImportError as err:
        raise VerifierSpecError(f"verifier {spec!r}: cannot import {module_name!r} ({err})") from None
    except AttributeError:
        raise VerifierSpecError(f"verifier {spec!r}: module {module_name!r} has no {attr!r}") from None
    if inspect.isclass(target) or (callable(target) and _takes_no_arguments(target)):
        made = target()
        if not callable(getattr(made, "verify", None)):
            raise VerifierSpecError(f"verifier {spec!r}: {attr}() has no verify(request) method")
        if not hasattr(made, "name"):
            made.name = spec
        return made  # type: ignore[no-any-return]
    if callable(target):
        return _FunctionVerifier(spec, target)
    raise VerifierSpecError(f"verifier {spec!r}: {attr!r} is not callable")


def _takes_no_arguments(fn: Callable[..., Any]) -> bool:
    try:
        return not any(
            p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            for p in inspect.signature(fn).parameters.values()
        )
    except (TypeError, ValueError):
        return False


class VerifierSet:
    """Verifiers by spec, loaded on first use: a sample's metadata may name its own kind."""

    def __init__(
        self,
        default: str,
        sandbox: SandboxPolicy | None = None,
        rewards: RewardRange = UNIT_REWARDS,
        timeouts: TimeoutParams | None = None,
    ) -> None:
        self.default = default
        self.sandbox = sandbox
        self.timeouts = timeouts
        self.rewards = rewards  # the task's: a verdict outside it is a fault (`run_stage`)
        self._loaded: dict[str, Verifier] = {}

    def get(self, spec: str | None = None) -> Verifier:
        key = spec or self.default
        if key not in self._loaded:
            self._loaded[key] = load_verifier(key, self.sandbox, self.timeouts)
        return self._loaded[key]
