"""The training group: N rank actors reserved all-or-nothing in one placement group, joined by
torch.distributed (gloo on CPU, NCCL on GPU), one GRPO update per iteration, rank 0 publishing.

Each actor wraps a `RankTrainer` (`rlsched.rl.rank`): the same checkpoint, held as
`trainer.strategy` says (a replica per rank, or FSDP2 shards), a shard of each batch divided by the
whole batch's token count, so all ranks apply one step. Rank 0 then publishes the new version: the
weights gathered tensor by tensor as BF16 (under fsdp every rank joins each gather), written as
safetensors bytes and held by the weight service it hosts (`rlsched.transfer.service`, on its node's
address) for the rollout instances to pull over the modelled link. The description (version,
SHA-256, size, address) is what the controller passes on.

A rank that dies or stops answering fails the step instead of hanging the gang: every collective has
`trainer.collective_timeout_s`, and `TrainingGroup` raises a `TrainingFault` naming the ranks that
died, faulted or never answered.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.demand import actor_options
from rlsched.config import GRPOConfig, TrainerConfig, WeightsConfig
from rlsched.config_params import rank_bundle
from rlsched.errors import CollectiveFault, TrainingFault, UserError
from rlsched.model.checkpoint import checksum, load_checkpoint
from rlsched.rl.grpo import LossStats
from rlsched.rl.rank import RankTrainer
from rlsched.rl.sharding import RANK_ENV, join_group, rank_device
from rlsched.rl.update import TrainItem, minibatches
from rlsched.transfer.service import WeightService

FAULT_GRACE_S = 5.0  # after one rank fails, how long the others have to answer before they are named


@dataclass(frozen=True)
class PublishedVersion:
    version: int
    checksum: str  # SHA-256 of the BF16 safetensors bytes
    nbytes: int
    address: str  # the weight service that holds it


@ray.remote
class TrainerRank:
    def __init__(
        self,
        rank: int,
        world: int,
        checkpoint: str | None,
        grpo: GRPOConfig,
        trainer: TrainerConfig,
        seed: int,
    ) -> None:
        torch.set_num_threads(max(1, int(trainer.cpus_per_rank)))
        torch.manual_seed(seed)
        self.rank, self.world, self.grpo, self.cfg = rank, world, grpo, trainer
        self.checkpoint = load_checkpoint(Path(checkpoint) if checkpoint else None)
        self.trainer: RankTrainer | None = None  # made once the group exists: fsdp shards over it
        self.weights: WeightService | None = None

    def rendezvous_address(self) -> str:
        """Rank 0's address for the process group: this node's IP and a free port."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def join(self, init_method: str) -> int:
        join_group(init_method, self.rank, self.world, self.cfg.collective_timeout_s, rank_device(self.cfg))
        pad = self.checkpoint.tokenizer.pad_token_id
        model = self.checkpoint.model
        del self.checkpoint  # the rank keeps only what its strategy holds
        pad_id = pad if pad is not None else 0
        self.trainer = RankTrainer(self.rank, self.world, model, pad_id, self.grpo, self.cfg)
        return self.rank

    def _trainer(self) -> RankTrainer:
        assert self.trainer is not None, "join the process group first"
        return self.trainer

    def update(
        self, parts: Sequence[Sequence[TrainItem]], token_counts: Sequence[float]
    ) -> tuple[LossStats, float, float]:
        """A batch's GRPO steps (one per minibatch) on this rank's share; its stats and the span."""
        start = time.monotonic()
        stats = self._trainer().step_batch(parts, token_counts)
        return stats, start, time.monotonic()

    def serve_weights(self, cfg: WeightsConfig) -> str:
        """Start this rank's weight service on its node's address; returns host:port."""
        egress = cfg.egress_gbps * 1e9 if cfg.egress_gbps else None
        self.weights = WeightService(
            egress,
            host=ray.util.get_node_ip_address(),
            keep=cfg.keep_versions,
            chunk_bytes=cfg.chunk_kb << 10,
        )
        return self.weights.address

    def publish(self, version: int) -> PublishedVersion | None:
        """Gather the weights (every rank, under fsdp); rank 0 hands them to its weight service."""
        blob = self._trainer().published()
        if blob is None:
            return None
        assert self.weights is not None, "rank 0 serves the weights"
        manifest = self.weights.publish(version, blob)
        return PublishedVersion(version, manifest.sha256, len(blob), self.weights.address)

    def ping(self) -> int:
        return self.rank

    def save_state(self, directory: str) -> None:
        self._trainer().save_state(Path(directory))

    def load_state(self, directory: str) -> int:
        return self._trainer().load_state(Path(directory))

    def weights_checksum(self) -> str:
        """The SHA-256 of the BF16 weights this rank holds (gathered first under fsdp)."""
        blob = self._trainer().published(everywhere=True)
        assert blob is not None
        return checksum(blob)

    def shutdown(self) -> None:
        if self.weights is not None:
            self.weights.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _why(rank: int, err: ray.exceptions.RayTaskError) -> str:
    cause = err.cause
    if isinstance(cause, CollectiveFault):
        return str(cause)
    first = str(cause).splitlines()[0][:300] if str(cause) else ""
    return f"rank {rank} raised {type(cause).__name__}: {first}"


