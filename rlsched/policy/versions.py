"""Which weight versions may still be used: the staleness rule, written once.

A version `v` is admissible while `v >= latest - max_staleness`. The rollout fleet routes requests
only to instances holding an admissible version (an instance left behind pulls the latest first),
and the update keeps only groups whose samples were all generated at an admissible version.
`max_staleness` 0 is on-policy: only the latest version counts.
"""

from __future__ import annotations


def oldest_admissible(latest: int, max_staleness: int) -> int:
    """The oldest version still admissible when `latest` is the newest published."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be at least 0, got {max_staleness}")
    return latest - max_staleness


def admissible(version: int, latest: int, max_staleness: int) -> bool:
    return version >= oldest_admissible(latest, max_staleness)
