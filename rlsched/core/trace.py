"""A record of one core's life, for the equivalence check between its drivers (`rlsched.sim.replay`).

A Ray driver that records keeps a copy of its core as it was when recording began, then each event
it fed the core (stamped with its clock) together with the effects the core returned. Replaying the
events through a copy of `initial` gives the same effects again when the core read nothing but its
events. One generic type serves every core. A job run with `run.record_fleet` saves its fleet's trace
(`fleet_trace.pkl` in its out dir, `save`/`load_trace`), so that a run of the `rlsched` command, as a
user starts it, can be replayed.
"""

from __future__ import annotations

import copy
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

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

    def save(self, path: Path) -> None:
        """Write the trace to `path` as a pickle (whole or not at all: a temporary file renamed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        tmp.replace(path)


def load_trace(path: Path) -> Trace[Any, Any, Any]:
    """A trace `Trace.save` wrote. A pickle runs code as it loads: load only the traces of your own
    runs."""
    trace = pickle.loads(path.read_bytes())
    if not isinstance(trace, Trace):
        raise TypeError(f"{path} holds a {type(trace).__name__}, not a recorded trace")
    return trace