def answers(refs: Sequence[ray.ObjectRef], step: str) -> list[Any]:
    """Every rank's answer in rank order, or a `TrainingFault` naming the ranks that died, faulted, or
    had not answered `FAULT_GRACE_S` after the first failure."""
    pending = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    dead: list[int] = []
    faults: list[str] = []
    deadline: float | None = None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if not done:
            break
        rank = pending.pop(done[0])
        try:
            results[rank] = ray.get(done[0])
            continue
        except ray.exceptions.RayActorError:
            dead.append(rank)
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, UserError):
                raise err.cause from None  # bad input found by a rank (its memory, its checkpoint)
            faults.append(_why(rank, err))
        deadline = deadline or time.monotonic() + FAULT_GRACE_S
    if dead or faults or pending:
        raise TrainingFault(step, tuple(sorted(dead)), tuple(sorted(pending.values())), tuple(faults))
    return [results[i] for i in range(len(refs))]


def _missing_resources(bundles: list[dict[str, float]]) -> str:
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    have = ray.available_resources()
    short = [
        f"{k}: needs {v:g}, {have.get(k, 0.0):g} available" for k, v in need.items() if have.get(k, 0.0) < v
    ]
    return "; ".join(short) or "enough in total, but not in the arrangement the strategy requires"


def reserve_gang(cfg: TrainerConfig) -> PlacementGroup:
    """One placement group for all ranks, or a UserError naming what is missing after the timeout."""
    bundles = [rank_bundle(cfg) for _ in range(cfg.ranks)]
    name = f"rlsched-trainer-{uuid.uuid4().hex[:8]}"  # several jobs may share one cluster
    pg = placement_group(bundles, strategy=cfg.placement_strategy.value, name=name)
    ready, _ = ray.wait([pg.ready()], timeout=cfg.placement_timeout_s)
    if not ready:
        missing = _missing_resources(bundles)
        remove_placement_group(pg)
        raise UserError(
            f"the training group ({cfg.ranks} ranks x {bundles[0]}, {cfg.placement_strategy.value}) could "
            f"not be placed within {cfg.placement_timeout_s:g} s: {missing}. Lower trainer.ranks or the "
            "per-rank resources, or add nodes to the cluster"
        )
    return pg


