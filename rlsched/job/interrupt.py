"""Ctrl-C that cannot be lost in a Ray driver.

Python raises `KeyboardInterrupt` in whatever frame runs when SIGINT arrives. When that frame is a
callback Ray runs from C (an object reference being released, say), the exception is printed as
"Exception ignored in ..." and dropped, and the job would run on as if nothing was pressed. So the
handler also remembers the press, and the controller's loop and the iteration loop call `check()`,
which raises again in a frame of ours. Outside `with ctrl_c:` nothing changes.

SIGTERM (a preemption's notice, `kill`, Ray's job stop) is a request to stop cleanly, not now: the
handler only remembers it, and `check()` raises `Terminated` at the next safe point (between
iterations, or while samples are generated, before the update), where the training state is the
last committed iteration's and can be checkpointed.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class Terminated(Exception):
    """SIGTERM arrived: the job checkpoints and stops."""


class CtrlC:
    def __init__(self) -> None:
        self.pressed = False
        self.terminated = False
        self._previous: Any = None
        self._previous_term: Any = None

    def __enter__(self) -> CtrlC:
        self.pressed = self.terminated = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._previous_term = signal.signal(signal.SIGTERM, self._handle_term)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous = self._previous_term = None

    def _handle_term(self, signum: int, frame: FrameType | None) -> None:
        self.terminated = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the interrupt if Ctrl-C was pressed (it may have been swallowed where it landed)."""
        if self.pressed:
            raise KeyboardInterrupt
        if self.terminated:
            raise Terminated("stopped by SIGTERM")


ctrl_c = CtrlC()
