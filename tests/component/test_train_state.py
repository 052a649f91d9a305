"""A training state saved by two gloo ranks (replicate or FSDP2 shards) and loaded by one: the resumed
rank's next step is the step the two would have made (same loss, same weights), so a job resumes on a
different number of ranks. A checkpoint of a different model is refused by name."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load

from rlsched.config import GRPOConfig, TrainerConfig
from rlsched.errors import UserError
from rlsched.model.checkpoint import load_checkpoint
from rlsched.rl.rank import RankTrainer
from rlsched.rl.sharding import join_group
from rlsched.rl.update import TrainItem

pytestmark = pytest.mark.slow  # two spawned processes that import torch, per strategy

WORLD = 2
GRPO = GRPOConfig(lr=1e-2, warmup_steps=3)  # the warm-up's step count must come back too


def _address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _items(seed: int) -> list[TrainItem]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        prompt = torch.randint(4, 300, (6 + i,), generator=gen).tolist()
        tokens = torch.randint(4, 300, (5 + 2 * i,), generator=gen).tolist()
        out.append(TrainItem(tuple(prompt), tuple(tokens), tuple([-5.0] * len(tokens)), 1.0 - 0.5 * i))
    return out


def _step(trainer: RankTrainer, items: list[TrainItem], rank: int, world: int) -> float:
    total = float(sum(len(i.token_ids) for i in items))
    return trainer.step(items[rank::world], total).loss


def _rank(rank: int, address: str, strategy: str, directory: str, queue: Any) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # fp32: a resumed step equals the uninterrupted one to the last bits only there (auto is bf16 on a
    # CPU with BF16 units, where the strategies round differently)
    cfg = TrainerConfig(ranks=WORLD, strategy=strategy, micro_batch_tokens=64, precision="fp32")
    join_group(address, rank, WORLD, cfg.collective_timeout_s, torch.device("cpu"))
    trainer = RankTrainer(rank, WORLD, load_checkpoint(None).model, 3, GRPO, cfg)
    _step(trainer, _items(1), rank, WORLD)
    trainer.save_state(Path(directory))
    loss = _step(trainer, _items(2), rank, WORLD)  # what the resumed rank must reproduce
    blob = trainer.published()
    queue.put((rank, loss, None if blob is None else bytes(blob)))
    dist.destroy_process_group()


def _two_ranks(strategy: str, directory: Path) -> tuple[float, dict[str, torch.Tensor]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    address = _address()
    procs = [
        ctx.Process(target=_rank, args=(r, address, strategy, str(directory), queue)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    got = {r: (loss, blob) for r, loss, blob in (queue.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return got[0][0] + got[1][0], load(got[0][1])


@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
def test_two_ranks_save_one_rank_resumes_the_same_step(strategy: str, tmp_path: Path) -> None:
    loss_two, weights_two = _two_ranks(strategy, tmp_path)
    assert (tmp_path / "train_state" / ".metadata").is_file()
    cfg = TrainerConfig(ranks=1, micro_batch_tokens=64, precision="fp32")  # as the two ranks trained
    one = RankTrainer(0, 1, load_checkpoint(None).model, 3, GRPO, cfg)
    assert one.load_state(tmp_path) == 1  # the step count, and with it the warm-up's learning rate
    loss_one = _step(one, _items(2), 0, 1)
    assert loss_one == pytest.approx(loss_two, rel=1e-4, abs=1e-6)
    weights_one = load(bytes(one.published()))
    worst = max((weights_one[k].float() - weights_two[k].float()).abs().max().item() for k in weights_two)
    assert worst <= 2**-7  # at most one BF16 rounding apart (reduction order differs)


def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    small = torch.nn.Sequential(torch.nn.Linear(4, 3))
    trainer = RankTrainer(0, 1, load_checkpoint(None).model, 3, GRPO, TrainerConfig(ranks=1))
    from rlsched.rl.train_state import save_state

    save_state(tmp_path, 0, small, torch.optim.AdamW(small.parameters()), 5)
    with pytest.raises(UserError, match="different model"):
        trainer.load_state(tmp_path)
