"""The durable store's side of a reclaim, for a fleet driver: what a reclaimed instance saved of each
request, the cut the fleet core decided, and the saved log-probabilities stitched back into the
sample the new attempt returns.

The fleet core (`rlsched.core.fleet`) decides who resumes from how many tokens; it never touches the
store. The Ray driver answers its `ReadSaved` with `read`, carries out each `CutSaved` with `cut`
(what the new attempt starts from), and hands every accepted sample to `finish`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from rlsched.engine.protocol import Sample
from rlsched.store.partial import PartialStore, Saved


class ResumeMismatch(RuntimeError):
    """A resumed output that does not start with the tokens it was resumed from: an engine bug."""


@dataclass(frozen=True)
class Stitched:
    sample: Sample
    resumed_from: int  # saved tokens the sample did not generate itself (0: not resumed)
    logprob_drift: float  # the largest difference between the saved and the new log-probabilities


class Resumes:
    def __init__(self, store: PartialStore | None) -> None:
        self.store = store
        self.kept: dict[str, Saved] = {}  # what each requeued request of this iteration starts from

    def reset(self) -> None:
        """A new iteration: request ids of the last one are not seen again."""
        self.kept = {}

    def read(self, requests: Sequence[str]) -> tuple[tuple[str, int], ...]:
        """Output tokens the store holds for each request."""
        return tuple((rid, len(self.store.saved(rid)) if self.store else 0) for rid in requests)

    def cut(self, request_id: str, keep: int) -> Saved:
        kept = self.store.truncate(request_id, keep) if self.store else Saved((), ())
        self.kept[request_id] = kept
        return kept

    def resume_ids(self, request_id: str) -> tuple[int, ...]:
        kept = self.kept.get(request_id)
        return kept.tokens if kept is not None else ()

    def finish(self, sample: Sample) -> Stitched:
        """An accepted sample: its chunks go, and a resumed one gets its saved log-probabilities for
        the tokens it did not generate."""
        rid = sample.request_id
        if self.store is not None:
            self.store.clear([rid])
        kept = self.kept.get(rid)
        if kept is None or not kept.tokens:
            return Stitched(sample, 0, 0.0)
        n = len(kept)
        if sample.token_ids[:n] != kept.tokens:
            raise ResumeMismatch(f"{rid}: the resumed output does not start with its saved tokens")
        drift = max(
            (abs(a - b) for a, b in zip(sample.logprobs[:n], kept.logprobs, strict=True)), default=0.0
        )
        stitched = dataclasses.replace(sample, logprobs=kept.logprobs + sample.logprobs[n:])
        return Stitched(stitched, n, drift)
