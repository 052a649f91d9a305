"""What a pipelined job holds between two steps, written with each checkpoint (into the commit log, in
the checkpoint's transaction) so that a resumed job, or a rebuilt training group, neither skips a
problem nor trains a sample past the staleness bound.

After step c an `async` job holds work no committed record names yet:
- judged groups waiting for the trainer (the buffer, and a batch held back for the checkpoint), each
  sample with its tokens, its behaviour log-probs and the version of every token, with its verdicts;
- groups still being generated or judged: only their problems' positions in the training stream are
  kept, and they are generated again;
- the counters the records carry across steps (stale groups dropped, the buffer's peak).

A resume puts the judged groups back into the buffer with the versions that sampled them, so the
pipeline core trains them if they are still within the bound and drops them, counted, if not (a
restored counter, not a reset one: AReaL#1388's bug was a staleness count that started again from
zero after a recovery), and it draws the in-flight problems again before new ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rlsched.engine.protocol import FinishReason, RequestId, Sample, WeightVersion
from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Verdict


@dataclass(frozen=True)
class JudgedGroup:
    wave: int  # the iteration whose requests it answered
    samples: tuple[Sample, ...]
    outcomes: tuple[Outcome, ...]  # in the order of `samples`

    @property
    def request_ids(self) -> tuple[RequestId, ...]:
        return tuple(s.request_id for s in self.samples)


@dataclass(frozen=True)
class PendingWork:
    groups: tuple[JudgedGroup, ...] = ()  # oldest first, as the buffer held them
    problems: tuple[int, ...] = ()  # positions in the training stream of the groups in flight
    dropped_groups: int = 0
    buffer_peak: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "groups": [
                    {
                        "wave": g.wave,
                        "samples": [_sample_json(s) for s in g.samples],
                        "outcomes": [_outcome_json(o) for o in g.outcomes],
                    }
                    for g in self.groups
                ],
                "problems": list(self.problems),
                "dropped_groups": self.dropped_groups,
                "buffer_peak": self.buffer_peak,
            },
            separators=(",", ":"),
        )

    @classmethod
    def of_json(cls, body: str) -> PendingWork:
        raw = json.loads(body)
        groups = tuple(
            JudgedGroup(
                int(g["wave"]),
                tuple(_sample_of(s) for s in g["samples"]),
                tuple(_outcome_of(o) for o in g["outcomes"]),
            )
            for g in raw["groups"]
        )
        return cls(groups, tuple(raw["problems"]), int(raw["dropped_groups"]), int(raw["buffer_peak"]))


def _sample_json(s: Sample) -> dict[str, Any]:
    return asdict(s)


def _sample_of(d: dict[str, Any]) -> Sample:
    return Sample(
        request_id=RequestId(d["request_id"]),
        prompt_ids=tuple(d["prompt_ids"]),
        token_ids=tuple(d["token_ids"]),
        logprobs=tuple(d["logprobs"]),
        text=d["text"],
        finish_reason=FinishReason(d["finish_reason"]),
        weight_version=WeightVersion(d["weight_version"]),
        stop_reason=d["stop_reason"],
        resumed_tokens=d["resumed_tokens"],
        cached_tokens=d["cached_tokens"],
        version_spans=tuple((int(v), int(start)) for v, start in d["version_spans"]),
    )


def _outcome_json(o: Outcome) -> dict[str, Any]:
    return {"verdict": asdict(o)} if isinstance(o, Verdict) else {"fault": asdict(o)}


def _outcome_of(d: dict[str, Any]) -> Outcome:
    if "verdict" in d:
        return Verdict(**d["verdict"])
    fault = dict(d["fault"])
    return ExecutionFault(**(fault | {"kind": FaultKind(fault["kind"])}))


@dataclass
class SampleBook:
    """What a driver holds of each sample until its step is committed or it is dropped: the sample,
    its outcome once judged, and the wave that asked for it."""

    samples: dict[RequestId, Sample] = field(default_factory=dict)
    outcomes: dict[RequestId, Outcome] = field(default_factory=dict)
    wave_of: dict[str, int] = field(default_factory=dict)

    def forget(self, rid: RequestId) -> None:
        self.samples.pop(rid, None)
        self.outcomes.pop(rid, None)
        self.wave_of.pop(rid, None)

    def restore(self, pending: PendingWork, wave: int) -> list[dict[str, int]]:
        """The judged groups a checkpoint held, back in the book as wave `wave`'s; each group's
        samples with the oldest version of their tokens (what the core restores its buffer from)."""
        for g in pending.groups:
            for sample, outcome in zip(g.samples, g.outcomes, strict=True):
                self.samples[sample.request_id] = sample
                self.outcomes[sample.request_id] = outcome
                self.wave_of[sample.request_id] = wave
        return [{str(s.request_id): s.oldest_version for s in g.samples} for g in pending.groups]

    def judged(self, groups: Iterable[Sequence[str]]) -> tuple[JudgedGroup, ...]:
        """The judged groups of these request ids, each named by its first member's wave."""
        return tuple(
            JudgedGroup(
                self.wave_of[rids[0]],
                tuple(self.samples[RequestId(r)] for r in rids),
                tuple(self.outcomes[RequestId(r)] for r in rids),
            )
            for rids in groups
        )
