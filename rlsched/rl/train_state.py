"""A training rank's state on disk: the fp32 policy and its AdamW state through
`torch.distributed.checkpoint`, and the rank's step count and torch RNG beside them.

Every rank of the group calls `save_state` and `load_state` together: under fsdp each writes its own
shards, under replicate the planner writes each replicated tensor once. The files record each
tensor's global shape and where each piece lies, so a checkpoint saved by N ranks loads into M ranks,
with either strategy: each loading rank reads the pieces its own layout needs. The step count and
learning-rate schedule come back with the optimizer; a rank with no RNG file of its own (more ranks
than saved) keeps the seed it started with.

The BF16 weights the instances serve are published from these fp32 masters, so a resumed job
continues bit for bit where the engine is deterministic.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlsched.errors import UserError

STATE_DIR = "train_state"


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it runs in one process when no process group exists: that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank_file(directory: Path, rank: int) -> Path:
    return directory / STATE_DIR / f"rank-{rank}.pt"


def save_state(directory: Path, rank: int, policy: Any, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """This rank's part of the training state under `directory/train_state/` (a collective)."""
    model_sd, optim_sd = get_state_dict(policy, optimizer)
    target = directory / STATE_DIR
    target.mkdir(parents=True, exist_ok=True)
    with _quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=target)
    torch.save({"steps": steps, "rng": torch.get_rng_state()}, _rank_file(directory, rank))


def load_state(directory: Path, rank: int, policy: Any, optimizer: torch.optim.Optimizer) -> int:
    """Load the training state into this rank's policy and optimizer (a collective); the step count."""
    target = directory / STATE_DIR
    if not (target / ".metadata").is_file():
        raise UserError(f"{directory} holds no training state ({STATE_DIR}/.metadata is missing)")
    model_sd, optim_sd = get_state_dict(policy, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    try:
        with _quiet():
            dcp.load(state, checkpoint_id=target)
    except CheckpointException as err:  # each rank's failure, with its traceback
        first = next((str(f[0]) for f in err.failures.values() if isinstance(f, tuple)), "unreadable")
        raise UserError(
            f"the checkpoint at {directory} does not fit this model ({first}); it was saved from a "
            "different model: resume with the model.checkpoint the run started from"
        ) from None
    set_state_dict(policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    own = _rank_file(directory, rank)
    fallback = _rank_file(directory, 0)
    extra = torch.load(own if own.is_file() else fallback, weights_only=True)
    if own.is_file():
        torch.set_rng_state(extra["rng"])
    return int(extra["steps"])
