"""The rollout instances' actors, as the fleet's effects reach them (`actors.fleet`): each started
as a `RolloutInstance` (in the placement group the cluster scheduler lent it, or the job's own), with
`weights.relay` its relay service started beside it; told to pull a version (`join`: transfer, load,
confirm; `rlsched.rollout.instance`) from its peers' relays first; handed routes to generate as
streams; killed. It keeps the calls in flight, so that the fleet can tell which of its instances a
finished Ray reference belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.demand import actor_options
from actors.rollout import RolloutInstance
from rlsched.config import JobConfig
from rlsched.config_agent import PREFIX_CACHE_BLOCKS
from rlsched.config_params import instance_bundle
from rlsched.engine.prefix_cache import BLOCK
from rlsched.engine.protocol import GenerationRequest
from rlsched.policy.retry import RetryPolicy
from rlsched.rl.agent import AgentSpec
from rlsched.rl.episode_runs import EpisodeTask


class Instances:
    def __init__(
        self,
        cfg: JobConfig,
        checkpoint: str | None,
        store_path: Path | None,
        pulls: RetryPolicy,
        log: Callable[[str], None],
    ) -> None:
        """`pulls`: how often an instance pulls a version again whose bytes or load it could not
        confirm (`weights.pull_retries`)."""
        self.cfg, self.checkpoint, self.store_path, self.log = cfg, checkpoint, store_path, log
        self.retry = pulls
        self.pg: Any = None  # the cluster scheduler's placement group for the static instances
        self.handles: dict[str, Any] = {}
        self.ingress: dict[str, float] = {}
        self.pulls: dict[str, Any] = {}  # instance -> its `join` call in flight
        self.streams: dict[tuple[str, int], Any] = {}  # (instance, route) -> its streaming `generate`
        self.relays: dict[str, str] = {}  # instance -> its relay's address
        self._relay_refs: dict[str, Any] = {}  # instance -> its `start_relay` call, until first read
        self._groups: dict[str, Any] = {}  # placement groups for instances about to start
        self._seeds = 0

    def place(self, name: str, pg: Any) -> None:
        """`name` starts in `pg` (a part the cluster scheduler granted) when it starts."""
        self._groups[name] = pg

    def start(self, name: str, ingress_bps: float, relay_upload_bps: float | None) -> None:
        """A `RolloutInstance` actor; with a relay (`relay_upload_bps` not None), its service too."""
        c, r = self.cfg, self.cfg.rollout
        group = self._groups.pop(name, self.pg)
        where = {"scheduling_strategy": PlacementGroupSchedulingStrategy(group)} if group is not None else {}
        self.handles[name] = RolloutInstance.options(**actor_options(instance_bundle(r)), **where).remote(
            name,
            self.checkpoint,
            c.engine.max_batch,
            c.engine.use_cache,
            c.run.seed + self._seeds,
            str(self.store_path) if self.store_path else None,
            c.store.flush_s,
            str(c.engine.kind),
            str(c.engine.dtype),
            c.weights.staged_load,
            PREFIX_CACHE_BLOCKS * BLOCK if c.agent.enabled else 0,  # turns extend the last
            str(r.swap_kv),
            c.engine.batch_invariant,
        )
        self._seeds += 1
        self.ingress[name] = ingress_bps
        if relay_upload_bps is not None:
            self._relay_refs[name] = self.handles[name].start_relay.remote(relay_upload_bps)

    def kill(self, name: str) -> None:
        self.pulls.pop(name, None)
        for key in [k for k in self.streams if k[0] == name]:
            del self.streams[key]
        self.relays.pop(name, None)
        self._relay_refs.pop(name, None)
        ray.kill(self.handles[name])

    def pull(self, name: str, address: str, version: int, sources: Sequence[str]) -> None:
        """`name` takes `version` from the weight service at `address`, from the relays of `sources`
        first."""
        self.pulls[name] = self.handles[name].join.remote(
            address, version, self.ingress[name], str(self.cfg.weights.plane), self.retry,
            self._relay_addresses(sources),
        )  # fmt: skip

    def _relay_addresses(self, names: Sequence[str]) -> list[str]:
        """The relay addresses of `names` (each started with its actor; one that failed is left out:
        the pull goes on to the next source)."""
        for name in names:
            ref = self._relay_refs.pop(name, None)
            if ref is None:
                continue
            try:
                self.relays[name] = ray.get(ref, timeout=60)
            except (ray.exceptions.RayError, TimeoutError) as err:
                self.log(f"{name}'s relay is not available ({err}); its peers pull elsewhere")
        return [self.relays[name] for name in names if name in self.relays]

    def generate(self, name: str, batch: Sequence[GenerationRequest], dispatch: int) -> None:
        """Route number `dispatch` on `name` (the store's attempt for its requests)."""
        generate = self.handles[name].generate.options(num_returns="streaming")
        self.streams[(name, dispatch)] = generate.remote(list(batch), dispatch, str(self.cfg.rollout.refill))

    def episodes(self, name: str, dispatch: int, spec: AgentSpec, tasks: Sequence[EpisodeTask]) -> None:
        """Route number `dispatch` of a multi-turn job's episodes on `name`."""
        self.streams[(name, dispatch)] = self.handles[name].episodes.remote(spec, list(tasks))

    def pull_of(self, ref: Any) -> str | None:
        """The instance whose `join` call `ref` is (no longer in flight once named)."""
        name = next((n for n, r in self.pulls.items() if r is ref), None)
        if name is not None:
            del self.pulls[name]
        return name

    def stream_of(self, ref: Any) -> tuple[str, int] | None:  # (instance, route)
        return next((k for k, r in self.streams.items() if r is ref), None)

    def waitables(self) -> list[Any]:
        return [*self.pulls.values(), *self.streams.values()]

    def relay_names(self) -> dict[str, str]:
        """Relay address -> instance, to name a join's sources in its log line."""
        return {addr: name for name, addr in self.relays.items()}
