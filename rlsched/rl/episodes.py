"""Captured episodes as a GRPO batch: what the trainer takes from the OpenAI endpoint.

Each ready episode (ended, rewarded, stitched into one sequence: `rlsched.serve.episodes`) becomes
one `TrainItem`: the first turn's prompt, then everything after it with the loss on the tokens the
engine sampled only (tool results and the template's tokens between turns are masked), and the
behaviour log-probs the engine reported for them. Episodes sharing a `group_id` form a GRPO group;
the advantage is the reward minus the group's mean over its standard deviation, and a group of one
carries no signal (advantage 0), as a group whose rewards are all equal. Episodes that are not one
sequence (a client edited its history) or that mixed weight versions are left out, and counted, unless
`keep_mixed` (their per-token behaviour log-probs then stand for the policy that sampled each token).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlsched.rl.grpo import group_advantages
from rlsched.rl.update import TrainItem
from rlsched.serve.episodes import Episode, training_sequence


@dataclass(frozen=True)
class EpisodeBatch:
    items: list[TrainItem]
    episode_ids: list[str]
    not_stitched: list[str]  # left out: not one token sequence
    mixed: list[str]  # left out: sampled by more than one version (unless kept)


def episode_batch(episodes: Sequence[Episode], keep_mixed: bool = False) -> EpisodeBatch:
    """Rewarded, ended episodes -> train items with group-relative advantages."""
    not_stitched = [e.id for e in episodes if not e.stitched]
    mixed = [e.id for e in episodes if e.stitched and e.mixed and not keep_mixed]
    usable = [e for e in episodes if e.id not in set(not_stitched) | set(mixed)]
    for e in usable:
        if e.reward is None:
            raise ValueError(f"episode {e.id} has no reward yet; train on ready episodes only")
    groups: dict[str, list[Episode]] = defaultdict(list)
    for e in usable:
        groups[e.group_id].append(e)
    advantage: dict[str, float] = {}
    for members in groups.values():
        if len(members) < 2:
            advantage[members[0].id] = 0.0
            continue
        rewards = torch.tensor([[float(m.reward or 0.0) for m in members]])
        for m, a in zip(members, group_advantages(rewards)[0].tolist(), strict=True):
            advantage[m.id] = a
    items = []
    for e in usable:
        seq = training_sequence(e)
        items.append(TrainItem(seq.prompt_ids, seq.token_ids, seq.logprobs, advantage[e.id], seq.mask))
    return EpisodeBatch(items, [e.id for e in usable], not_stitched, mixed)
