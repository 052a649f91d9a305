"""Pacing every concurrent pull so that together they follow the link model.

The sender's egress is shared; each receiver has its own ingress cap. Whenever a flow opens or
closes, the shaper asks `rlsched.policy.bandwidth.max_min_rates` (the model the simulator and
`rlsched calc transfer` use) for every open flow's rate, and each flow then paces itself on a
virtual clock: a send of `n` bytes may start when the flow's allowance has caught up, and a flow
that fell behind may catch up by at most `burst_s` (a token bucket that deep: on this machine a
bucket of at least 50 ms paced within 1% of its target, shallower ones lost time to late wake-ups).

A receiver that takes less than its share (slower than configured) makes the sends to it block
for longer than the bytes were booked for. The sender reports how long each send took (`Pace.took`),
and the shaper keeps the flow's debt: the time its sends blocked beyond their booking, less any
time a later quick send gives back, never below zero. Only time inside a send counts, so a relay
that waits for its own upstream chunks, or a flow idle between requests, is not "slow". When the
debt passes `slow_lag_s` the shaper reports it once (`SlowReceiver`: configured, assigned and
measured rates) and caps that flow at what it achieved, so the others get the rest of the egress;
the transfer itself carries on and loses nothing.

Without an egress rate (`egress_bps=None`) only the receivers' own caps pace their flows; a flow
with neither never waits: the raw throughput of the data path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlsched.policy.bandwidth import max_min_rates

UNCAPPED = float("inf")


@dataclass(frozen=True)
class SlowReceiver:
    receiver: str
    configured_bps: float
    assigned_bps: float
    measured_bps: float

    def __str__(self) -> str:
        return (
            f"receiver {self.receiver} takes {self.measured_bps / 1e9:.2f} Gbit/s, less than the "
            f"{self.assigned_bps / 1e9:.2f} Gbit/s assigned to it (configured ingress "
            f"{self.configured_bps / 1e9:.2f} Gbit/s); its flow is capped at what it takes so the others "
            "get the rest. Set its ingress rate to what the receiver can take."
        )


class Pace:
    """One flow's pacing; `take(n)` blocks until the flow may send `n` more bytes."""

    def __init__(self, shaper: LinkShaper, receiver: str, cap_bps: float) -> None:
        self._shaper = shaper
        self.receiver = receiver
        self.configured_bps = cap_bps
        self.cap_bps = cap_bps
        self.rate_bps = UNCAPPED
        self.opened = shaper.clock()
        self.sent = 0
        self.due = self.opened  # when the allowance has caught up with what was sent
        self.debt_s = 0.0  # how long sends blocked beyond their booking (the receiver's lag)
        self.behind_bytes = 0  # sent since the debt was last zero, and the seconds those sends took
        self.behind_s = 0.0
        self.slow: SlowReceiver | None = None

    def take(self, nbytes: int) -> None:
        wait = self._shaper.schedule(self, nbytes)
        if wait > 0:
            self._shaper.sleep(wait)

    def took(self, nbytes: int, seconds: float) -> None:
        """The send of `nbytes` just booked took `seconds` (the receiver's side of the pace)."""
        self._shaper.account(self, nbytes, seconds)

    def close(self) -> None:
        self._shaper.close(self)


class LinkShaper:
    """Max-min fair pacing of the flows through one egress link (thread-safe)."""

    def __init__(
        self,
        egress_bps: float | None,
        burst_s: float = 0.05,
        slow_lag_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_slow: Callable[[SlowReceiver], None] | None = None,
    ) -> None:
        if egress_bps is not None and egress_bps <= 0:
            raise ValueError(f"the egress rate must be positive (or None: unshaped), got {egress_bps}")
        if burst_s < 0.05:
            raise ValueError(f"burst_s {burst_s} is below 0.05 s: late wake-ups would slow every flow")
        self.egress_bps = egress_bps
        self.burst_s = burst_s
        self.slow_lag_s = slow_lag_s
        self.clock = clock
        self.sleep = sleep
        self.on_slow = on_slow
        self._lock = threading.Lock()
        self._flows: list[Pace] = []
        self.slow: list[SlowReceiver] = []

    def paced(self, pace: Pace) -> bool:
        """Whether this flow is paced at all (an egress rate, or its own cap)."""
        return self.egress_bps is not None or pace.cap_bps < UNCAPPED

    def open(self, receiver: str, ingress_bps: float | None) -> Pace:
        cap = ingress_bps if ingress_bps and ingress_bps > 0 else UNCAPPED
        pace = Pace(self, receiver, cap)
        with self._lock:
            self._flows.append(pace)
            self._reassign()
        return pace

    def close(self, pace: Pace) -> None:
        with self._lock:
            if pace in self._flows:
                self._flows.remove(pace)
                self._reassign()

    def rates(self) -> dict[str, float]:
        with self._lock:
            return {p.receiver: p.rate_bps for p in self._flows}

    def _reassign(self) -> None:
        if self.egress_bps is None:  # nothing shared: each flow at its own cap
            for pace in self._flows:
                pace.rate_bps = pace.cap_bps
            return
        caps = [min(p.cap_bps, self.egress_bps) for p in self._flows]
        for pace, rate in zip(self._flows, max_min_rates(caps, self.egress_bps), strict=True):
            pace.rate_bps = rate

    def schedule(self, pace: Pace, nbytes: int) -> float:
        """Book `nbytes` on the flow's clock; the seconds to wait before sending them."""
        if pace.rate_bps == UNCAPPED:
            pace.sent += nbytes
            return 0.0
        with self._lock:
            now = self.clock()
            start = max(pace.due, now - self.burst_s)
            pace.due = start + 8.0 * nbytes / pace.rate_bps
            pace.sent += nbytes
            return start - now

    def account(self, pace: Pace, nbytes: int, seconds: float) -> None:
        """Add a send's blocking beyond its booked time to the flow's debt; report it when slow."""
        if pace.rate_bps == UNCAPPED or pace.slow is not None:
            return
        with self._lock:
            pace.debt_s = max(0.0, pace.debt_s + seconds - 8.0 * nbytes / pace.rate_bps)
            if pace.debt_s == 0.0:
                pace.behind_bytes, pace.behind_s = 0, 0.0
                return
            pace.behind_bytes += nbytes
            pace.behind_s += seconds
            if pace.debt_s > self.slow_lag_s:
                self._mark_slow(pace)

    def _mark_slow(self, pace: Pace) -> None:
        # the rate it took while falling behind: the sends before (filling socket buffers) and any
        # idle time aside
        measured = 8.0 * pace.behind_bytes / max(pace.behind_s, 1e-9)
        pace.slow = SlowReceiver(pace.receiver, pace.configured_bps, pace.rate_bps, measured)
        self.slow.append(pace.slow)
        pace.cap_bps = measured
        self._reassign()
        if self.on_slow is not None:
            self.on_slow(pace.slow)
