"""What to do with the saved output of a reclaimed instance's requests: cut groups back, then resume
or restart (SPEC section 2).

Group truncation: the interrupted members of one group share their sampling parameters and go back
out together, so they continue from one common length: the shortest saved among the *unfinished*
members. Members that had already finished keep their whole output and are not resubmitted
(4000 and 1000 tokens saved: both continue from 1000; 2000 tokens are reused, 3000 regenerated).

Resume or restart: resuming prefills prompt + saved tokens and continues; restarting prefills the
prompt and decodes the saved length again. Resuming pays `setup_s` plus the prefill of the saved
prefix; it saves the decode of those tokens. It is not always cheaper (the SPEC's measurement: 96
saved tokens took 12.8 s to resume against 11.6 s from scratch), so the choice is the smaller
expected time. Pure arithmetic; rates in tokens per second.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum


def truncate_group(saved: Mapping[str, int], finished: Collection[str]) -> dict[str, int]:
    """Each unfinished member's resume length: the shortest saved length among the unfinished."""
    if any(n < 0 for n in saved.values()):
        raise ValueError("saved lengths must be non-negative")
    unfinished = {m: n for m, n in saved.items() if m not in finished}
    if not unfinished:
        return {}
    cut = min(unfinished.values())
    return dict.fromkeys(unfinished, cut)


def reuse(saved: Mapping[str, int], cut: Mapping[str, int]) -> tuple[int, int]:
    """(tokens reused, tokens to regenerate) when `saved` lengths are cut back to `cut`."""
    return sum(cut.values()), sum(saved[m] - cut[m] for m in cut)


class Restart(StrEnum):
    RESUME = "resume"  # prefill prompt + saved output, continue after it
    RESTART = "restart"  # start over from the prompt


@dataclass(frozen=True)
class ResumeCost:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    setup_s: float = 0.0  # what resuming adds beyond prefill (re-queueing, a cold prefix cache)

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0 or self.setup_s < 0:
            raise ValueError("token rates must be positive and setup_s non-negative")


@dataclass(frozen=True)
class ResumeChoice:
    choice: Restart
    resume_s: float  # until the request is back where it was
    restart_s: float


def resume_or_restart(prompt_tokens: int, saved_tokens: int, cost: ResumeCost) -> ResumeChoice:
    """The cheaper way back to `saved_tokens` of output; nothing saved means restart."""
    resume_s = cost.setup_s + (prompt_tokens + saved_tokens) / cost.prefill_tokens_per_s
    restart_s = prompt_tokens / cost.prefill_tokens_per_s + saved_tokens / cost.decode_tokens_per_s
    better = Restart.RESUME if saved_tokens > 0 and resume_s < restart_s else Restart.RESTART
    return ResumeChoice(better, resume_s, restart_s)
