"""A lock taken in turn, first come first served: how one engine's batch loops share its cache.

`threading.Lock` is not fair: a serve loop that releases it and takes it back at once would keep it
forever under steady load. Tickets give it to whoever asked first, and `others_wait` lets the holder
see that someone is waiting, so that it can wind down (stop admitting, let its rows finish).
"""

from __future__ import annotations

import threading


class Turns:
    """A lock taken in turn (first come, first served): the batch loops of one engine. A serve under
    steady load would otherwise take it back at once each time and starve a job's `generate`; with
    turns, an open intake stops admitting while another loop waits (`others_wait`), its rows finish,
    and the waiting loop runs next."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0  # the ticket the next taker gets
        self._serving = 0  # the ticket whose turn it is

    def take(self) -> None:
        with self._cv:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cv.wait()

    def give(self) -> None:
        with self._cv:
            self._serving += 1
            self._cv.notify_all()

    def others_wait(self) -> bool:
        return self._next - self._serving > 1
