"""Analytic models of one RL iteration: sequential time, Amdahl's law, and the cap of a speed-up.

SPEC section 1: phases run one after another take `T_iter = T_generate + T_verify + T_update +
T_publish` (40 + 10 + 30 + 5 = 85 s). Speeding one phase up by `s` changes the whole by Amdahl's
law `S = 1 / ((1 - f) + f / s)` where `f` is the phase's share of `T_iter` (generation x2: 65 s,
about 1.31x); even an infinitely fast phase leaves the rest (cap `1 / (1 - f)`, about 1.89x).

The third lever (`pipelined_bound`): training overlaps generation when samples may be up to `k`
versions stale. In steady state an iteration then needs at least
`max(T_generate + T_load, T_update + T_publish, T_verify_exposed, chain / (k + 1))`, where
`chain = T_generate + T_verify_exposed + T_update + T_publish + T_load`: generation and loading share
the instances, update and publish the trainer, and one sample's whole chain is spread over at most
`k + 1` iterations. SPEC's example 1 + 0.2 + 0.8 + 0.1 + 0.3: 2.4 s in sequence, and with k = 1
`max(1.3, 0.9, 0.2, 1.2)` = 1.3 s, about 1.85x. With k = 0 the bound is the chain itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PHASES = ("generate", "verify", "update", "publish")


@dataclass(frozen=True)
class IterationResult:
    phases: dict[str, float]  # seconds per phase before any speed-up
    sped_up: dict[str, float]  # seconds per phase after the speed-ups
    t_iter: float
    t_iter_sped_up: float
    speedup: float  # t_iter / t_iter_sped_up, equal to Amdahl's S for a single phase
    cap: float  # the speed-up if the sped-up phases took no time at all
    formula: str = "T_iter = sum of phases; Amdahl S = 1 / ((1 - f) + f / s); cap = 1 / (1 - f)"


def amdahl(fraction: float, factor: float) -> float:
    """Overall speed-up when a `fraction` of the time runs `factor` times faster."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be in [0, 1]")
    if factor <= 0:
        raise ValueError("factor must be positive")
    return 1.0 / ((1.0 - fraction) + fraction / factor)


def iteration(phases: Mapping[str, float], speedups: Mapping[str, float] | None = None) -> IterationResult:
    speedups = dict(speedups or {})
    for name, seconds in phases.items():
        if seconds < 0:
            raise ValueError(f"phase {name!r} has a negative duration ({seconds})")
    unknown = sorted(set(speedups) - set(phases))
    if unknown:
        raise ValueError(f"speed-up for unknown phase(s) {unknown}; phases are {sorted(phases)}")
    if any(x <= 0 for x in speedups.values()):
        raise ValueError("speed-up factors must be positive")
    t_iter = sum(phases.values())
    sped = {name: seconds / speedups.get(name, 1.0) for name, seconds in phases.items()}
    t_new = sum(sped.values())
    rest = sum(seconds for name, seconds in phases.items() if name not in speedups)
    return IterationResult(
        phases=dict(phases),
        sped_up=sped,
        t_iter=t_iter,
        t_iter_sped_up=t_new,
        speedup=t_iter / t_new if t_new > 0 else float("inf"),
        cap=t_iter / rest if rest > 0 else float("inf"),
    )


@dataclass(frozen=True)
class PipelinedBound:
    staleness: int
    chain: float  # every phase one after another: the iteration without overlap
    terms: dict[str, float]  # the four lower bounds the iteration time is the largest of
    bound: float
    binding: str  # the term that sets it
    speedup: float  # chain / bound
    formula: str = (
        "T_iter >= max(T_generate + T_load, T_update + T_publish, T_verify_exposed, chain / (k + 1)); "
        "chain = T_generate + T_verify_exposed + T_update + T_publish + T_load"
    )


def pipelined_bound(
    generate: float, verify_exposed: float, update: float, publish: float, load: float, staleness: int
) -> PipelinedBound:
    """The steady-state lower bound of an iteration when samples may be `staleness` versions old."""
    phases = {"generate": generate, "verify_exposed": verify_exposed, "update": update, "publish": publish}
    for name, seconds in (*phases.items(), ("load", load)):
        if seconds < 0:
            raise ValueError(f"phase {name!r} has a negative duration ({seconds})")
    if staleness < 0:
        raise ValueError(f"staleness must be 0 or more versions, got {staleness}")
    chain = generate + verify_exposed + update + publish + load
    terms = {
        "generate + load": generate + load,
        "update + publish": update + publish,
        "verify_exposed": verify_exposed,
        "chain / (k + 1)": chain / (staleness + 1),
    }
    binding = max(terms, key=lambda t: terms[t])
    bound = terms[binding]
    return PipelinedBound(staleness, chain, terms, bound, binding, chain / bound if bound > 0 else 1.0)
