"""Training ranks as real processes joined by gloo (no Ray): FSDP2 against replicas, uneven shards,
and a stuck peer that fails the step within the collective timeout instead of hanging it."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load

from rlsched.config import GRPOConfig, TrainerConfig
from rlsched.errors import CollectiveFault
from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes
from rlsched.rl.rank import RankTrainer
from rlsched.rl.sharding import join_group
from rlsched.rl.update import TrainItem, minibatches

pytestmark = pytest.mark.slow  # each scenario spawns two processes that import torch

WORLD = 2


def _address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _items(n: int, seed: int = 0) -> list[TrainItem]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 300, (6 + i,), generator=gen).tolist()
        tokens = torch.randint(4, 300, (5 + 2 * i,), generator=gen).tolist()
        out.append(TrainItem(tuple(prompt), tuple(tokens), tuple([-5.0] * len(tokens)), 1.0 - 0.5 * i))
    return out


def _rank(
    rank: int, address: str, overrides: dict[str, Any], steps: int, queue: Any, grpo_kw: dict[str, Any]
) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # fp32: the strategies agree up to the order of additions only there (bf16 autocast and FSDP's bf16
    # parameters round differently, and precision auto is bf16 on a CPU with BF16 units)
    cfg = TrainerConfig(ranks=WORLD, micro_batch_tokens=64, precision="fp32", **overrides)
    join_group(address, rank, WORLD, cfg.collective_timeout_s, torch.device("cpu"))
    grpo = GRPOConfig(lr=1e-2, warmup_steps=0, **grpo_kw)
    trainer = RankTrainer(rank, WORLD, load_checkpoint(None).model, 3, grpo, cfg)
    items = _items(5)
    parts = minibatches(items, grpo.minibatches)  # as the training group splits a batch
    totals = [float(sum(len(i.token_ids) for i in part)) for part in parts]
    losses = []
    for _ in range(steps):  # rank 0: 3 items, rank 1: 2 (of one minibatch)
        losses.append(trainer.step_batch([part[rank::WORLD] for part in parts], totals).loss)
    blob = trainer.published()  # as bytes: a tensor's shared memory would die with this process
    queue.put((rank, losses, trainer.held(), None if blob is None else bytes(blob)))
    # both ranks leave the group together: a rank that exited while its peer's gloo connection was
    # still open was aborted (SIGABRT) once in CI
    dist.barrier()
    dist.destroy_process_group()


def _run(
    overrides: dict[str, Any], steps: int = 2, grpo_kw: dict[str, Any] | None = None
) -> dict[int, tuple[list[float], Any, Any]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    address = _address()
    args = (address, overrides, steps, queue, grpo_kw or {})
    procs = [ctx.Process(target=_rank, args=(r, *args)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, losses, held, blob = queue.get(timeout=120)
        out[rank] = (losses, held, None if blob is None else load(blob))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out


@pytest.fixture(scope="module")
def replicate() -> dict[int, tuple[list[float], Any, Any]]:
    return _run({"strategy": "replicate"})


@pytest.fixture(scope="module")
def fsdp() -> dict[int, tuple[list[float], Any, Any]]:
    return _run({"strategy": "fsdp"})


def test_fsdp_steps_like_replicas_on_uneven_shards(replicate: Any, fsdp: Any) -> None:
    """Rank 0 has more micro-batches than rank 1; both strategies make the same steps."""
    rep = sum(replicate[r][0][-1] for r in range(WORLD))
    shd = sum(fsdp[r][0][-1] for r in range(WORLD))
    assert replicate[0][0][0] + replicate[1][0][0] == pytest.approx(fsdp[0][0][0] + fsdp[1][0][0], abs=1e-5)
    assert shd == pytest.approx(rep, rel=1e-3)  # after one step: the same update, up to reduction order
    a, b = replicate[0][2], fsdp[0][2]
    assert a.keys() == b.keys() and replicate[1][2] is None and fsdp[1][2] is None  # only rank 0 keeps
    moved = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert moved <= 2**-7  # one BF16 rounding apart at most (|w| < 2) after two steps
    start = load(to_bf16_bytes(load_checkpoint(None).model))
    assert max((b[k].float() - start[k].float()).abs().max().item() for k in b) > 1e-2  # and they did step


def test_fsdp_takes_the_proximal_pass_and_minibatch_steps_like_replicas() -> None:
    """The decoupled correction's proximal forward passes and two optimizer steps per batch: the
    ranks of a sharded policy agree on the passes (one rank has fewer items) and step as replicas."""
    kw = {"correction": "decoupled", "minibatches": 2}
    rep, shd = _run({"strategy": "replicate"}, 1, kw), _run({"strategy": "fsdp"}, 1, kw)
    assert sum(rep[r][0][0] for r in range(WORLD)) == pytest.approx(
        sum(shd[r][0][0] for r in range(WORLD)), rel=1e-3
    )
    a, b = rep[0][2], shd[0][2]
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) <= 2**-7


def test_fsdp_holds_half_of_what_a_replica_holds(replicate: Any, fsdp: Any) -> None:
    whole, part = replicate[0][1], fsdp[0][1]
    assert part.params <= 0.55 * whole.params and part.grads <= 0.55 * whole.grads
    assert part.optimizer <= 0.55 * whole.optimizer and whole.optimizer >= 2 * whole.params * 0.99


def _stuck(rank: int, address: str, queue: Any) -> None:
    torch.set_num_threads(1)
    cfg = TrainerConfig(ranks=WORLD, strategy="fsdp", collective_timeout_s=3)
    join_group(address, rank, WORLD, cfg.collective_timeout_s, torch.device("cpu"))
    trainer = RankTrainer(rank, WORLD, load_checkpoint(None).model, 3, GRPOConfig(), cfg)
    if rank == 1:
        queue.put((rank, "asleep", 0.0))
        time.sleep(20)  # stuck: never joins the step's collectives
        return
    start = time.monotonic()
    try:
        trainer.step(_items(2), 20.0)
        queue.put((rank, "finished", time.monotonic() - start))
    except CollectiveFault as err:
        queue.put((rank, str(err), time.monotonic() - start))


def test_a_stuck_peer_fails_the_step_within_the_timeout_naming_the_rank() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    address = _address()
    procs = [ctx.Process(target=_stuck, args=(r, address, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        seen = dict((r, (what, s)) for r, what, s in (queue.get(timeout=120) for _ in procs))
    finally:
        for p in procs:
            p.kill()
    what, seconds = seen[0]
    assert what.startswith("rank 0 failed in training step 1:"), what
    assert 2.5 <= seconds <= 10  # the 3 s timeout, not gloo's 30 minutes
