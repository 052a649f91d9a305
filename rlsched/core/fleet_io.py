"""The rollout fleet's vocabulary: its parameters, the events a driver feeds `FleetCore`
(`rlsched.core.fleet`), the effects it gets back, and the decision log's lines for them.

Instances and requests are named by strings: an instance by its name (`rollout-0`, `transient-1`,
`scaled-2`, a cluster part), a request by its id. What a request is (its tokens, its sampling) stays
with the driver; the core knows of it what its rules read: its group, its prompt's length and, where
the driver knows it, its decode speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rlsched.policy.bandwidth import RelayParams
from rlsched.policy.lifecycle import Leave
from rlsched.policy.resume import Restart, ResumeCost
from rlsched.policy.routing import Refill as Refill  # FleetParams.refill

# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A transient instance's availability, like spot capacity. Times count from the start of
    generation in iteration `join_iteration`; it ends `available_s` after it was granted, or
    `reclaim_at_s` into iteration `reclaim_iteration`'s generation, or never."""

    name: str
    join_iteration: int = 1
    join_at_s: float = 0.0
    available_s: float | None = None
    reclaim_iteration: int | None = None
    reclaim_at_s: float = 0.0
    leave: Leave = Leave.PREEMPTED
    ingress_bps: float = 0.0


@dataclass(frozen=True)
class FleetParams:
    request_batch: int = 16  # requests an instance holds at a time
    max_staleness: int = 0  # versions an instance may lag the latest and still be routed requests
    cost: ResumeCost = field(default_factory=lambda: ResumeCost(5000.0, 50.0))  # prices resume and restart
    windows: tuple[Window, ...] = ()
    relay: RelayParams | None = None  # None: every instance pulls from the trainer alone
    swap_in_flight: bool = False  # a reload reaches busy instances at once (else after their batch)
    refill: Refill = Refill.BATCH
    refill_min: int = 1  # refilled by slot: rows that must be free before an instance takes more


@dataclass(slots=True)
class RequestSpec:
    """What the fleet's rules read of one request (a value; not frozen, which costs three times as
    much to build, and the simulator builds one per sample)."""

    request_id: str
    group: str  # its GRPO group: interrupted members resume together
    prompt_tokens: int
    decode_tokens_per_s: float | None = None  # its own decode speed, if known (else the params')


class PullWhy(StrEnum):
    """Why an instance pulls the latest version (its spans say so; only RELOAD is a phase)."""

    JOIN = "join"  # its first version: it serves once this one is confirmed
    CATCH_UP = "catch-up"  # a newer version made the one it holds inadmissible
    RELOAD = "reload"  # the reload phase between iterations, for every serving instance


# -- events (what happened) -------------------------------------------------------------------------


@dataclass(slots=True)
class Added:
    """Start an instance now: a static one, or one the cluster scheduler granted."""

    at: float
    name: str
    ingress_bps: float = 0.0


@dataclass(slots=True)
class Scaled:
    """`rlsched scale`: `add` new instances (named by the core), and remove some by name."""

    at: float
    add: int = 0
    ingress_bps: float = 0.0
    remove: tuple[str, ...] = ()
    leave: Leave = Leave.DRAINING


@dataclass(slots=True)
class Reclaimed:
    """An instance must go (the cluster scheduler reclaims it), or is gone (its actor died). A dead
    one the job owns is `replace`d: a new instance joins in its place (a window's or a grant's is not:
    its resources were lent)."""

    at: float
    name: str
    leave: Leave
    why: str
    replace: bool = False


@dataclass(slots=True)
class Published:
    at: float
    version: int
    nbytes: int = 0  # its size, for the relay plan (0: unknown)


@dataclass(slots=True)
class ReloadAsked:
    """The reload phase: every serving instance (and every allocated one not yet pulling) takes the
    latest version; `ReloadDone` follows once they all have. `hold`: serving instances left at their
    version for the endpoint's episodes pinned there (`rlsched.policy.routing.hold_back`), each only
    while its version stays admissible, and never every one of them."""

    at: float
    hold: tuple[str, ...] = ()


@dataclass(slots=True)
class PullDone:
    """An instance's pull ended: it confirmed `version`, or (with `error`) gave up and released itself."""

    at: float
    name: str
    version: int
    error: str = ""


@dataclass(slots=True)
class Begun:
    """An iteration's generation starts with these requests, in the order they are to be served."""

    at: float
    iteration: int
    requests: tuple[RequestSpec, ...]


