"""Where a job's parts go on the cluster's nodes, for admission (`rlsched.policy.admission`) and
victim choice (`rlsched.policy.victims`): every gang of a job in turn on what the earlier ones left,
and elastic parts wherever room is left. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlsched.policy.cluster_model import (
    AdmissionParams,
    PendingJob,
)
from rlsched.policy.placement import (
    Node,
    Placement,
    Resources,
    Unplaceable,
    fits,
    minus,
    place,
    why_not,
)


def place_all(
    job: PendingJob,
    nodes: Sequence[Node],
    free: Mapping[str, Resources],
    params: AdmissionParams,
    keep: Resources | None = None,
    able_by_kind: dict[frozenset[str], list[Node]] | None = None,
) -> tuple[list[Placement], dict[str, Resources]] | str:
    """Every gang placed in turn on what the earlier ones left, or the first blocker in words; with
    `keep`, only if that much still fits on one node afterwards (the reserve). `able_by_kind`
    remembers, within one admission cycle, which nodes have each set of resources."""
    left = dict(free)  # shallow: entries are replaced, never mutated
    placements = []
    for gang in job.gangs:
        # only nodes that have every resource each bundle asks for can take any of them
        common = frozenset.intersection(*(frozenset(k for k, v in b.items() if v > 0) for b in gang.bundles))
        able = None if able_by_kind is None else able_by_kind.get(common)
        if able is None:
            able = [n for n in nodes if all(n.capacity.get(k, 0.0) > 0 for k in common)]
            if able_by_kind is not None:
                able_by_kind[common] = able
        got = place(gang, able, left, params.device_types)
        if isinstance(got, Unplaceable):  # the reason looks at every node
            got = Unplaceable(why_not(gang, nodes, left, params.device_types))
        if isinstance(got, Unplaceable):
            return got.reason
        for bundle, node in zip(gang.bundles, got.nodes, strict=True):
            left[node] = minus(left[node], bundle)
        placements.append(got)
    if keep and not any(fits(keep, left[n.name]) for n in nodes):
        return (
            f"it would take the capacity reserved for {', '.join(sorted(params.reserve_classes))} "
            f"({', '.join(f'{v:g} {k}' for k, v in keep.items())} kept free on one node)"
        )
    return placements, left


def place_elastic(parts: Sequence[Resources], free: dict[str, Resources]) -> list[str]:
    out = []
    for part in parts:
        node = next((n for n in sorted(free) if fits(part, free[n])), None)
        if node is None:
            break
        free[node] = minus(free[node], part)
        out.append(node)
    return out