class TrainingGroup:
    """Handles to the gang of ranks, created together inside one placement group. Creating it starts
    the ranks; `ready` waits until they have met and rank 0 serves weights. Between the two a job
    starts its other actors, so that their processes start and load the model while the ranks' do (on
    a cluster the job is ready after the slower of the two, not their sum; on two cores, where start-up
    is CPU-bound, it made no measurable difference: 12.7-13.6 s either way)."""

    def __init__(
        self,
        cfg: TrainerConfig,
        grpo: GRPOConfig,
        weights: WeightsConfig,
        checkpoint: str | None,
        seed: int,
        pg: PlacementGroup | None = None,
    ) -> None:
        self.cfg, self.grpo = cfg, grpo
        self.owns_pg = pg is None  # the cluster scheduler's group is removed by the scheduler
        self.pg = reserve_gang(cfg) if pg is None else pg
        self.ranks = [
            TrainerRank.options(
                **actor_options(rank_bundle(cfg)),
                runtime_env={"env_vars": RANK_ENV},
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(i, cfg.ranks, checkpoint, grpo, cfg, seed)
            for i in range(cfg.ranks)
        ]
        self._meeting = self.ranks[0].rendezvous_address.remote()
        self._weights = weights

    def ready(self) -> TrainingGroup:
        """Wait until the ranks have met (the process group formed) and rank 0 serves weights."""
        answers([r.join.remote(ray.get(self._meeting)) for r in self.ranks], "start")
        ray.get(self.ranks[0].serve_weights.remote(self._weights))
        return self

    def update(self, items: Sequence[TrainItem]) -> tuple[LossStats, float, float]:
        """The batch's steps on every rank (one per `grpo.minibatches`); the figures and the span."""
        return self.update_end(self.update_begin(items))

    def update_begin(self, items: Sequence[TrainItem]) -> list[Any]:
        """Start the batch's steps on every rank (its share of each minibatch); the calls in flight."""
        batches = minibatches(items, self.grpo.minibatches)
        tokens = [sum(i.trained_tokens for i in mb) for mb in batches]
        world = len(self.ranks)
        return [r.update.remote([mb[k::world] for mb in batches], tokens) for k, r in enumerate(self.ranks)]

    def update_end(self, refs: list[Any]) -> tuple[LossStats, float, float]:
        """The started steps' figures (the ranks' shares summed) and their span."""
        results = answers(refs, "update")
        stats = results[0][0]  # each rank's figures are its shares of the one token-level mean
        for r in results[1:]:
            stats = stats.plus(r[0])
        return stats, min(r[1] for r in results), max(r[2] for r in results)

    def publish(self, version: int) -> PublishedVersion:
        """Rank 0's new version, held by its weight service; its description. Under fsdp every rank
        joins the gathers."""
        ranks = self.ranks if self.cfg.sharded else self.ranks[:1]
        published: PublishedVersion = answers([r.publish.remote(version) for r in ranks], "publish")[0]
        return published

    def check(self, step: str) -> None:
        """A `TrainingFault` unless every rank answers (after a sign of trouble: instances that could
        not reach rank 0's weight service)."""
        answers([r.ping.remote() for r in self.ranks], step)

    def save_state(self, directory: Path) -> None:
        """Every rank writes its share of the training state into `directory` (a checkpoint being
        written aside: the caller seals it)."""
        answers([r.save_state.remote(str(directory)) for r in self.ranks], "checkpoint")

    def load_state(self, directory: Path) -> int:
        """Every rank loads a checkpoint's training state; the step count it resumes after."""
        steps: list[int] = answers([r.load_state.remote(str(directory)) for r in self.ranks], "resume")
        return steps[0]

    def checksums(self) -> list[str]:
        """Each rank's SHA-256 of the weights it holds (all equal, or the ranks have diverged)."""
        sums: list[str] = answers([r.weights_checksum.remote() for r in self.ranks], "checksum")
        return sums

    def shutdown(self) -> None:
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # it is going anyway
            ray.get(self.ranks[0].shutdown.remote(), timeout=10)
        for r in self.ranks:
            ray.kill(r)
        if self.owns_pg:
            remove_placement_group(self.pg)
