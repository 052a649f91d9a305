"""The shaper's pacing on a fake clock: max-min rates as flows come and go, bursts, slow receivers."""

from __future__ import annotations

import pytest

from rlsched.transfer.shaping import LinkShaper


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def shaper(egress: float | None, clock: FakeClock) -> LinkShaper:
    return LinkShaper(egress, clock=clock, sleep=clock.sleep, slow_lag_s=0.5)


def test_rates_follow_max_min_as_flows_open_and_close() -> None:
    clock = FakeClock()
    s = shaper(3e9, clock)
    a = s.open("a", 1e9)
    assert s.rates() == {"a": 1e9}
    b = s.open("b", None)  # uncapped: takes what the capped one leaves
    assert s.rates() == {"a": 1e9, "b": 2e9}
    c = s.open("c", 0.0)  # 0 means uncapped too
    assert s.rates() == {"a": 1e9, "b": 1e9, "c": 1e9}
    a.close()
    assert s.rates() == {"b": 1.5e9, "c": 1.5e9}
    b.close()
    c.close()
    assert s.rates() == {}


def test_a_flow_sends_at_its_rate_and_catches_up_at_most_one_burst() -> None:
    clock = FakeClock()
    s = shaper(8e9, clock)  # 1 GB/s
    p = s.open("a", None)
    for _ in range(10):
        p.take(100_000_000)
    assert clock.now == pytest.approx(0.9)  # the tenth send may start at 0.9 s
    clock.now += 0.3  # idle for 0.3 s: only 50 ms of allowance carries over
    before = clock.now
    for _ in range(3):
        p.take(100_000_000)
    assert clock.now - before == pytest.approx(0.2 - 0.05)


def test_a_receiver_that_falls_behind_is_reported_once_and_capped_at_what_it_takes() -> None:
    clock = FakeClock()
    seen = []
    s = LinkShaper(8e9, clock=clock, sleep=clock.sleep, slow_lag_s=0.5, on_slow=seen.append)
    fast, slow = s.open("fast", None), s.open("slow", 8e9)
    assert s.rates()["slow"] == 4e9
    slow.take(500_000_000)  # 0.5 GB booked at 0.5 GB/s: due at 1 s
    clock.now = 4.0  # but the receiver took 4 s for it
    slow.take(1)
    (report,) = seen
    assert report.receiver == "slow" and report.measured_bps == pytest.approx(1e9)
    assert s.rates() == {"fast": pytest.approx(7e9), "slow": pytest.approx(1e9)}
    clock.now = 10.0
    slow.take(1)
    assert len(seen) == 1 and s.slow == seen
    fast.close()


def test_unshaped_never_waits_and_bad_settings_are_refused() -> None:
    clock = FakeClock()
    s = shaper(None, clock)
    p = s.open("a", None)
    p.take(10**12)
    assert clock.now == 0.0
    capped = s.open("b", 8e9)  # no egress rate, but its own link still paces it
    for _ in range(3):
        capped.take(10**9)
    assert clock.now == pytest.approx(2.0) and not s.paced(p) and s.paced(capped)
    with pytest.raises(ValueError, match="egress rate must be positive"):
        LinkShaper(0.0)
    with pytest.raises(ValueError, match=r"below 0\.05 s"):
        LinkShaper(1e9, burst_s=0.01)
