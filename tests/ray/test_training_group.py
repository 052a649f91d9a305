"""The training group on a real local Ray cluster: FSDP2 ranks publish what replicas publish, and a
rank that dies or stops answering fails the step with a `TrainingFault` naming it, within the
collective timeout."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import ray
import torch
from safetensors.torch import load

from actors.trainer import FAULT_GRACE_S, TrainingGroup
from rlsched.config import JobConfig, load_config
from rlsched.errors import TrainingFault
from rlsched.model.checkpoint import load_checkpoint, load_state_bytes
from rlsched.rl.update import TrainItem
from rlsched.transfer.client import WeightClient

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

TIMEOUT_S = 3.0


def _items(n: int = 6) -> list[TrainItem]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 300, (5 + i,), generator=gen).tolist()
        tokens = torch.randint(4, 300, (4 + i,), generator=gen).tolist()
        out.append(TrainItem(tuple(prompt), tuple(tokens), tuple([-5.0] * len(tokens)), (-1.0) ** i))
    return out


def _group(*overrides: str) -> tuple[TrainingGroup, JobConfig]:
    cfg = load_config(
        None,
        [
            "grpo.warmup_steps=0",
            "grpo.lr=0.01",
            "trainer.micro_batch_tokens=64",
            "trainer.precision=fp32",  # replicas and shards agree to the last bits only in fp32
            f"trainer.collective_timeout_s={TIMEOUT_S}",
            *overrides,
        ],
    )
    return TrainingGroup(cfg.trainer, cfg.grpo, cfg.weights, None, seed=0).ready(), cfg


@pytest.fixture(scope="module")
def published() -> Iterator[dict[str, tuple[bytes, list[str]]]]:
    """One step and a publication by a replicated and by a sharded group, on the same batch."""
    out = {}
    for strategy in ("replicate", "fsdp"):
        group, _ = _group(f"trainer.strategy={strategy}")
        try:
            group.update(_items())
            meta = group.publish(1)
            with WeightClient(meta.address) as client:
                out[strategy] = (client.pull(meta.version).blob, group.checksums())
            assert len(out[strategy][0]) == meta.nbytes
        finally:
            group.shutdown()
    yield out


def test_sharded_ranks_publish_what_replicas_publish(published: dict[str, tuple[bytes, list[str]]]) -> None:
    rep, shd = load(published["replicate"][0]), load(published["fsdp"][0])
    assert rep.keys() == shd.keys()
    assert max((rep[k].float() - shd[k].float()).abs().max().item() for k in rep) <= 2**-7
    model = load_checkpoint(None).model
    load_state_bytes(model, published["fsdp"][0])  # a whole checkpoint: every tensor, every shape
    for _blob, sums in published.values():
        assert len(set(sums)) == 1  # every rank holds (or gathers) the same weights


def _failed_step(strategy: str, harm: Callable[[TrainingGroup], object]) -> tuple[TrainingFault, float]:
    """A group that made one step, harmed, then asked for another: its fault and how long it took."""
    group, _ = _group(f"trainer.strategy={strategy}")
    try:
        group.update(_items())
        harm(group)
        start = time.monotonic()
        with pytest.raises(TrainingFault) as info:
            group.update(_items())
        return info.value, time.monotonic() - start
    finally:
        group.shutdown()


def test_a_rank_that_stops_answering_fails_the_step_naming_it() -> None:
    def stall(group: TrainingGroup) -> None:  # rank 1 is busy elsewhere, and misses the step's gathers
        group.ranks[1].__ray_call__.remote(lambda _self: time.sleep(4 * TIMEOUT_S))

    fault, took = _failed_step("fsdp", stall)
    assert fault.stuck == (1,) and fault.dead == ()
    assert "rank(s) 1 did not answer" in str(fault)
    assert "rank 0 failed in training step 2" in str(fault)
    assert TIMEOUT_S <= took <= TIMEOUT_S + FAULT_GRACE_S + 5  # not gloo's 30 minutes


def test_a_rank_that_dies_fails_the_step_naming_it() -> None:
    fault, took = _failed_step("replicate", lambda group: ray.kill(group.ranks[1]))
    assert fault.dead == (1,)
    assert "rank(s) 1 died" in str(fault)
    assert took <= TIMEOUT_S + FAULT_GRACE_S + 5
