"""The weight versions of one job: which are published, which instances pull or hold each, and which
may still be generated with.

Each version follows `VersionState` (`rlsched.policy.lifecycle`): PUBLISHED when the trainer hands it
to the weight service, CONFIRMED once the first instance has loaded it and matched its checksum,
RETIRED once newer versions put it past the staleness bound (`rlsched.policy.versions`). Only an
instance holding a version that is not RETIRED is routed requests; one left behind pulls the latest.

The fleet core (`rlsched.core.fleet`) owns one book and tells it of every publish, pull start, pull
end and departure; the book answers the questions routing and staleness ask. Relays between receivers
(issue 19) will be recorded here too: a pull then has a source other than the trainer.
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

    def publish(self, version: int) -> list[int]:
        """A new version; returns the versions it retires."""
        if self.latest is not None and version <= self.latest:
            raise ValueError(f"version {version} is not newer than {self.latest}")
        self.versions[version] = _Version()
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

    def pull_started(self, instance: str, version: int) -> None:
        self._stop_pulling(instance)
        self.versions[version].pulling.add(instance)
        self._pulling[instance] = version

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
        version = self._pulling.pop(instance, None)
        if version is not None:
            self.versions[version].pulling.discard(instance)

    def holders(self, version: int) -> frozenset[str]:
        return frozenset(self.versions[version].holders)

    def pulling(self, version: int) -> frozenset[str]:
        return frozenset(self.versions[version].pulling)
