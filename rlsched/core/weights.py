"""The weight versions of one job: which are published, which instances pull or hold each, and which
may still be generated with.

Each version follows `VersionState` (`rlsched.policy.lifecycle`): PUBLISHED when the trainer hands it
to the weight service, CONFIRMED once the first instance has loaded it and matched its checksum,
RETIRED once newer versions put it past the staleness bound (`rlsched.policy.versions`). Only an
instance holding a version that is not RETIRED is routed requests; one left behind pulls the latest.

The fleet core (`rlsched.core.fleet`) owns one book and tells it of every publish, pull start, pull
end and departure; the book answers the questions routing and staleness ask.

Relays: where instances relay, a pull records its sources (peers first, the trainer last), and
`peers_for` picks them for a lone joiner: instances that hold the version whole first, then those
still pulling it (their verified prefix runs ahead of the joiner), each ranked by how many pulls it
already feeds, so the trainer's egress is left to the others. A reload of many instances at once
follows a plan instead (`rlsched.policy.bandwidth.relay_plan`, chosen by the fleet core).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsched.policy.lifecycle import VERSION_TRANSITIONS, VersionState, version_transition
from rlsched.policy.versions import admissible


@dataclass(slots=True)
class _Version:
    state: VersionState = VersionState.PUBLISHED
    pulling: set[str] = field(default_factory=set)  # instances pulling it now
    holders: set[str] = field(default_factory=set)  # instances that confirmed it and still hold it
    nbytes: int = 0  # its size, where the publisher said (the relay plan's S)

    def to(self, target: VersionState) -> None:
        if target not in VERSION_TRANSITIONS[self.state]:
            version_transition(self.state, target)  # raises, naming the edges allowed
        self.state = target


class WeightBook:
    def __init__(self, max_staleness: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be at least 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.versions: dict[int, _Version] = {}
        self.latest: int | None = None
        self._live: list[int] = []  # versions not yet RETIRED, oldest first
        self._pulling: dict[str, int] = {}  # instance -> the version it pulls
        self._held: dict[str, int] = {}  # instance -> the version it holds
        self._sources: dict[str, tuple[str, ...]] = {}  # instance -> the peers its pull draws on

    def publish(self, version: int, nbytes: int = 0) -> list[int]:
        """A new version; returns the versions it retires."""
        if self.latest is not None and version <= self.latest:
            raise ValueError(f"version {version} is not newer than {self.latest}")
        self.versions[version] = _Version(nbytes=nbytes)
        self.latest = version
        self._live.append(version)
        retired = [v for v in self._live if not self.admissible(v)]
        for v in retired:
            self.versions[v].to(VersionState.RETIRED)
        self._live = self._live[len(retired) :]  # the oldest go first
        return retired

    def admissible(self, version: int) -> bool:
        """Whether requests may be generated with `version` (before anything is published: none)."""
        return self.latest is not None and admissible(version, self.latest, self.max_staleness)

    def state(self, version: int) -> VersionState:
        return self.versions[version].state

    def pull_started(self, instance: str, version: int, sources: tuple[str, ...] = ()) -> None:
        self._stop_pulling(instance)
        self.versions[version].pulling.add(instance)
        self._pulling[instance] = version
        self._sources[instance] = sources

    def sources(self, instance: str) -> tuple[str, ...]:
        """The peers the instance's current pull draws on (empty: the trainer alone)."""
        return self._sources.get(instance, ())

    def fed_by(self, source: str | None) -> list[str]:
        """The pulls in flight that draw first-hand on `source` (None: on the trainer)."""
        return [n for n in self._pulling if (self._sources.get(n, ())[:1] or (None,))[0] == source]

    def peers_for(
        self, instance: str, version: int, relays: frozenset[str], limit: int = 2
    ) -> tuple[str, ...]:
        """Up to `limit` peers among `relays` for a lone pull of `version`: holders before pullers,
        the least loaded first (pulls they feed first-hand now), then by name; never the instance
        itself."""
        book = self.versions[version]

        def rank(peer: str) -> tuple[int, int, str]:
            return (0 if peer in book.holders else 1, len(self.fed_by(peer)), peer)

        candidates = (book.holders | book.pulling) & relays - {instance}
        return tuple(sorted(candidates, key=rank)[:limit])

    def confirmed(self, instance: str, version: int) -> None:
        """`instance` loaded `version` and its checksum matched: it now holds that one alone."""
        self.gone(instance)
        book = self.versions[version]
        book.holders.add(instance)
        self._held[instance] = version
        if book.state is VersionState.PUBLISHED:
            book.to(VersionState.CONFIRMED)

    def pull_failed(self, instance: str) -> None:
        self._stop_pulling(instance)

    def gone(self, instance: str) -> None:
        """The instance left (or is replacing what it held): it holds nothing and pulls nothing."""
        self._stop_pulling(instance)
        held = self._held.pop(instance, None)
        if held is not None:
            self.versions[held].holders.discard(instance)

    def _stop_pulling(self, instance: str) -> None:
        self._sources.pop(instance, None)
        version = self._pulling.pop(instance, None)
        if version is not None:
            self.versions[version].pulling.discard(instance)

    def holders(self, version: int) -> frozenset[str]:
        return frozenset(self.versions[version].holders)

    def pulling(self, version: int) -> frozenset[str]:
        return frozenset(self.versions[version].pulling)
