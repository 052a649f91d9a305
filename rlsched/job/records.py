"""An iteration's record, as `metrics.jsonl` keeps it: what was generated, judged and used, the
reward, the loss, and the fleet's and the verifier pool's counts so far. Each is appended and
fsync'ed before the next iteration counts (the iteration is the unit of commit)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.engine.protocol import RequestId, Sample
from verifiers.protocol import ExecutionFault, Outcome, Verdict


@dataclass
class IterationRecord:
    iteration: int
    version: int  # the weight version the samples were generated with
    samples: int
    used: int  # samples that went into the update
    stale_dropped: int
    faults: int
    reward_mean: float
    pass_rate: float
    tokens: int
    loss: float
    eval_pass_rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def record_of(
    iteration: int,
    version: int,
    samples: Mapping[RequestId, Sample],
    outcomes: Mapping[RequestId, Outcome],
    used: int,
    counts: Mapping[str, int],
    loss: float,
    extra: dict[str, Any],
) -> IterationRecord:
    verdicts = [o for o in outcomes.values() if isinstance(o, Verdict)]
    return IterationRecord(
        iteration=iteration,
        version=version,
        samples=len(samples),
        used=used,
        stale_dropped=counts["stale_dropped"],
        faults=counts["faults"],
        reward_mean=sum(v.reward for v in verdicts) / max(len(verdicts), 1),
        pass_rate=sum(v.correct for v in verdicts) / max(len(verdicts), 1),
        tokens=sum(s.num_tokens for s in samples.values()),
        loss=loss,
        extra={
            "sample_versions": sorted({v for s in samples.values() for v, _, _ in s.token_versions()}),
            "swapped_samples": sum(len(s.version_spans) > 1 for s in samples.values()),
        }
        | extra,
    )


def generate_attrs(lane: str, sample: Sample) -> dict[str, Any]:
    """A sample's `generate` span: where it ran, its tokens and version; where a version was swapped in
    under it, each version's run of tokens as [version, first, end]."""
    attrs: dict[str, Any] = {
        "lane": lane,
        "tokens": sample.num_tokens,
        "version": int(sample.weight_version),
        "resumed_tokens": sample.resumed_tokens,
    }
    if sample.version_spans:
        attrs["token_versions"] = [list(span) for span in sample.token_versions()]
    return attrs


def unjudgeable(outcomes: Mapping[RequestId, Outcome]) -> list[ExecutionFault]:
    """Faults that retrying cannot fix (bad input): the samples that can never be judged."""
    return [o for o in outcomes.values() if isinstance(o, ExecutionFault) and not o.kind.retryable]


def commit_record(path: Path, line: str) -> None:
    """Append one record and fsync before the next iteration counts (the iteration is the unit of commit)."""
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
