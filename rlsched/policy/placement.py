"""Gang placement over heterogeneous nodes, and why a gang cannot be placed, in words.

A node has capacities per resource (`CPU`, `memory_gb`, and one resource per device type: `H100`,
`A100`, ...) and labels. A gang is a list of bundles that must all be placed or none (SPEC section
4), under one of Ray's strategies: STRICT_PACK (every bundle on one node), PACK (as few nodes as
possible), STRICT_SPREAD (every bundle on its own node), SPREAD (as many nodes as possible), and a
label selector every chosen node must match. `place` returns a `Placement` or `Unplaceable` with a
reason that names the real blocker ("needs 4 H100 and 16 CPU on one node; node-1 has 4 H100 but 8
free CPU; node-2 has 32 free CPU but its devices are A100"). `start_choice` is the SPEC's decision
between waiting for a node, migrating its preemptible occupant, and spreading the gang.

Pure: capacities and free amounts come in, decisions go out; nothing is mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

Resources = Mapping[str, float]
_EPS = 1e-9


class Strategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclass(frozen=True)
class Node:
    name: str
    capacity: Resources
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Gang:
    bundles: tuple[Resources, ...]
    strategy: Strategy = Strategy.PACK
    selector: Mapping[str, str] = field(default_factory=dict)  # labels every chosen node must carry

    def total(self) -> dict[str, float]:
        return add(*self.bundles)


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]  # one per bundle, in bundle order


@dataclass(frozen=True)
class Unplaceable:
    reason: str


def add(*amounts: Resources) -> dict[str, float]:
    out: dict[str, float] = {}
    for a in amounts:
        for k, v in a.items():
            out[k] = out.get(k, 0.0) + v
    return out


def fits(need: Resources, free: Resources) -> bool:
    for k, v in need.items():  # noqa: SIM110 - a plain loop: the hottest call in admission (profiled)
        if v > 0 and v > free.get(k, 0.0) + _EPS:
            return False
    return True


def minus(free: Resources, used: Resources) -> dict[str, float]:
    out = dict(free)
    for k, v in used.items():
        out[k] = out.get(k, 0.0) - v
    return out


def matches(node: Node, selector: Mapping[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


def place(
    gang: Gang,
    nodes: Sequence[Node],
    free: Mapping[str, Resources],
    device_types: frozenset[str] = frozenset(),
) -> Placement | Unplaceable:
    """Where each bundle goes, all of them or none; `free` is what each node has left, and
    `device_types` the resources that name accelerators (for the reason, when it does not fit)."""
    if not gang.bundles:
        return Placement(())
    eligible = [n for n in nodes if matches(n, gang.selector)] if gang.selector else nodes
    chosen: list[str] | None
    if gang.strategy is Strategy.STRICT_PACK:
        chosen = _one_node(gang, eligible, free)
    elif gang.strategy is Strategy.STRICT_SPREAD:
        chosen = _distinct_nodes(gang.bundles, eligible, free)
    elif gang.strategy is Strategy.PACK:
        chosen = _one_node(gang, eligible, free) or _first_fit(gang.bundles, eligible, free, spread=False)
    else:
        chosen = _distinct_nodes(gang.bundles, eligible, free) or _first_fit(
            gang.bundles, eligible, free, spread=True
        )
    if chosen is None:
        return Unplaceable(why_not(gang, nodes, free, device_types))
    return Placement(tuple(chosen))


def _leftover(need: Resources, free: Resources) -> float:
    """How much a node would have left of what is asked (best fit: the smallest wins)."""
    return sum(free.get(k, 0.0) - v for k, v in need.items())


def _one_node(gang: Gang, nodes: Sequence[Node], free: Mapping[str, Resources]) -> list[str] | None:
    total = gang.total()
    fitting = [n for n in nodes if fits(total, free[n.name])]
    if not fitting:
        return None
    best = min(fitting, key=lambda n: (_leftover(total, free[n.name]), n.name))
    return [best.name] * len(gang.bundles)


def _first_fit(
    bundles: Sequence[Resources], nodes: Sequence[Node], free: Mapping[str, Resources], spread: bool
) -> list[str] | None:
    """Largest bundles first; PACK fills the node with most room first, SPREAD the least used."""
    left = {n.name: dict(free[n.name]) for n in nodes}
    used = dict.fromkeys(left, 0)
    out: list[str | None] = [None] * len(bundles)
    for i in sorted(range(len(bundles)), key=lambda k: -sum(bundles[k].values())):
        fitting = [n for n in left if fits(bundles[i], left[n])]
        if not fitting:
            return None
        if spread:
            pick = min(fitting, key=lambda n: (used[n], n))
        else:
            pick = max(fitting, key=lambda n: (used[n], -_leftover(bundles[i], left[n]), n))
        left[pick] = minus(left[pick], bundles[i])
        used[pick] += 1
        out[i] = pick
    return [n for n in out if n is not None]


def _distinct_nodes(
    bundles: Sequence[Resources], nodes: Sequence[Node], free: Mapping[str, Resources]
) -> list[str] | None:
    """A different node for every bundle: a bipartite matching (augmenting paths); identical
    bundles (the usual gang) need only enough nodes that fit one."""
    if all(b == bundles[0] for b in bundles):
        found = []
        for node in nodes:
            if fits(bundles[0], free[node.name]):
                found.append(node.name)
                if len(found) == len(bundles):
                    return found
        return None
    options = [[n.name for n in nodes if fits(b, free[n.name])] for b in bundles]
    owner: dict[str, int] = {}

    def claim(i: int, seen: set[str]) -> bool:
        for n in options[i]:
            if n in seen:
                continue
            seen.add(n)
            if n not in owner or claim(owner[n], seen):
                owner[n] = i
                return True
        return False

    for i in range(len(bundles)):
        if not claim(i, set()):
            return None
    out = [""] * len(bundles)
    for n, i in owner.items():
        out[i] = n
    return out


# -- why not, in words -----------------------------------------------------------------------------------


def _amount(v: float) -> str:
    return f"{v:g}"


def _describe(need: Resources) -> str:
    return " and ".join(f"{_amount(v)} {k}" for k, v in need.items() if v > 0)


def why_not(
    gang: Gang,
    nodes: Sequence[Node],
    free: Mapping[str, Resources],
    device_types: frozenset[str] = frozenset(),
) -> str:
    """The blocker, named: a resource no node has, a label no node carries, or per node what falls
    short (the nodes that come closest first)."""
    total = gang.total()
    where = {
        Strategy.STRICT_PACK: "on one node",
        Strategy.STRICT_SPREAD: f"as {len(gang.bundles)} bundles on distinct nodes",
        Strategy.PACK: f"as {len(gang.bundles)} bundle(s)",
        Strategy.SPREAD: f"as {len(gang.bundles)} bundle(s)",
    }[gang.strategy]
    head = f"needs {_describe(total)} {where}"
    missing = sorted(
        k for k, v in total.items() if v > 0 and not any(n.capacity.get(k, 0) > 0 for n in nodes)
    )
    if missing:
        have = sorted({k for n in nodes for k, v in n.capacity.items() if v > 0})
        return f"{head}; no node has {', '.join(missing)} (the cluster has: {', '.join(have)})"
    eligible = [n for n in nodes if matches(n, gang.selector)] if gang.selector else nodes
    if not eligible:
        labels = ", ".join(f"{k}={v}" for k, v in gang.selector.items())
        return f"{head}; no node carries the labels {labels}"
    per_node = total if gang.strategy is Strategy.STRICT_PACK else _largest(gang.bundles)
    short = [n for n in eligible if not fits(per_node, free[n.name])]
    ranked = sorted(short, key=lambda n: (_shortfall(per_node, free[n.name]), n.name))
    notes = [_node_note(n, per_node, free[n.name], device_types) for n in ranked[:3]]
    if len(ranked) > 3:
        notes.append(f"{len(ranked) - 3} more node(s) fall shorter")
    if gang.strategy is not Strategy.STRICT_PACK:
        fit = len(eligible) - len(short)
        what = "distinct node(s)" if gang.strategy is Strategy.STRICT_SPREAD else "node(s)"
        notes.insert(0, f"only {fit} {what} can take a bundle of {_describe(per_node)}")
        pooled = add(*(free[n.name] for n in eligible))
        lacking = [k for k, v in total.items() if v > 0 and pooled.get(k, 0.0) < v]
        if lacking:
            notes.insert(
                0,
                "the nodes have "
                + " and ".join(f"{_amount(pooled.get(k, 0.0))} free {k}" for k in lacking)
                + " in all",
            )
    return f"{head}; " + "; ".join(notes)


def _largest(bundles: Sequence[Resources]) -> Resources:
    return max(bundles, key=lambda b: sum(b.values()))


def _shortfall(need: Resources, free: Resources) -> float:
    return sum(max(0.0, v - free.get(k, 0.0)) / max(v, _EPS) for k, v in need.items() if v > 0)


def _node_note(node: Node, need: Resources, held: Resources, device_types: frozenset[str]) -> str:
    free = {k: max(v, 0.0) for k, v in held.items()}  # capacity held for another job shows as none
    have = [
        f"{_amount(free.get(k, 0.0))} free {k}" for k, v in need.items() if v > 0 and free.get(k, 0.0) >= v
    ]
    short = [k for k, v in need.items() if v > 0 and free.get(k, 0.0) < v]
    parts = []
    wrong_device = [k for k in short if k in device_types and node.capacity.get(k, 0.0) == 0]
    theirs = sorted(d for d in device_types if node.capacity.get(d, 0.0) > 0)
    if wrong_device:
        parts.append(f"its devices are {', '.join(theirs)}" if theirs else "it has no devices")
    lows = [f"{_amount(free.get(k, 0.0))} free {k}" for k in short if k not in wrong_device]
    if lows:
        parts.append(("only " if not have else "") + " and ".join(lows))
    if have:
        return f"{node.name} has {' and '.join(have)} but {' and '.join(parts)}"
    return f"{node.name}: " + "; ".join(parts) if wrong_device else f"{node.name} has {parts[0]}"


# -- wait, migrate or spread (SPEC section 4) -------------------------------------------------------------


class StartOption(StrEnum):
    WAIT = "wait"  # for the occupant of the right node to finish
    MIGRATE = "migrate"  # move the preemptible occupant elsewhere, then start
    SPREAD = "spread"  # start now over a compatible multi-node set, slower


@dataclass(frozen=True)
class StartChoice:
    option: StartOption
    completion_s: float  # when the gang would finish under that option
    options: Mapping[StartOption, float]


def start_choice(
    wait_s: float,
    run_s: float,
    migrate_s: float | None = None,
    spread_ready_s: float | None = None,
    spread_run_s: float | None = None,
) -> StartChoice:
    """The option that finishes soonest; waiting wins ties (it disturbs nobody), then migrating.
    SPEC: wait 12 + 20 = 32 s, migrate 4 + 20 = 24 s, spread 1 + 32 = 33 s -> migrate; a 12 s
    migration ties with waiting."""
    if min(wait_s, run_s) < 0:
        raise ValueError("times must be non-negative")
    options = {StartOption.WAIT: wait_s + run_s}
    if migrate_s is not None:
        options[StartOption.MIGRATE] = migrate_s + run_s
    if spread_ready_s is not None and spread_run_s is not None:
        options[StartOption.SPREAD] = spread_ready_s + spread_run_s
    order = list(StartOption)
    best = min(options, key=lambda o: (options[o], order.index(o)))
    return StartChoice(best, options[best], options)
