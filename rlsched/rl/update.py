"""One GRPO update of a policy from judged samples: what a single process and each Ray rank run.

A `TrainItem` is all an update needs of a sample: its prompt and completion ids, the log-probs the
engine reported when it sampled them, and its advantage. Data-parallel ranks each take a shard,
divide by the whole batch's token count, and sum their gradients through `reduce_grads` (an
all-reduce), so every rank applies the same step and their weights stay identical.

Within a rank the shard runs in micro-batches of at most `TrainOptions.micro_batch_tokens` padded
tokens, gradients accumulating; the loss of each is already divided by the whole batch's token
count, so the sum is the gradient of one token-level mean whatever the split. Optional BF16
autocast (fp32 master weights, BF16 matmuls: AMX on CPUs that have it, tensor cores on GPUs) and
gradient checkpointing trade precision and recomputation for speed and memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlsched.config import Correction, GRPOConfig, Precision, TrainerConfig
from rlsched.model.precision import autocast
from rlsched.rl.batching import PackedBatch, micro_batches, pack, sequence_logprobs
from rlsched.rl.grpo import LossStats, grpo_loss, mean_of


def set_warmup_lr(optimizer: torch.optim.Optimizer, cfg: GRPOConfig, step: int) -> float:
    """The learning rate of 0-based `step`: linear warm-up over `cfg.warmup_steps`, then `cfg.lr`
    (the one schedule both the in-process loop and every Ray rank follow); set on every group."""
    warm = cfg.warmup_steps
    lr = cfg.lr * (min(1.0, (step + 1) / warm) if warm else 1.0)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


@dataclass(frozen=True)
class TrainItem:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantage: float
    # per token of `token_ids`, 1 where the loss is taken; empty: every token. A multi-turn episode
    # masks what the model did not sample (tool results, the template's tokens between turns)
    mask: tuple[float, ...] = ()
    # per token of `token_ids`, the proximal policy's log-probs (the trainer's before this batch's
    # first optimizer step); filled by `update_batch` when the correction needs them
    prox_logprobs: tuple[float, ...] = ()

    @property
    def trained_tokens(self) -> float:
        return float(sum(self.mask)) if self.mask else float(len(self.token_ids))


CPU = torch.device("cpu")


@dataclass(frozen=True)
class TrainOptions:
    pad_id: int = 0
    micro_batch_tokens: int = 16384
    precision: Precision = Precision.AUTO
    device: torch.device = CPU

    @classmethod
    def of(cls, cfg: TrainerConfig, pad_id: int, device: torch.device | None = None) -> TrainOptions:
        return cls(
            pad_id=pad_id,
            micro_batch_tokens=cfg.micro_batch_tokens,
            precision=cfg.precision,
            device=device or CPU,
        )


def prepare_policy(model: Any, cfg: TrainerConfig) -> Any:
    """The policy in train mode, with gradient checkpointing where asked."""
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model.train()


def idle_pass(model: Any, pad_id: int, device: torch.device) -> None:
    """A forward and backward that changes no gradient (zero loss) but joins every layer's
    collectives, for a rank with fewer micro-batches than its peers (FSDP, `rlsched.rl.sharding`). Here rather
    than there so that what imports the update (a rollout instance builds train items) does not pay
    for importing FSDP."""
    ids = torch.tensor([[pad_id]], device=device)
    logits = model(input_ids=ids, use_cache=False).logits
    (logits.float().sum() * 0.0).backward()


def _autocast(opts: TrainOptions) -> contextlib.AbstractContextManager[Any]:
    return autocast(opts.precision, opts.device.type)


def _chunks(items: Sequence[TrainItem], opts: TrainOptions) -> list[tuple[list[int], PackedBatch]]:
    """The micro-batches: each one's item positions and its packed batch."""
    lengths = [len(i.prompt_ids) + len(i.token_ids) for i in items]
    out = []
    for group in micro_batches(lengths, opts.micro_batch_tokens):
        chosen = [items[i] for i in group]
        masks = [i.mask or None for i in chosen]
        batch = pack([i.prompt_ids for i in chosen], [i.token_ids for i in chosen], opts.pad_id, masks)
        out.append((list(group), batch.to(opts.device)))
    return out


def _per_token(values: Sequence[tuple[float, ...]], batch: PackedBatch) -> torch.Tensor:
    out = torch.zeros_like(batch.loss_mask)
    for row, (v, sl) in enumerate(zip(values, batch.completion_slices, strict=True)):
        out[row, sl] = torch.tensor(v)
    return out


def _micro_step(
    policy: Any,
    reference: Any | None,
    items: list[TrainItem],
    batch: PackedBatch,
    cfg: GRPOConfig,
    opts: TrainOptions,
    token_count: float,
) -> LossStats:
    ref = None
    with _autocast(opts):
        if reference is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                ref = sequence_logprobs(reference, batch)
        new = sequence_logprobs(policy, batch)
    proximal = cfg.correction in (Correction.NONE, Correction.DECOUPLED)
    if proximal and any(len(i.prox_logprobs) != len(i.token_ids) for i in items):
        raise ValueError(f"correction {cfg.correction} needs the proximal log-probs: run update_batch")
    prox = _per_token([i.prox_logprobs for i in items], batch) if proximal else None
    loss, stats = grpo_loss(
        new,
        _per_token([i.logprobs for i in items], batch),
        torch.tensor([i.advantage for i in items], device=opts.device),
        batch.loss_mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        ref_logp=ref,
        kl_coef=cfg.kl_coef,
        token_count=token_count,
        correction=cfg.correction,
        prox_logp=prox,
        cap=cfg.importance_cap,
    )
    loss.backward()
    return stats


