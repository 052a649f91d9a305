"""Elastic rollout instances in virtual time: joins over the shared weight link, availability
windows, reclaims with resume or restart, and how much of each instance's life went to generating.

A job with `weights` (its link: bytes, the trainer's egress, each instance's ingress, load time)
or `transient` instances generates through this fleet instead of fixed lanes. Samples wait in one
queue; a READY instance with a free slot takes the next one, so a joiner is served the moment it
is READY. A transient instance is granted at `join_at_s`, pulls the current version over the link
(`rlsched.policy.bandwidth.max_min_rates`: the egress shared max-min fairly with every other pull,
rates recomputed at each start and finish, as the weight service paces them), loads for `load_s`,
then serves until `join_at_s + available_s`, when it is reclaimed. Its running samples go back to
the front of the queue: the interrupted members of a group are cut back to the shortest saved
length among them (`rlsched.policy.resume.truncate_group`), and each resumes (prefill of prompt +
saved tokens, then the rest) or restarts, whichever `resume_or_restart` says is sooner. After each
update every live instance pulls the new version over the link before the next iteration
generates; a joiner still pulling the old version starts over at the new one.

The same policy functions as the runtime; the clock is virtual. Each instance's life is counted:
granted (or the start, for the static ones), READY, ended; generating = time with at least one
sequence running. The rest of its life is the fraction not generating.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from rlsched.policy.bandwidth import max_min_rates
from rlsched.policy.resume import Restart, ResumeCost, resume_or_restart, truncate_group
from rlsched.sim.engine import EventHandle, Simulator
from rlsched.sim.scenario import SimJobConfig, SimTransientConfig

_EPS = 1e-9


class Link:
    """One sender's egress shared by the pulls in flight; each pull ends with its callback."""

    def __init__(self, sim: Simulator, egress_bps: float) -> None:
        self.sim, self.egress_bps = sim, egress_bps
        self._bits: dict[str, float] = {}
        self._caps: dict[str, float] = {}
        self._done: dict[str, Callable[[], object]] = {}
        self._rates: dict[str, float] = {}
        self._since = 0.0
        self._next: EventHandle | None = None

    def start(self, name: str, nbytes: float, ingress_bps: float, done: Callable[[], object]) -> None:
        self._advance()
        self._bits[name], self._caps[name], self._done[name] = 8.0 * nbytes, ingress_bps, done
        self._replan()

    def cancel(self, name: str) -> None:
        if name in self._bits:
            self._advance()
            for d in (self._bits, self._caps, self._done):
                del d[name]
            self._replan()

    def pulling(self, name: str) -> bool:
        return name in self._bits

    def _advance(self) -> None:
        dt = self.sim.now - self._since
        for n, rate in self._rates.items():
            self._bits[n] -= rate * dt
        self._since = self.sim.now

    def _replan(self) -> None:
        if self._next is not None:
            self._next.cancel()
        names = list(self._bits)
        rates = max_min_rates([self._caps[n] for n in names], self.egress_bps)
        self._rates = dict(zip(names, rates, strict=True))
        waits = [max(self._bits[n], 0.0) / r for n, r in self._rates.items() if r > 0]
        self._next = self.sim.after(min(waits), self._finish) if waits else None

    def _finish(self) -> None:
        self._next = None
        self._advance()
        finished = [n for n, b in self._bits.items() if b <= _EPS * max(1.0, self._caps[n])]
        callbacks = [self._done[n] for n in finished]
        for n in finished:
            for d in (self._bits, self._caps, self._done):
                del d[n]
        self._replan()
        for cb in callbacks:
            cb()


@dataclass
class _Run:
    n: int
    start: float
    prefill_s: float  # before any new token: the prompt plus resumed tokens
    saved: float  # output tokens it started with (resumed)
    event: EventHandle


