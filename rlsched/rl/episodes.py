"""Captured episodes as a GRPO batch: what the trainer takes from the OpenAI endpoint.

Each ready episode (ended, rewarded, stitched into one sequence: `rlsched.serve.episodes`) becomes
one `TrainItem`: the first turn's prompt, then everything after it with the loss on the tokens the
engine sampled only (tool results and the template's tokens between turns are masked), and the
behaviour log-probs the engine reported for them. Episodes sharing a `group_id` form a GRPO group;
the advantage is the reward minus the group's mean over its standard deviation, and a group of one
carries no signal (advantage 0), as a group whose rewards are all equal. Episodes that are not one
sequence (a client edited its history) or that mixed weight versions are left out, and counted, unless
`keep_mixed` (their per-token behaviour log-probs then stand for the policy that sampled each token).

A job's driver meets its endpoint's episodes here too, on Ray and in `--local` alike: those to judge
as samples (`judgeable_sample`), the verdicts sent back (`send_rewards`), and those ready at an update
as train items, one older than the update's bound dropped as a sample would be (`endpoint_items`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlsched.engine.protocol import FinishReason, RequestId, Sample, WeightVersion
from rlsched.rl.grpo import group_advantages
from rlsched.rl.task import JsonlProblem
from rlsched.rl.update import TrainItem
from rlsched.serve.episodes import Episode, training_sequence
from rlsched.serve.hosted import Judgeable
from verifiers.protocol import Outcome, Verdict


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


# -- an endpoint's episodes in a job -----------------------------------------------------------------


def judgeable_sample(j: Judgeable) -> tuple[Sample, JsonlProblem]:
    """An ended episode's final answer as a sample (`episode/ID`) and its reference as the problem."""
    sample = Sample(
        RequestId(f"episode/{j.episode_id}"), (), j.token_ids, (0.0,) * len(j.token_ids), j.text,
        FinishReason.STOP, WeightVersion(j.version),
    )  # fmt: skip
    return sample, JsonlProblem(j.episode_id, (), j.reference)


def send_rewards(
    judging: dict[RequestId, str],
    outcomes: dict[RequestId, Outcome],
    judged: Callable[[str, float], None],
    log: Callable[[str], None],
) -> dict[str, int]:
    """The verifier's rewards for the offered episodes in `judging` (sample id -> episode id), each
    sent with `judged`; their outcomes leave `outcomes` (and `judging`). One the verifier could not
    judge waits for the endpoint's reward timeout."""
    counts = {"episodes_judged": 0, "episodes_unjudged": 0}
    for rid in [r for r in judging if r in outcomes]:
        episode_id, outcome = judging.pop(rid), outcomes.pop(rid)
        if isinstance(outcome, Verdict):
            judged(episode_id, outcome.reward)
            counts["episodes_judged"] += 1
        else:
            counts["episodes_unjudged"] += 1
            log(f"episode {episode_id}: the verifier could not judge it ({outcome.detail})")
    return counts


def endpoint_items(
    taken: Sequence[Episode], oldest: int, keep_mixed: bool
) -> tuple[list[TrainItem], list[tuple[str, str]], dict[str, int]]:
    """Episodes taken at an update: their train items, each one's sample id and how it was consumed,
    and the counts of those taken, trained and left out. One whose oldest turn is older than `oldest`
    (the update's bound, the pipeline's) is dropped as a sample would be."""
    stale = {e.id for e in taken if e.versions and min(e.versions) < oldest}
    batch = episode_batch([e for e in taken if e.id not in stale], keep_mixed=keep_mixed)
    trained = set(batch.episode_ids)
    how = {e.id: "episode_stale" if e.id in stale else "episode_left_out" for e in taken}
    how |= dict.fromkeys(trained, "episode")
    consumed = [(f"episode/{e.id}", how[e.id]) for e in taken]
    counts = {
        "episodes": len(taken),
        "episodes_trained": len(batch.items),
        "episodes_mixed_dropped": len(batch.mixed),
        "episodes_not_stitched": len(batch.not_stitched),
        "episodes_stale_dropped": len(stale),
    }
    return batch.items, consumed, counts
