"""How a training rank holds the policy, and the collectives that keep the ranks in step.

Two strategies (`TrainStrategy`), picked by `trainer.strategy`:

- **replicate**: every rank a full fp32 copy. Each runs forward and backward on its shard of the
  batch, then the gradients are all-reduced (`all_reduce_grads`), so every rank applies one step.
- **fsdp**: FSDP2's `fully_shard` on each decoder layer (the classes the model names in
  `_no_split_modules`) and on the root, over the gang's process group. A rank keeps 1/N of every
  parameter, its gradient and its AdamW state (DTensors). A layer's full weights exist only while it
  runs: all-gathered before, freed after. Gradients are reduce-scattered as backward leaves each
  layer, summed rather than averaged (each rank's loss is already its share of the batch's mean).
  BF16 precision becomes FSDP's mixed precision: BF16 parameters for compute, fp32 gradient
  reduction and fp32 masters.

Under fsdp every forward and backward takes part in each layer's collectives, so all ranks must make
the same number of passes in a step: `agreed_passes` asks the group for the largest micro-batch
count, and a rank short of it makes idle passes (`rlsched.rl.update.idle_pass`: one pad token, zero
loss).

Every collective runs in a process group made with `trainer.collective_timeout_s` (gloo's default
is 30 minutes). `collective_fault` turns the backend's timeout or lost-peer error into a
`CollectiveFault` naming the rank that saw it, and the training group names the ranks that never
answered (`actors.trainer`), instead of a gang that hangs.

`held_bytes` counts what a rank holds by tensor (its local shards only), the figure the memory
benchmark (`scripts/bench_fsdp.py`) compares across strategies. Before it shards, a rank checks that
its training state (16 bytes a parameter, 1/N of it under fsdp) fits where it will live, and
refuses with the numbers when it does not (`refuse_if_it_does_not_fit`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlsched.config import Precision, TrainerConfig, TrainStrategy
from rlsched.errors import CollectiveFault, UserError
from rlsched.model.checkpoint import published_state
from rlsched.model.precision import train_precision


def join_group(init_method: str, rank: int, world: int, timeout_s: float, device: torch.device) -> None:
    """This process's place in the gang's process group: NCCL between GPUs, gloo otherwise."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )


def rank_device(cfg: TrainerConfig) -> torch.device:
    """The device a rank computes on: its GPU when it holds one (Ray sets CUDA_VISIBLE_DEVICES)."""
    gpu = cfg.gpus_per_rank > 0 and torch.cuda.is_available()
    return torch.device("cuda" if gpu else "cpu")


@contextlib.contextmanager
def collective_fault(rank: int, what: str) -> Iterator[None]:
    """Run collectives; a backend error (a peer died, or did not answer in time) becomes a
    `CollectiveFault` naming this rank and what it was doing."""
    try:
        yield
    except (RuntimeError, dist.DistError) as err:  # DistBackendError, gloo's timeouts: RuntimeError
        if isinstance(err, CollectiveFault) or not _is_collective_error(err):
            raise
        raise CollectiveFault(rank, what, str(err).splitlines()[0][:300]) from err


def _is_collective_error(err: BaseException) -> bool:
    text = str(err).lower()
    markers = ("timed out", "timeout", "connection", "peer", "closed", "broken pipe")
    return isinstance(err, dist.DistError) or any(m in text for m in markers)


# -- sharding ---------------------------------------------------------------------------------------


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class it names in `_no_split_modules` (every HF
    causal LM names its decoder layer there)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


