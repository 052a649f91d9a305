"""Which weight versions may still be used: the staleness rule, written once.

A version `v` is admissible while `v >= latest - max_staleness`. The rollout fleet routes requests
only to instances holding an admissible version (an instance left behind pulls the latest first),
and the update keeps only groups whose samples were all generated at an admissible version.
`max_staleness` 0 is on-policy: only the latest version counts.

A sample's staleness is counted when it is trained: the version being trained minus the oldest
version that sampled any of its tokens (`staleness`). The iteration runs in one of two modes
(`PipelineMode`): `sync` generates, updates and publishes one after another; `async` keeps generating
for the next iterations while the trainer updates, which needs `max_staleness` of at least 1 and a
buffer of judged groups of at least one batch (`pipeline_problem` says what is wrong with a choice).
A version that reaches an instance mid-batch is either taken after the batch (`InflightUpdate.FINISH`)
or swapped in between two decoding steps (`SWAP`), the running requests' earlier keys and values
recomputed or kept (`SwapKV`); each token then records the version that sampled it.
"""

from __future__ import annotations

from enum import StrEnum


class PipelineMode(StrEnum):
    SYNC = "sync"  # generate, verify, update, publish, reload: one iteration after another
    ASYNC = "async"  # generation runs ahead of training by up to max_staleness versions


class InflightUpdate(StrEnum):
    """What an instance's running requests do when a new version reaches it mid-batch (async mode)."""

    FINISH = "finish"  # they finish on the version they began with; the instance pulls after the batch
    SWAP = "swap"  # the version is pulled while they run and swapped in between two decoding steps


class SwapKV(StrEnum):
    """After an in-flight swap, the keys and values of each running request's earlier tokens."""

    RECOMPUTE = "recompute"  # recomputed under the new weights before the next decoding step (exact)
    KEEP = "keep"  # kept as the old weights computed them: an approximation, its drift measured


def oldest_admissible(latest: int, max_staleness: int) -> int:
    """The oldest version still admissible when `latest` is the newest published."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be at least 0, got {max_staleness}")
    return latest - max_staleness


def admissible(version: int, latest: int, max_staleness: int) -> bool:
    return version >= oldest_admissible(latest, max_staleness)


def staleness(trained: int, oldest_token_version: int) -> int:
    """Versions between the oldest version that sampled any token of a sample and `trained`, the
    version the update that uses it starts from."""
    return trained - oldest_token_version


def pipeline_problem(
    mode: PipelineMode,
    max_staleness: int,
    buffer_groups: int,
    batch_groups: int,
    keys: tuple[str, str] = ("max_staleness", "buffer_groups"),
) -> str | None:
    """What is wrong with a pipeline's settings, naming the fix (by `keys`, the settings' names);
    None when they can run."""
    if mode is PipelineMode.SYNC:
        return None
    staleness_key, buffer_key = keys
    if max_staleness < 1:
        return (
            f"mode async with {staleness_key} {max_staleness} cannot overlap anything: a sample generated "
            f"while the trainer updates is one version stale; set {staleness_key} to 1 or more, or mode sync"
        )
    if buffer_groups < batch_groups:
        return (
            f"{buffer_key} {buffer_groups} is smaller than one batch ({batch_groups} groups): the trainer "
            f"could never take a batch; set it to at least {batch_groups}"
        )
    return None


def swap_refusal(mode: InflightUpdate, engine: str) -> str | None:
    """Why instances running `engine` cannot take a version in flight where `mode` asks them to (their
    running requests finish on the old version instead); None where they can, or nobody asked. Only the
    torch engine swaps between two decoding steps."""
    if mode is not InflightUpdate.SWAP or engine == "torch":
        return None
    return (
        f"rollout.inflight_update swap: engine {engine} loads a version only between generate "
        "calls, not between two decoding steps of a running request; its running requests finish on "
        "the old version (stale by one) and it pulls after them"
    )
