"""A core's recorded trace kept on disk (`run.record_fleet`): a job saves its fleet's trace as
`fleet_trace.pkl` in its out dir, so that a run of the `rlsched` command, as a user starts it, can be
replayed by `rlsched.sim.replay`. The trace itself (`rlsched.core.trace`) stays pure; the file is here.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from rlsched.core.trace import Trace


def save_trace(trace: Trace[Any, Any, Any], path: Path) -> None:
    """Write `trace` to `path` as a pickle (whole or not at all: a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps(trace, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(path)


def load_trace(path: Path) -> Trace[Any, Any, Any]:
    """A trace `save_trace` wrote. A pickle runs code as it loads: load only the traces of your own
    runs."""
    trace = pickle.loads(path.read_bytes())
    if not isinstance(trace, Trace):
        raise TypeError(f"{path} holds a {type(trace).__name__}, not a recorded trace")
    return trace