@dataclass
class Instance:
    name: str
    slots: int
    granted: float
    ingress_bps: float
    spec: SimTransientConfig | None = None
    ready_at: float | None = None
    ended: float | None = None
    running: dict[int, _Run] = field(default_factory=dict)
    generating_s: float = 0.0
    _busy_since: float | None = None

    @property
    def ready(self) -> bool:
        return self.ready_at is not None and self.ended is None

    def busy(self, now: float) -> None:
        if self._busy_since is None:
            self._busy_since = now

    def idle_if_empty(self, now: float) -> None:
        if not self.running and self._busy_since is not None:
            self.generating_s += now - self._busy_since
            self._busy_since = None

    def life(self, end: float) -> dict[str, float]:
        last = self.ended if self.ended is not None else end
        busy = self.generating_s + (last - self._busy_since if self._busy_since is not None else 0.0)
        lifetime = max(last - self.granted, 0.0)
        return {
            "lifetime_s": lifetime,
            "preparing_s": (self.ready_at if self.ready_at is not None else last) - self.granted,
            "generating_s": busy,
            "not_generating": 1.0 - busy / lifetime if lifetime > 0 else 0.0,
        }


Finished = Callable[[int, str], None]  # (sample, lane)
Pulled = Callable[[str, float, bool], None]  # (instance, when its pull started, a join: not a reload)


