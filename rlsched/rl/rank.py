"""One training rank, whatever drives it: a Ray actor of the training group (`actors.trainer`) or a
benchmark's process (`scripts/bench_fsdp.py`).

A rank holds the policy as its strategy says (`rlsched.rl.sharding`), its AdamW optimizer (over
its shards under fsdp) and its step count. `step` runs one GRPO update on its shard of the batch,
keeping in step with its peers: replicate sums gradients once, fsdp agrees on the number of passes.
`published` gathers the new weights, tensor by tensor, as BF16 safetensors bytes written in
place; only rank 0 keeps them, but every rank must call it, since each gather is a collective.
Collective errors come out as `CollectiveFault`s that name the rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlsched.config import GRPOConfig, TrainerConfig
from rlsched.model.checkpoint import published_specs
from rlsched.model.writer import SafetensorsWriter
from rlsched.rl.grpo import LossStats
from rlsched.rl.sharding import (
    HeldBytes,
    agreed_passes,
    all_reduce_grads,
    collective_fault,
    full_state,
    held_bytes,
    host_available_bytes,
    rank_device,
    refuse_if_it_does_not_fit,
    shard,
)
from rlsched.rl.train_state import load_state, save_state
from rlsched.rl.update import TrainItem, TrainOptions, prepare_policy, update_batch


def _available(device: torch.device, cfg: TrainerConfig) -> tuple[int | None, str]:
    """Where a rank's training state lives and how much room it has there."""
    if device.type == "cuda" and not cfg.offload:
        return torch.cuda.mem_get_info(device)[0], f"the GPU ({torch.cuda.get_device_name(device)})"
    return host_available_bytes(), "host memory"


class RankTrainer:
    def __init__(
        self, rank: int, world: int, model: Any, pad_id: int, grpo: GRPOConfig, trainer: TrainerConfig
    ) -> None:
        self.rank, self.world, self.grpo, self.cfg = rank, world, grpo, trainer
        self.device = rank_device(trainer)
        params = sum(p.numel() for p in model.parameters())
        refuse_if_it_does_not_fit(params, trainer, *_available(self.device, trainer))
        policy = prepare_policy(model, trainer).to(self.device)
        with collective_fault(rank, "sharding the policy"):
            self.policy = shard(policy, trainer)
        self.options = TrainOptions.of(trainer, pad_id, self.device)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=grpo.lr, weight_decay=0.0)
        self.steps = 0

    def step(self, items: Sequence[TrainItem], token_count: float) -> LossStats:
        """One GRPO step on this rank's shard; its shares of the batch's loss figures."""
        return self.step_batch([items], [token_count])

    def step_batch(self, parts: Sequence[Sequence[TrainItem]], token_counts: Sequence[float]) -> LossStats:
        """A batch's update: one GRPO step per minibatch, on this rank's share of each
        (`rlsched.rl.update.update_batch`); its shares of the loss figures, averaged over the steps."""
        first, last = self.steps + 1, self.steps + len(parts)
        steps = f"training step {first}" if first == last else f"training steps {first}-{last}"
        with collective_fault(self.rank, steps):
            stats = update_batch(
                self.policy,
                self.optimizer,
                parts,
                self.grpo,
                steps_done=self.steps,
                token_counts=token_counts,
                options=self.options,
                reduce_grads=None if self.cfg.sharded else all_reduce_grads,
                agree_passes=(lambda n: agreed_passes(n, self.device)) if self.cfg.sharded else None,
            )
        self.steps += len(parts)
        return stats

    def published(self, *, everywhere: bool = False) -> bytearray | None:
        """The policy's weights as BF16 safetensors bytes on rank 0, or on every rank when asked
        (None on the others). Each tensor is gathered, cast and written to its place in the file at
        once (`rlsched.model.writer`): one copy of the weights, plus the tensor in hand."""
        keep = everywhere or self.rank == 0
        writer = SafetensorsWriter(published_specs(self.policy), {"format": "pt"}) if keep else None
        with collective_fault(self.rank, "gathering the weights"):
            for name, tensor in full_state(self.policy):
                if writer is not None:
                    writer.put(name, tensor.detach().to("cpu", torch.bfloat16))
        if writer is None:
            return None
        assert writer.done
        return writer.buffer

    def save_state(self, directory: Path) -> None:
        """Write this rank's share of the training state (`rlsched.rl.train_state`; every rank calls)."""
        with collective_fault(self.rank, "saving a checkpoint"):
            save_state(directory, self.rank, self.policy, self.optimizer, self.steps)

    def load_state(self, directory: Path) -> int:
        """Load the training state a checkpoint holds (every rank calls); the step it resumes after."""
        with collective_fault(self.rank, "loading a checkpoint"):
            self.steps = load_state(directory, self.rank, self.policy, self.optimizer)
        return self.steps

    def held(self) -> HeldBytes:
        return held_bytes(self.policy, self.optimizer)

    def barrier(self) -> None:
        if dist.is_initialized():
            with collective_fault(self.rank, "a barrier"):
                dist.barrier()
