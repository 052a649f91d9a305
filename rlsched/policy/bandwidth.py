"""Weights over a shared egress link: max-min fair rates, and when each receiver finishes.

One sender (the trainer's rank 0) sends the full weight bytes `S` to every receiver through its
egress link of `E` bits/s; receiver `i` has its own ingress link `r_i`. Flows that run at once share
the egress max-min fairly (progressive filling: every flow's rate rises together until it meets its
own ingress cap or the egress is full, and the capped ones leave their share to the others). Rates
are recomputed whenever a flow starts or finishes. No schedule delivers to all N receivers sooner
than `max(max_i S / r_i, N * S / E)` (SPEC section 2: 16,381,470,720 bytes to six receivers at
50 Gbit/s behind a 200 Gbit/s sender: 2.62 s for one alone, 3.93 s for all six, 98.3 GB across the
shared link).

Pure: sizes in bytes, rates in bits per second, times in seconds on the caller's clock. The weight
service paces its streams by these rates; the simulator schedules joins with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_REL = 1e-9


@dataclass(frozen=True)
class Flow:
    receiver: str
    nbytes: float
    ingress_bps: float
    start: float = 0.0


def max_min_rates(caps: Sequence[float], capacity: float) -> list[float]:
    """Max-min fair shares of `capacity` among flows capped at `caps` (progressive filling): take
    the flows from the smallest cap up; each gets the smaller of its cap and an equal share of what
    is left."""
    if capacity < 0 or any(c < 0 for c in caps):
        raise ValueError("capacity and caps must be non-negative")
    rates = [0.0] * len(caps)
    left, active = capacity, len(caps)
    for i in sorted(range(len(caps)), key=lambda k: caps[k]):
        rates[i] = min(caps[i], left / active)
        left -= rates[i]
        active -= 1
    return rates


def finish_times(flows: Sequence[Flow], egress_bps: float) -> dict[str, float]:
    """When each flow's last byte arrives, its rate recomputed at every start and finish."""
    if egress_bps <= 0:
        raise ValueError(f"the egress rate must be positive, got {egress_bps}")
    for f in flows:
        if f.nbytes < 0 or f.ingress_bps <= 0:
            raise ValueError(f"{f.receiver}: bytes must be non-negative and the ingress rate positive")
    if len({f.receiver for f in flows}) < len(flows):
        raise ValueError("each receiver may have one flow at a time")
    waiting = sorted(flows, key=lambda f: (f.start, f.receiver))
    bits: dict[str, float] = {}  # left to send, per active flow
    total: dict[str, float] = {}
    caps: dict[str, float] = {}
    done: dict[str, float] = {}
    now = waiting[0].start if waiting else 0.0
    while waiting or bits:
        while waiting and waiting[0].start <= now:
            f = waiting.pop(0)
            bits[f.receiver] = total[f.receiver] = 8.0 * f.nbytes
            caps[f.receiver] = f.ingress_bps
        names = list(bits)
        rates = dict(zip(names, max_min_rates([caps[n] for n in names], egress_bps), strict=True))
        step = min((bits[n] / rates[n] for n in names if rates[n] > 0), default=float("inf"))
        arrives = bool(waiting) and waiting[0].start - now <= step
        if arrives:
            step = waiting[0].start - now
        for n in names:
            bits[n] -= rates[n] * step
        now = waiting[0].start if arrives else now + step  # exact at a start, no drift
        for n in names:
            if bits[n] <= _REL * total[n]:  # what is left is rounding error
                done[n] = now
                del bits[n], caps[n], total[n]
    return done


def alone_s(nbytes: float, ingress_bps: float, egress_bps: float) -> float:
    """One receiver with the link to itself: `S / min(r, E)`."""
    return 8.0 * nbytes / min(ingress_bps, egress_bps)


def all_receivers_bound(nbytes: float, ingress_bps: Sequence[float], egress_bps: float) -> float:
    """No schedule delivers `nbytes` to every receiver sooner: `max(max_i S / r_i, N * S / E)`."""
    if not ingress_bps:
        return 0.0
    return max(max(8.0 * nbytes / r for r in ingress_bps), len(ingress_bps) * 8.0 * nbytes / egress_bps)
