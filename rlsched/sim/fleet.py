"""Rollout instances in virtual time: a driver of the fleet's core (`rlsched.core.fleet`), with
generation and weight pulls taking drawn or modelled durations.

The core decides everything the Ray fleet decides (routing up to `request_batch` requests to each
READY instance at an admissible version, slot by slot or batch by batch, joins, reloads, transient
windows counted from their iteration's generation, reclaims with resume or restart); this module
only carries its effects out on the simulator's clock and reports back what happened:

- A pull crosses the job's weight link (`Link`: the trainer's egress shared max-min fairly with every
  other pull, `rlsched.policy.bandwidth.max_min_rates`, rates recomputed at each start and finish, as
  the weight service paces them), then loads for `load_s`. A job without `weights` pulls at once.
  With `weights.relay`, a pull the core gave sources crosses its first live source's upload link
  instead, pipelined behind that source's own transfer (`Transfers`).
- A route's samples each take their drawn time (a resumed one first prefills its prompt and saved
  tokens), side by side with the instance's other routes; each is reported as it finishes, and the
  route's end once its last has.
- A reclaimed instance's saved tokens are what it had decoded by then.

Each instance's life is counted: granted, READY, ended; generating = time with at least one sequence
running. The rest of its life is the fraction not generating.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from rlsched.core import fleet_io as fx
from rlsched.core.fleet import FleetCore
from rlsched.policy.bandwidth import max_min_rates
from rlsched.policy.resume import ResumeCost
from rlsched.policy.routing import Refill
from rlsched.sim.engine import Alarm, EventHandle, Simulator
from rlsched.sim.scenario import SimJobConfig

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

    def cancel(self, name: str) -> float:
        """Stop a pull without its callback; the bits it had left (0 if it was not pulling)."""
        if name not in self._bits:
            return 0.0
        self._advance()
        left = max(self._bits[name], 0.0)
        for d in (self._bits, self._caps, self._done):
            del d[name]
        self._replan()
        return left

    def drain(self) -> dict[str, float]:
        """Stop every pull (the link is gone); the bits each had left."""
        return {name: self.cancel(name) for name in list(self._bits)}

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


class Transfers:
    """Every pull's transfer: from the trainer over its egress (`origin`), or from a peer over that
    peer's own upload link (`upload_bps`, shared max-min by the pulls it feeds). A relayed pull is
    pipelined: it ends no sooner than one chunk's time after its source's own transfer ends (the
    store-and-forward hop of `rlsched.policy.bandwidth.chain_finish_s`). A source that leaves hands
    its downstreams to the trainer, each with what it still lacked (at least what its source did),
    as the weight client falls back to the origin."""

    def __init__(self, sim: Simulator, origin: Link, upload_bps: float, chunk_bytes: int) -> None:
        self.sim, self.origin, self.upload_bps, self.chunk_bytes = sim, origin, upload_bps, chunk_bytes
        self._uploads: dict[str, Link] = {}
        self._via: dict[str, str | None] = {}  # a transfer in progress -> its source (None: the trainer)
        self._ingress: dict[str, float] = {}
        self._done: dict[str, Callable[[], object]] = {}
        self._behind: dict[str, list[str]] = {}  # a source -> pulls that wait for its transfer to end
        self._gone: set[str] = set()

    def start(
        self,
        name: str,
        sources: tuple[str, ...],
        nbytes: float,
        ingress_bps: float,
        done: Callable[[], object],
    ) -> None:
        self._gone.discard(name)
        source = next((s for s in sources if s not in self._gone), None)
        self._via[name], self._ingress[name], self._done[name] = source, ingress_bps, done
        self._link(source).start(name, nbytes, ingress_bps, partial(self._flowed, name))

    def _link(self, source: str | None) -> Link:
        if source is None:
            return self.origin
        link = self._uploads.get(source)
        if link is None:
            link = self._uploads[source] = Link(self.sim, self.upload_bps)
        return link

    def _flowed(self, name: str) -> None:
        source = self._via[name]
        if source is None:
            self._ended(name)
        elif source in self._via:  # its source still receives: it ends one hop after the source
            self._behind.setdefault(source, []).append(name)
        else:
            self.sim.after(self._hop_s(name), partial(self._ended, name))

    def _hop_s(self, name: str) -> float:
        rate = min(self._ingress[name] or self.upload_bps, self.upload_bps)
        return 8.0 * self.chunk_bytes / rate

    def _ended(self, name: str) -> None:
        if name not in self._via:  # it left meanwhile
            return
        del self._via[name]
        done = self._done.pop(name)
        for behind in self._behind.pop(name, []):
            self.sim.after(self._hop_s(behind), partial(self._ended, behind))
        done()

    def gone(self, name: str) -> None:
        """`name` left: its own transfer stops; the pulls it fed go on from the trainer."""
        self._gone.add(name)
        lacked = 0.0
        if name in self._via:
            lacked = self._link(self._via.pop(name)).cancel(name)
            self._done.pop(name, None)
            for waiting in self._behind.values():
                if name in waiting:
                    waiting.remove(name)
        upload = self._uploads.pop(name, None)
        moved = upload.drain() if upload is not None else {}
        moved.update((behind, 0.0) for behind in self._behind.pop(name, []))
        for behind, left in moved.items():
            self._via[behind] = None
            rest = max(left, lacked) / 8.0
            self.origin.start(behind, rest, self._ingress[behind], partial(self._flowed, behind))


# one running sample: (start, prefill_s before any new token, saved tokens it started with, its end)
_Run = tuple[float, float, float, EventHandle]


@dataclass
class Instance:
    name: str
    granted: float
    ingress_bps: float
    ready_at: float | None = None
    ended: float | None = None
    running: dict[int, _Run] = field(default_factory=dict)
    routes: dict[int, int] = field(default_factory=dict)  # a route in flight -> its samples to arrive
    generating_s: float = 0.0
    _busy_since: float | None = None

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


def fleet_params(cfg: SimJobConfig) -> fx.FleetParams:
    """The core's parameters for a simulated job: the runtime's rules with the scenario's numbers."""
    r, w = cfg.resume, cfg.weights
    receiver = w.receiver_gbps if w is not None else 0.0
    windows = tuple(
        fx.Window(
            f"{cfg.name}/transient-{k}.{c}",
            spec.join_iteration,
            spec.join_at_s,
            spec.available_s,
            spec.reclaim_iteration,
            spec.reclaim_at_s,
            spec.leave,
            (spec.receiver_gbps or receiver) * 1e9,
        )
        for k, spec in enumerate(cfg.transient)
        for c in range(spec.count)
    )
    return fx.FleetParams(
        request_batch=cfg.request_batch or cfg.slots,
        max_staleness=cfg.max_staleness,
        refill=cfg.refill,
        refill_min=cfg.refill_min,
        cost=ResumeCost(r.prefill_tokens_per_s, 1.0, r.setup_s),  # each sample's own decode speed
        windows=windows,
        relay=w.relay_params() if w is not None else None,
    )


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
        self.cfg, self.sim, self.finished, self.pulled, self.record = cfg, sim, finished, pulled, record
        self.closed = False  # the job is done: nothing more happens
        w = cfg.weights
        self.link = Link(sim, w.egress_gbps * 1e9) if w is not None else None
        self.core = FleetCore(fleet_params(cfg))
        self._by_slot = cfg.refill is Refill.SLOT
        relay = self.core.params.relay
        self.transfers = (
            Transfers(sim, self.link, relay.upload_bps if relay else 1.0, relay.chunk_bytes if relay else 1)
            if self.link is not None
            else None
        )
        self.instances: dict[str, Instance] = {}
        # per sample n (its request id is str(n)), numbered across waves; arrays, not lists, so that
        # the collector never walks them (a million samples' worth made a long run 25% slower)
        self.tokens = array("d")
        self.rates = array("d")  # tokens per second of each sample's decode
        self.versions = array("q")  # the version each sample was routed at (what sampled it)
        self._then: Callable[[], None] | None = None
        self._alarm = Alarm(sim, self._on_tick)
        self._replies: list[fx.Event] = []
        receiver = (w.receiver_gbps if w is not None else 0.0) * 1e9
        for k in range(cfg.instances):
            self._feed(fx.Added(sim.now, f"{cfg.name}/rollout-{k}", receiver))

    @property
    def resumed(self) -> int:
        return self.core.counts.resumed

    @property
    def restarted(self) -> int:
        return self.core.counts.restarted

    # -- the driver's loop ---------------------------------------------------------------------------

    def _feed(self, event: fx.Event) -> None:
        if self.closed:
            return
        self._apply(self.core.handle(event))
        replies = self._replies
        while replies:  # what the driver answers at once (saved tokens read; pulls without a link)
            self._apply(self.core.handle(replies.pop(0)))
        self._alarm.arm(self.core.next_wakeup())

    def _on_tick(self) -> None:
        self._feed(fx.Tick(self.sim.now))

    def _apply(self, effects: list[fx.Effect]) -> None:
        for e in effects:  # the per-sample effect first
            if isinstance(e, fx.Accepted):
                self.finished(int(e.request_id), e.name)
            elif isinstance(e, fx.Route):
                self._route(e)
            else:
                self._apply_rare(e)

    def _apply_rare(self, e: fx.Effect) -> None:
        sim = self.sim
        sim.decisions.extend(fx.render((e,), sim.now))
        if isinstance(e, fx.StartPull):
            self._pull(e)
        elif isinstance(e, fx.Joined):
            self._joined(e)
        elif isinstance(e, fx.StartInstance):
            self.instances[e.name] = Instance(e.name, sim.now, e.ingress_bps)
        elif isinstance(e, fx.KillInstance):
            self._kill(e.name)
        elif isinstance(e, fx.ReadSaved):
            self._replies.append(fx.SavedRead(sim.now, e.name, self._saved(e)))
        elif isinstance(e, fx.Left):
            self.record(f"{e.name} {e.leave}; {e.requeued} sample(s) go back")
        elif isinstance(e, fx.ReloadDone):
            then, self._then = self._then, None
            if then is not None:  # after this event: the next iteration's events are its own
                sim.after(0.0, then)
        elif isinstance(e, fx.Note):
            self.record(e.message)
        # CutSaved: the saved tokens a run continues from come with its Route

    # -- weights -------------------------------------------------------------------------------------

    def _pull(self, e: fx.StartPull) -> None:
        w = self.cfg.weights
        if self.transfers is None or w is None:  # no link modelled: it has the version at once
            self._replies.append(fx.PullDone(self.sim.now, e.name, e.version))
            return
        done = partial(self._feed_later, fx.PullDone, e.name, e.version)
        inst = self.instances[e.name]
        loaded = partial(self.sim.after, w.load_s, done)
        self.transfers.start(e.name, e.sources, w.bytes, inst.ingress_bps, loaded)

    def _feed_later(self, kind: type[fx.PullDone], name: str, version: int) -> None:
        self._feed(kind(self.sim.now, name, version))

    def _joined(self, e: fx.Joined) -> None:
        inst = self.instances[e.name]
        if self.link is not None:  # without a modelled link nothing was transferred: no span
            self.pulled(e.name, e.started, e.why is not fx.PullWhy.RELOAD)
        if inst.ready_at is None:
            inst.ready_at = self.sim.now
            self.record(f"{e.name} READY after {self.sim.now - inst.granted:.3f} s")

    def _kill(self, name: str) -> None:
        inst = self.instances[name]
        inst.ended = self.sim.now
        if self.transfers is not None:
            self.transfers.gone(name)
        for _, _, _, event in inst.running.values():
            event.cancel()
        inst.routes.clear()

    def _saved(self, e: fx.ReadSaved) -> tuple[tuple[str, int], ...]:
        """What a reclaimed instance had decoded of each request: its saved tokens."""
        inst, now = self.instances[e.name], self.sim.now
        out = []
        for rid in e.requests:
            n = int(rid)
            start, prefill_s, saved, _ = inst.running[n]
            decoded = max(0.0, now - start - prefill_s) * self.rates[n]
            out.append((rid, int(min(saved + decoded, self.tokens[n]))))
        inst.running = {}
        inst.idle_if_empty(now)
        return tuple(out)

    # -- generating ------------------------------------------------------------------------------------

    def start_wave(self, iteration: int, tokens: list[float], rates: list[float]) -> int:
        """A pipelined job's next iteration: its samples queue behind those still running, numbered
        on from them. Returns the first one's number."""
        c = self.cfg
        first = len(self.tokens)
        self.tokens.extend(tokens)
        self.rates.extend(rates)
        self.versions.extend([0] * len(tokens))
        prompt, size = int(c.resume.prompt_tokens), c.group_size
        requests = tuple(
            [
                fx.RequestSpec(str(n), str(n // size), prompt, max(self.rates[n], _EPS))
                for n in range(first, first + len(tokens))
            ]
        )
        self._feed(fx.Begun(self.sim.now, iteration, requests))
        return first

    def _route(self, e: fx.Route) -> None:
        inst, sim, r = self.instances[e.name], self.sim, self.cfg.resume
        now, tokens, rates, running = sim.now, self.tokens, self.rates, inst.running
        arrived = partial(self._arrived, inst, e.dispatch)
        inst.routes[e.dispatch] = len(e.requests)
        version = self.core.members[e.name].version
        for rid, saved in zip(e.requests, e.resume, strict=True):
            n = int(rid)
            self.versions[n] = min(self.versions[n], version) if saved else version  # saved: sampled before
            rate = rates[n] if rates[n] > _EPS else _EPS
            prefill = r.setup_s + (r.prompt_tokens + saved) / r.prefill_tokens_per_s if saved else 0.0
            event = sim.at(now + prefill + (tokens[n] - saved) / rate, partial(arrived, n))
            running[n] = (now, prefill, float(saved), event)
        inst.busy(now)

    def _arrived(self, inst: Instance, dispatch: int, n: int) -> None:
        """Sample n of route `dispatch` is done (the hot path: an arrival never opens a window, so no
        wake-up to check; refilled by batch, it routes nothing either)."""
        running = inst.running
        del running[n]
        now = self.sim.now
        if self._by_slot:  # its row takes the next request
            self._apply(self.core.handle(fx.Arrived(now, inst.name, str(n))))
        elif self.core.arrived(inst.name, str(n)) is not None:  # as handle(Arrived), per sample
            self.finished(n, inst.name)
        if not running:
            inst.idle_if_empty(now)
        left = inst.routes[dispatch] - 1
        if left:
            inst.routes[dispatch] = left
        else:
            del inst.routes[dispatch]
            self._feed(fx.StreamEnded(now, inst.name, dispatch))

    # -- between iterations -----------------------------------------------------------------------

    def publish(self, version: int) -> None:
        self._feed(
            fx.Published(self.sim.now, version, int(self.cfg.weights.bytes) if self.cfg.weights else 0)
        )

    def reload(self, then: Callable[[], None]) -> None:
        """Every serving instance pulls the latest version; `then` once they all have it."""
        self._then = then
        self._feed(fx.ReloadAsked(self.sim.now))

    def close(self) -> None:
        """The job is done: no more windows, grants or ticks."""
        self.closed = True
        self._alarm.cancel()

    def lives(self, end: float) -> dict[str, dict[str, float]]:
        return {name: inst.life(end) for name, inst in self.instances.items()}