def grpo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    items: Sequence[TrainItem],
    cfg: GRPOConfig,
    *,
    options: TrainOptions | None = None,
    reference: Any | None = None,
    token_count: float | None = None,
    reduce_grads: Callable[[Any], None] | None = None,
    agree_passes: Callable[[int], int] | None = None,
) -> LossStats:
    """One optimizer step on `items`. Data-parallel ranks pass `token_count` (the whole batch's),
    `reduce_grads` (replicate: sum the gradients) or `agree_passes` (fsdp: the micro-batch count all
    ranks make, given this rank's; the passes it lacks are idle ones)."""
    opts = options or TrainOptions()
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    total = token_count if token_count is not None else sum(i.trained_tokens for i in items)
    stats = LossStats(0.0, 0.0, 0.0, 0.0)  # this shard's shares; summed over ranks by the caller
    chunks = _chunks(items, opts)
    passes = agree_passes(len(chunks)) if agree_passes is not None else len(chunks)
    for positions, batch in chunks:
        chunk = [items[i] for i in positions]
        stats = stats.plus(_micro_step(policy, reference, chunk, batch, cfg, opts, total))
    for _ in range(passes - len(chunks)):
        with _autocast(opts):
            idle_pass(policy, opts.pad_id, opts.device)
    if passes == 0:  # a rank with an empty shard still takes part in the all-reduce
        for p in policy.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    if reduce_grads is not None:
        reduce_grads(policy)
    norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
    if not finite_norm(norm):  # every rank sees the same (reduced) norm, so all skip together
        optimizer.zero_grad(set_to_none=True)
        return replace(stats, skipped=1)
    optimizer.step()
    return stats


def skipped_note(stats: LossStats, iteration: int) -> str | None:
    """The line that names an iteration's skipped steps, or None when every step was taken."""
    if not stats.skipped:
        return None
    return (
        f"iteration {iteration}: {stats.skipped} update step(s) skipped: the loss or the gradient was "
        "not finite; the weights and the optimizer's state are as they were before them"
    )


def finite_norm(norm: torch.Tensor) -> bool:
    """The gradient's total norm is a finite number (a NaN or infinite loss makes it NaN or inf):
    a step on it would write NaN into every weight and the optimizer's moments. A sharded
    policy's norm is a DTensor, whose whole value every rank holds after the clip's reduction."""
    value = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return bool(torch.isfinite(value).item())


# -- a batch: the proximal policy, then one optimizer step per minibatch ----------------------------


def minibatches(items: Sequence[TrainItem], count: int) -> list[list[TrainItem]]:
    """The batch's `count` minibatches: item i goes to minibatch i mod count."""
    return [list(items[m::count]) for m in range(count)]


def with_proximal(
    policy: Any,
    items: Sequence[TrainItem],
    opts: TrainOptions,
    agree_passes: Callable[[int], int] | None = None,
) -> list[TrainItem]:
    """`items` with the policy's own log-probs of their completion tokens (`prox_logprobs`), taken
    before any step on them; ranks of a sharded policy make the same number of forward passes."""
    out = list(items)
    chunks = _chunks(items, opts)
    passes = agree_passes(len(chunks)) if agree_passes is not None else len(chunks)
    with torch.no_grad():
        for positions, batch in chunks:
            with _autocast(opts):
                logp = sequence_logprobs(policy, batch).float().cpu()
            for row, (n, sl) in enumerate(zip(positions, batch.completion_slices, strict=True)):
                out[n] = replace(items[n], prox_logprobs=tuple(logp[row, sl].tolist()))
        for _ in range(passes - len(chunks)):
            with _autocast(opts):
                policy(input_ids=torch.tensor([[opts.pad_id]], device=opts.device), use_cache=False)
    return out


def update_batch(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    parts: Sequence[Sequence[TrainItem]],
    cfg: GRPOConfig,
    *,
    steps_done: int,
    token_counts: Sequence[float] | None = None,
    options: TrainOptions | None = None,
    reference: Any | None = None,
    reduce_grads: Callable[[Any], None] | None = None,
    agree_passes: Callable[[int], int] | None = None,
) -> LossStats:
    """One batch's update: the proximal policy's log-probs first where the correction needs them,
    then one optimizer step per minibatch of `parts` (this rank's share of each, with the whole
    minibatch's token count), its learning rate by the steps done before it."""
    opts = options or TrainOptions()
    if cfg.correction in (Correction.NONE, Correction.DECOUPLED):
        flat = with_proximal(policy, [i for part in parts for i in part], opts, agree_passes)
        sizes = [len(part) for part in parts]
        parts = [flat[sum(sizes[:m]) : sum(sizes[: m + 1])] for m in range(len(parts))]
    counts = token_counts or [sum(i.trained_tokens for i in part) for part in parts]
    figures = []
    for m, (part, tokens) in enumerate(zip(parts, counts, strict=True)):
        set_warmup_lr(optimizer, cfg, steps_done + m)
        figures.append(
            grpo_update(
                policy,
                optimizer,
                part,
                cfg,
                options=opts,
                reference=reference,
                token_count=tokens,
                reduce_grads=reduce_grads,
                agree_passes=agree_passes,
            )
        )
    return mean_of(figures)