def shard(model: torch.nn.Module, cfg: TrainerConfig) -> torch.nn.Module:
    """The policy as the strategy holds it: untouched for replicate, FSDP2 units for fsdp. A single
    rank has nothing to share its state with, so fsdp at N = 1 is a replica too (unless it offloads):
    the gathers would copy every layer twice a pass for nothing (1.7x the step time on SmolLM2)."""
    alone = not dist.is_initialized() or dist.get_world_size() == 1
    if cfg.strategy is TrainStrategy.REPLICATE or (alone and not cfg.offload):
        return model
    mixed = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if train_precision(cfg.precision, _device_type(model)) is Precision.BF16
        else MixedPrecisionPolicy()
    )
    options: dict[str, Any] = {"mp_policy": mixed}
    if cfg.offload:
        options["offload_policy"] = CPUOffloadPolicy()
    units = [*decoder_layers(model), model]
    for unit in units:
        fully_shard(unit, **options)
        # each rank's loss is already its share of the whole batch's mean: sum, do not average
        cast(FSDPModule, unit).set_gradient_divide_factor(1.0)
        cast(FSDPModule, unit).set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum every gradient over the ranks (replicate; FSDP reduce-scatters its own)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def agreed_passes(own: int, device: torch.device) -> int:
    """The largest micro-batch count of any rank, which every rank then makes."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return own
    count = torch.tensor([own], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: its shard of a DTensor, a plain tensor whole."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every published tensor by HF name (`published_state`: a tied head is left to its embedding),
    whole, one at a time. For a sharded model each is an all-gather every rank must join, in order."""
    for name, tensor in published_state(model).items():
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


# -- memory -----------------------------------------------------------------------------------------

STATE_BYTES_PER_PARAM = 16  # fp32 master, fp32 gradient, AdamW's two fp32 moments

# A rank's process environment. glibc raises its mmap threshold each time a large block is freed, so
# after a few steps FSDP's per-layer gather and reduce buffers (megabytes each, freed every pass) come
# from the heap and are never given back: SmolLM2 at N = 2 grew to 3.0 GiB RSS for 1.0 GiB of live
# tensors. A fixed threshold keeps them mmap'ed and returned on free (1.4 GiB; replicas: 2.7 -> 2.4).
RANK_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def state_bytes_per_rank(params: int, cfg: TrainerConfig) -> int:
    """What one rank's training state takes: all of it for a replica, 1/N of it under fsdp."""
    share = cfg.ranks if cfg.strategy is TrainStrategy.FSDP else 1
    return STATE_BYTES_PER_PARAM * params // share


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def refuse_if_it_does_not_fit(params: int, cfg: TrainerConfig, available: int | None, where: str) -> None:
    """A `UserError` with the numbers when the ranks' training state cannot fit in `available` bytes
    of `where` (a GPU's free memory, or the host's for ranks packed on one node)."""
    if available is None:
        return
    need = state_bytes_per_rank(params, cfg)
    on_host = where == "host memory"
    together = cfg.ranks if on_host and cfg.placement_strategy.value == "STRICT_PACK" else 1
    if need * together <= available:
        return
    gib = 1 << 30
    share = f"/ {cfg.ranks} ranks" if cfg.strategy is TrainStrategy.FSDP else "(a full replica)"
    packed = f" x {together} ranks on one node" if together > 1 else ""
    raise UserError(
        f"the training state does not fit: {params / 1e6:.1f}M parameters x {STATE_BYTES_PER_PARAM} bytes "
        f"{share} = {need / gib:.2f} GiB per rank{packed}, "
        f"but {where} has {available / gib:.2f} GiB available (before activations). Use "
        "trainer.strategy=fsdp with more ranks, or ranks with more memory"
    )


@dataclass(frozen=True)
class HeldBytes:
    """What one rank holds for training, by tensor: parameters, gradients, optimizer state."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def _nbytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        part = local(t)
        key = part.untyped_storage().data_ptr()
        if key and key not in seen:
            seen.add(key)
            total += part.untyped_storage().nbytes()
    return total


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> HeldBytes:
    params = list(model.parameters())
    state = (v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return HeldBytes(
        params=_nbytes(iter(params)),
        grads=_nbytes(p.grad for p in params if p.grad is not None),
        optimizer=_nbytes(state),
    )
