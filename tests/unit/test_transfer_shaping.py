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
    assert s.rates()["slow"] == 4e9  # 0.5 GB/s each

    def send(nbytes: int, seconds: float) -> None:  # the send itself blocks for `seconds`
        slow.take(nbytes)
        clock.now += seconds
        slow.took(nbytes, seconds)

    send(500_000_000, 0.9)  # booked for 1 s, sent in 0.9: no debt
    clock.now += 20.0  # idle (a relay waiting for its upstream, say): not the receiver's lag
    send(1, 0.0)
    assert seen == [] and slow.debt_s == 0.0
    send(500_000_000, 1.3)  # 0.3 s beyond its booking: behind, not yet slow
    assert seen == [] and slow.debt_s == pytest.approx(0.3)
    send(500_000_000, 1.3)  # 0.6 s behind: slow
    (report,) = seen
    took = 8 * 1_000_000_000 / 2.6  # what it took while falling behind
    assert report.receiver == "slow" and report.measured_bps == pytest.approx(took)
    assert s.rates() == {"fast": pytest.approx(8e9 - took), "slow": pytest.approx(took)}
    send(500_000_000, 5.0)
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
