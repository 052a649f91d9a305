"""Which samples an update trains on, and with what advantage: the assembly rule, written once.

A group (the `group_size` samples of one prompt, consecutive in the request order) is used whole or
not at all: every member must be judged (a `Verdict`; an execution fault leaves the group out, never
scored zero) and, with `oldest` given, generated at an admissible version (else the group is
dropped as stale, `rlsched.policy.versions`). Advantages are group-relative (`group_advantages`),
over all kept groups at once. The `--local` loop and the Ray controller both assemble with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlsched.engine.protocol import RequestId, Sample
from rlsched.rl.grpo import group_advantages
from rlsched.rl.update import TrainItem
from verifiers.protocol import ExecutionFault, Outcome, Verdict


@dataclass(frozen=True)
class Assembled:
    items: list[TrainItem]
    faults: int  # samples of left-out groups that ended in an execution fault
    stale_dropped: int  # samples of groups dropped for an inadmissible version
    used: tuple[RequestId, ...] = ()  # the samples trained on, in the items' order


def assemble(
    request_ids: Sequence[RequestId],
    samples: Mapping[RequestId, Sample],
    outcomes: Mapping[RequestId, Outcome],
    group_size: int,
    oldest: int | None = None,
) -> Assembled:
    kept: list[Sequence[RequestId]] = []
    rewards: list[list[float]] = []
    faults = stale = 0
    for start in range(0, len(request_ids), group_size):
        group = request_ids[start : start + group_size]
        judged = [outcomes.get(r) for r in group]
        if not all(isinstance(o, Verdict) for o in judged):
            faults += sum(isinstance(o, ExecutionFault) for o in judged)
            continue
        if oldest is not None and any(samples[r].oldest_version < oldest for r in group):
            stale += len(group)
            continue
        kept.append(group)
        rewards.append([o.reward for o in judged if isinstance(o, Verdict)])
    if not rewards:
        return Assembled([], faults, stale)
    used = tuple(r for group in kept for r in group)
    advantages = group_advantages(torch.tensor(rewards)).tolist()
    items = [
        TrainItem(samples[r].prompt_ids, samples[r].token_ids, samples[r].logprobs, float(a))
        for group, row in zip(kept, advantages, strict=True)
        for r, a in zip(group, row, strict=True)
    ]
    return Assembled(items, faults, stale, used)
