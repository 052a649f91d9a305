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


# -- relays: receivers that pass on what they hold ---------------------------------------------------


def p2p_bound(
    nbytes: float, ingress_bps: Sequence[float], egress_bps: float, upload_bps: Sequence[float]
) -> float:
    """No schedule delivers `nbytes` to every receiver sooner when receivers may relay (Kumar and
    Ross, 2006): `max(S/E, max_i S/r_i, N*S/(E + sum_i u_i))`. The sender must send every byte once,
    each receiver must take every byte in, and N copies must leave someone's upload."""
    if not ingress_bps:
        return 0.0
    if len(upload_bps) != len(ingress_bps):
        raise ValueError("one upload rate per receiver")
    bits = 8.0 * nbytes
    return max(
        bits / egress_bps,
        max(bits / r for r in ingress_bps),
        len(ingress_bps) * bits / (egress_bps + sum(upload_bps)),
    )


@dataclass(frozen=True)
class RelayPlan:
    """Receivers (by index) in pipelined chains: each chain's head pulls from the sender, every other
    member from the one before it, chunk by chunk as each is verified."""

    chains: tuple[tuple[int, ...], ...]
    finish_s: tuple[float, ...]  # per receiver, by index: when its last chunk arrives

    @property
    def all_s(self) -> float:
        return max(self.finish_s, default=0.0)

    def source(self, receiver: int) -> int | None:
        """Whom `receiver` pulls from: the receiver before it in its chain, or None (the sender)."""
        for chain in self.chains:
            if receiver in chain:
                k = chain.index(receiver)
                return chain[k - 1] if k else None
        raise KeyError(receiver)


def chain_finish_s(
    nbytes: float,
    chunk_bytes: float,
    head_bps: float,
    ingress_bps: Sequence[float],
    upload_bps: Sequence[float],
) -> list[float]:
    """When each member of one chain has its last chunk: a tandem of store-and-forward hops. Chunk j
    reaches member k at `max(it reached k-1, chunk j-1 reached k) + c_j / rate_k`, where the head's
    rate is `min(head_bps, r_0)` and member k's is `min(u_{k-1}, r_k)`."""
    sizes = _chunk_sizes(nbytes, chunk_bytes)
    arrived = [0.0] * len(sizes)  # when each chunk reached the previous member (the sender: at once)
    out = []
    for k, r in enumerate(ingress_bps):
        rate = min(head_bps if k == 0 else upload_bps[k - 1], r)
        if rate <= 0:
            raise ValueError("every hop of a chain needs a positive rate")
        t = 0.0
        for j, c in enumerate(sizes):
            t = max(arrived[j], t) + 8.0 * c / rate
            arrived[j] = t
        out.append(t)
    return out


def _chunk_sizes(nbytes: float, chunk_bytes: float) -> list[float]:
    if chunk_bytes <= 0:
        raise ValueError(f"chunks must have a positive size, got {chunk_bytes}")
    whole, rest = divmod(nbytes, chunk_bytes)
    return [chunk_bytes] * int(whole) + ([rest] if rest > 0 else [])


@dataclass(frozen=True)
class RelayParams:
    """Instances relay each version to their peers: every instance uploads at most `upload_bps`;
    the trainer's egress `egress_bps` and the chunk size enter the reload plan
    (`rlsched.policy.bandwidth.relay_plan`)."""

    upload_bps: float
    egress_bps: float
    chunk_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if self.upload_bps <= 0:
            raise ValueError(
                f"weights.relay is on but weights.upload_gbps is {self.upload_bps / 1e9:g}: a receiver "
                "that cannot upload relays nothing. Set upload_gbps above 0 (or leave it unset for "
                "receiver_gbps), or relay: false"
            )
        if self.egress_bps <= 0 or self.chunk_bytes <= 0:
            raise ValueError("the relay plan needs a positive egress rate and chunk size")


def relay_plan(
    nbytes: float,
    chunk_bytes: float,
    ingress_bps: Sequence[float],
    egress_bps: float,
    upload_bps: Sequence[float],
) -> RelayPlan:
    """The fastest forest of k pipelined chains (k = 1 .. N; k = N is the sender alone): receivers
    by upload, largest first, dealt round-robin into the chains, so the weakest uploaders end them;
    the heads share the egress max-min fairly. A chain of one pulls straight from the sender."""
    n = len(ingress_bps)
    if len(upload_bps) != n:
        raise ValueError("one upload rate per receiver")
    if egress_bps <= 0 or any(r <= 0 for r in ingress_bps) or any(u < 0 for u in upload_bps):
        raise ValueError("the egress and every ingress must be positive, uploads non-negative")
    if n == 0:
        return RelayPlan((), ())
    order = sorted(range(n), key=lambda i: (-upload_bps[i], i))
    best: RelayPlan | None = None
    for k in range(1, n + 1):
        chains = [tuple(order[c::k]) for c in range(k)]
        if any(upload_bps[i] <= 0 for chain in chains for i in chain[:-1]):
            continue  # a receiver that cannot upload can only end a chain
        heads = max_min_rates([ingress_bps[c[0]] for c in chains], egress_bps)
        finish = [0.0] * n
        for chain, head in zip(chains, heads, strict=True):
            times = chain_finish_s(
                nbytes, chunk_bytes, head, [ingress_bps[i] for i in chain], [upload_bps[i] for i in chain]
            )
            for i, t in zip(chain, times, strict=True):
                finish[i] = t
        plan = RelayPlan(tuple(chains), tuple(finish))
        if best is None or plan.all_s < best.all_s * (1 - _REL):
            best = plan
    assert best is not None  # k = N (every receiver alone) is always allowed
    return best