class SimFleet:
    """One job's rollout instances and its queue of samples to generate."""

    def __init__(
        self,
        cfg: SimJobConfig,
        sim: Simulator,
        finished: Finished,
        pulled: Pulled,
        record: Callable[[str], None],
    ) -> None:
        assert cfg.weights is not None
        self.cfg, self.sim, self.finished, self.pulled, self.record = cfg, sim, finished, pulled, record
        self.closed = False  # the job is done: no more grants
        w = cfg.weights
        self.link = Link(sim, w.egress_gbps * 1e9)
        self.instances: dict[str, Instance] = {}
        for k in range(cfg.instances):
            inst = Instance(f"{cfg.name}/rollout-{k}", cfg.slots, 0.0, w.receiver_gbps * 1e9)
            inst.ready_at = 0.0
            self.instances[inst.name] = inst
        self.queue: deque[int] = deque()
        self.tokens: list[float] = []
        self.rates: list[float] = []  # tokens per second of each sample's decode
        self.saved: dict[int, float] = {}  # a requeued sample's saved output tokens
        self.resumed = self.restarted = 0
        self.reloading: set[str] = set()
        self._pull_started: dict[str, float] = {}
        self._after_reload: Callable[[], None] | None = None
        for k, spec in enumerate(cfg.transient):
            for c in range(spec.count):
                self.sim.at(spec.join_at_s, partial(self._grant, f"{cfg.name}/transient-{k}.{c}", spec))

    # -- membership ---------------------------------------------------------------------------
    def _grant(self, name: str, spec: SimTransientConfig) -> None:
        if self.closed:
            return
        w = self.cfg.weights
        assert w is not None
        ingress = (spec.receiver_gbps or w.receiver_gbps) * 1e9
        inst = Instance(name, self.cfg.slots, self.sim.now, ingress, spec)
        self.instances[name] = inst
        self.record(f"{name} granted for {spec.available_s:g} s; pulling the weights")
        self._pull(inst)
        self.sim.after(spec.available_s, partial(self._reclaim, inst))

    def _pull(self, inst: Instance) -> None:
        w = self.cfg.weights
        assert w is not None
        self._pull_started[inst.name] = self.sim.now
        loaded = partial(self.sim.after, w.load_s, partial(self._loaded, inst))
        self.link.start(inst.name, w.bytes, inst.ingress_bps, loaded)

    def _loaded(self, inst: Instance) -> None:
        if inst.ended is not None:
            return
        self.pulled(inst.name, self._pull_started.pop(inst.name), inst.name not in self.reloading)
        if inst.name in self.reloading:
            self.reloading.discard(inst.name)
            self._reload_done()
            return
        if inst.ready_at is None:
            inst.ready_at = self.sim.now
            self.record(f"{inst.name} READY after {self.sim.now - inst.granted:.3f} s")
        self.assign()

    def _reclaim(self, inst: Instance) -> None:
        now = self.sim.now
        inst.ended = now
        self.link.cancel(inst.name)
        if inst.name in self.reloading:
            self.reloading.discard(inst.name)
            self._reload_done()
        lost = inst.running
        inst.running = {}
        inst.idle_if_empty(now)
        self.record(f"{inst.name} reclaimed; {len(lost)} sample(s) go back")
        self._requeue(lost, now)
        self.assign()

    def _requeue(self, lost: dict[int, _Run], now: float) -> None:
        groups: dict[int, dict[str, float]] = {}
        for n, run in lost.items():
            run.event.cancel()
            decoded = max(0.0, now - run.start - run.prefill_s) * self.rates[n]
            groups.setdefault(n // self.cfg.group_size, {})[str(n)] = min(run.saved + decoded, self.tokens[n])
        back = []
        for saved in groups.values():
            for key, cut in truncate_group({k: int(v) for k, v in saved.items()}, finished=()).items():
                n = int(key)
                choice = resume_or_restart(int(self.cfg.resume.prompt_tokens), cut, self._cost(n))
                self.saved[n] = float(cut) if choice.choice is Restart.RESUME else 0.0
                if choice.choice is Restart.RESUME:
                    self.resumed += 1
                else:
                    self.restarted += 1
                back.append(n)
        self.queue.extendleft(sorted(back, reverse=True))

    def _cost(self, n: int) -> ResumeCost:
        r = self.cfg.resume  # this sample's own decode rate prices the tokens a restart redoes
        return ResumeCost(r.prefill_tokens_per_s, max(self.rates[n], _EPS), r.setup_s)

    # -- generating ---------------------------------------------------------------------------
    def start_iteration(self, tokens: list[float], rates: list[float]) -> None:
        self.tokens, self.rates = tokens, rates
        self.saved = {}
        self.queue = deque(range(len(tokens)))
        self.assign()

    def assign(self) -> None:
        for inst in self.instances.values():
            while self._takes(inst) and self.queue:
                self._start(inst, self.queue.popleft())

    def _takes(self, inst: Instance) -> bool:
        return inst.ready and inst.name not in self.reloading and len(inst.running) < inst.slots

    def _start(self, inst: Instance, n: int) -> None:
        saved = self.saved.pop(n, 0.0)
        prefill = 0.0
        if saved > 0:  # resumed: prefill prompt + saved tokens first
            prefill = (
                self._cost(n).setup_s
                + (self.cfg.resume.prompt_tokens + saved) / self.cfg.resume.prefill_tokens_per_s
            )
        seconds = prefill + (self.tokens[n] - saved) / max(self.rates[n], _EPS)
        event = self.sim.after(seconds, partial(self._finish, inst, n))
        inst.running[n] = _Run(n, self.sim.now, prefill, saved, event)
        inst.busy(self.sim.now)

    def _finish(self, inst: Instance, n: int) -> None:
        del inst.running[n]
        inst.idle_if_empty(self.sim.now)
        self.finished(n, inst.name)
        self.assign()

    # -- between iterations -----------------------------------------------------------------------
    def reload(self, then: Callable[[], None]) -> None:
        """Every live instance pulls the new version; `then` once the READY ones have it. Joiners
        still pulling the old version start over."""
        live = [i for i in self.instances.values() if i.ended is None]
        self._after_reload = then
        self.reloading = {i.name for i in live if i.ready}
        for inst in live:
            self.link.cancel(inst.name)
            self._pull(inst)
        if not self.reloading:
            self._reload_done()

    def _reload_done(self) -> None:
        if self.reloading or self._after_reload is None:
            return
        then, self._after_reload = self._after_reload, None
        then()

    def lives(self, end: float) -> dict[str, dict[str, float]]:
        return {name: inst.life(end) for name, inst in self.instances.items()}
