"""A record of one core's life, for the equivalence check between its drivers (`rlsched.sim.replay`).

A Ray driver that records keeps a copy of its core as it was when recording began, then each event
it fed the core (stamped with its clock) together with the effects the core returned. Replaying the
events through a copy of `initial` gives the same effects again when the core read nothing but its
events. One generic type serves every core.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C")
E = TypeVar("E")
F = TypeVar("F")


@dataclass
class Trace(Generic[C, E, F]):
    initial: C  # a deep copy of the core when recording began
    steps: list[tuple[E, list[F]]] = field(default_factory=list)

    @classmethod
    def begin(cls, core: C) -> Trace[C, E, F]:
        return cls(copy.deepcopy(core))

    def add(self, event: E, effects: list[F]) -> None:
        self.steps.append((event, list(effects)))
