"""The training group: N rank actors reserved all-or-nothing in one placement group, joined by
torch.distributed (gloo on CPU, nccl on GPU), one GRPO update per iteration, rank 0 publishing.

Every rank loads the same checkpoint, takes a shard of the batch, divides its loss by the whole
batch's token count and all-reduces its gradients, so all ranks apply the same step and hold the same
fp32 masters. Rank 0 then publishes the new version: BF16 safetensors bytes, held in memory by the
weight service it hosts (`rlsched.transfer.service`, on its node's address) for the rollout
instances to pull over the modelled link; the description (version, SHA-256, size, address) is
what the controller passes on.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
import torch.distributed as dist
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.demand import actor_options
from rlsched.config import GRPOConfig, TrainerConfig, WeightsConfig
from rlsched.core.demand import rank_bundle
from rlsched.errors import UserError
from rlsched.model.checkpoint import checksum, load_checkpoint, to_bf16_bytes
from rlsched.rl.grpo import LossStats
from rlsched.rl.update import TrainItem, TrainOptions, grpo_update, prepare_policy, set_warmup_lr
from rlsched.transfer.service import WeightService


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
        self.rank, self.world, self.cfg = rank, world, grpo
        ckpt = load_checkpoint(Path(checkpoint) if checkpoint else None)
        self.policy = prepare_policy(ckpt.model, trainer)
        pad = ckpt.tokenizer.pad_token_id
        self.train_options = TrainOptions.of(trainer, pad if pad is not None else 0)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=grpo.lr, weight_decay=0.0)
        self.step = 0

    def rendezvous_address(self) -> str:
        """Rank 0's address for the process group: this node's IP and a free port."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def join(self, init_method: str) -> int:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.world)
        return self.rank

    def _reduce(self, model: torch.nn.Module) -> None:
        if self.world > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def update(self, items: Sequence[TrainItem], token_count: float) -> tuple[LossStats, float, float]:
        """One GRPO step on this rank's shard; returns its stats and the span (start, end)."""
        start = time.monotonic()
        set_warmup_lr(self.optimizer, self.cfg, self.step)
        stats = grpo_update(
            self.policy,
            self.optimizer,
            items,
            self.cfg,
            options=self.train_options,
            token_count=token_count,
            reduce_grads=self._reduce,
        )
        self.step += 1
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

    def publish(self, version: int) -> PublishedVersion:
        blob = to_bf16_bytes(self.policy)
        manifest = self.weights.publish(version, blob)
        assert manifest.sha256 == checksum(blob)
        return PublishedVersion(version, manifest.sha256, len(blob), self.weights.address)

    def weights_checksum(self) -> str:
        return checksum(to_bf16_bytes(self.policy))

    def shutdown(self) -> None:
        if getattr(self, "weights", None) is not None:
            self.weights.close()
        if dist.is_initialized():
            dist.destroy_process_group()


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
    """Handles to the gang of ranks, created together inside one placement group."""

    def __init__(
        self,
        cfg: TrainerConfig,
        grpo: GRPOConfig,
        weights: WeightsConfig,
        checkpoint: str | None,
        seed: int,
        pg: PlacementGroup | None = None,
    ) -> None:
        self.cfg = cfg
        self.owns_pg = pg is None  # the cluster scheduler's group is removed by the scheduler
        self.pg = reserve_gang(cfg) if pg is None else pg
        self.ranks = [
            TrainerRank.options(
                **actor_options(rank_bundle(cfg)),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(i, cfg.ranks, checkpoint, grpo, cfg, seed)
            for i in range(cfg.ranks)
        ]
        address = ray.get(self.ranks[0].rendezvous_address.remote())
        ray.get([r.join.remote(address) for r in self.ranks])
        self.weights_address = ray.get(self.ranks[0].serve_weights.remote(weights))

    def update(self, items: Sequence[TrainItem]) -> tuple[LossStats, float, float]:
        tokens = float(sum(len(i.token_ids) for i in items))
        shards = [list(items[i :: len(self.ranks)]) for i in range(len(self.ranks))]
        results = ray.get([r.update.remote(s, tokens) for r, s in zip(self.ranks, shards, strict=True)])
        parts = [r[0] for r in results]  # each rank's figures are its shares of the one token-level mean
        stats = LossStats(
            loss=sum(p.loss for p in parts),
            clip_fraction=sum(p.clip_fraction for p in parts),
            kl=sum(p.kl for p in parts),
            mean_ratio=sum(p.mean_ratio for p in parts),
        )
        return stats, min(r[1] for r in results), max(r[2] for r in results)

    def publish(self, version: int) -> PublishedVersion:
        """Rank 0's new version, held by its weight service; its description."""
        published: PublishedVersion = ray.get(self.ranks[0].publish.remote(version))
        return published

    def shutdown(self) -> None:
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # it is going anyway
            ray.get(self.ranks[0].shutdown.remote(), timeout=10)
        for r in self.ranks:
            ray.kill(r)
        if self.owns_pg:
            remove_placement_group(self.pg)