@dataclass(slots=True)
class Arrived:
    """An instance streamed back a finished sample."""

    at: float
    name: str
    request_id: str


@dataclass(slots=True)
class StreamEnded:
    """An instance's route call ended (normally once all its samples arrived, or early: aborted):
    route number `dispatch`, or every route the instance runs (None)."""

    at: float
    name: str
    dispatch: int | None = None


@dataclass(slots=True)
class SavedRead:
    """The reply to `ReadSaved`: how many output tokens the durable store holds for each request."""

    at: float
    name: str
    saved: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Tick:
    """Time has passed: transient windows due now open or close."""

    at: float


@dataclass(slots=True)
class Replenish:
    """Bring the job's own instances back to `target`: a fault took some that nobody replaced (a
    training group that died under a reload left its instances unable to take the version). Lent
    instances (`exclude`, and every transient window's) do not count."""

    at: float
    target: int
    exclude: tuple[str, ...] = ()


Event = (
    Added
    | Scaled
    | Reclaimed
    | Replenish
    | Published
    | ReloadAsked
    | PullDone
    | Begun
    | Arrived
    | StreamEnded
    | SavedRead
    | Tick
)

# -- effects (what to do) ---------------------------------------------------------------------------


@dataclass(slots=True)
class StartInstance:
    name: str
    ingress_bps: float


@dataclass(slots=True)
class StartPull:
    """Pull `version` over the instance's link, load it and confirm it; report `PullDone`."""

    name: str
    version: int
    why: PullWhy
    sources: tuple[str, ...] = ()  # peers (instance names) to pull from first, in order, then the trainer


@dataclass(slots=True)
class Route:
    """Generate `requests` on the instance, as dispatch number `dispatch` (the store's attempt); each
    continues from the first `resume[i]` saved output tokens (0: from its prompt)."""

    name: str
    requests: tuple[str, ...]
    dispatch: int
    resume: tuple[int, ...]


@dataclass(slots=True)
class KillInstance:
    name: str


@dataclass(slots=True)
class ReadSaved:
    """Read what the durable store holds for these requests of a reclaimed instance; reply `SavedRead`."""

    name: str
    requests: tuple[str, ...]


@dataclass(slots=True)
class CutSaved:
    """Cut the request's saved output back to its first `keep` tokens (0: drop it all)."""

    request_id: str
    keep: int


@dataclass(frozen=True, slots=True)
class Resumption:
    """How a requeued request goes on: from `kept` saved tokens of `saved` (before its group's cut)."""

    kept: int
    saved: int
    preempted_at: float
    source: str
    choice: Restart


@dataclass(slots=True)
class Accepted:
    """A sample counts: the first from the instance its request was routed to."""

    name: str
    request_id: str
    resumed: Resumption | None


@dataclass(slots=True)
class Joined:
    """An instance confirmed a version (for the driver's spans and log)."""

    name: str
    version: int
    why: PullWhy
    iteration: int
    started: float


@dataclass(slots=True)
class Left:
    """An instance left: preempted (with `requeued` requests sent back) or drained."""

    name: str
    leave: Leave
    why: str
    requeued: int
    started: float


@dataclass(slots=True)
class ReloadDone:
    pass


@dataclass(slots=True)
class Note:
    """A line for the operator's log."""

    message: str


Effect = (
    StartInstance
    | StartPull
    | Route
    | KillInstance
    | ReadSaved
    | CutSaved
    | Accepted
    | Joined
    | Left
    | ReloadDone
    | Note
)


@dataclass
class FleetCounts:
    joined: int = 0
    preempted: int = 0
    drained: int = 0
    resumed: int = 0
    restarted: int = 0
    reused_tokens: int = 0
    regenerated_tokens: int = 0
    duplicates_dropped: int = 0
    join_failures: int = 0
    replaced: int = 0  # dead instances a new one took the place of


def render(effects: Sequence[Effect], at: float) -> list[str]:
    """The decision log's lines for `effects` decided at `at` (notes and spans are not decisions)."""
    lines = []
    for e in effects:
        match e:
            case Route():
                lines.append(f"{at:.9f} route {len(e.requests)} -> {e.name} #{e.dispatch}")
            case StartPull():
                lines.append(f"{at:.9f} pull v{e.version} -> {e.name} ({e.why})")
            case StartInstance() | KillInstance():
                lines.append(f"{at:.9f} {type(e).__name__} {e.name}")
            case CutSaved():
                lines.append(f"{at:.9f} cut {e.request_id} to {e.keep}")
    return lines
