"""One rollout instance's multi-turn episodes, whoever routed them: a single loop of rounds
(`AgentRollout.round`) over every live episode, which the episodes of each new route join at the next
round and leave as they end.

Why one loop: the fleet core routes a job's episodes like its single-turn requests (a route per call,
refilled slot by slot or batch by batch, `rlsched.core.fleet`), so an instance may hold several routes
at once. Were each route a loop of its own, their turns would take turns on the one engine; in one loop,
every live episode's next turn goes to the engine in one batch, as a continuous batch does for
requests. Each route's episodes come back to it (`submit`'s `deliver`) the moment they end, so its
verification starts at once; a failure of the engine reaches every route with episodes in the round
and ends them (their journals kept: a resumed run takes them up again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlsched.rl.agent import AgentRollout
from rlsched.rl.episode_runs import EpisodeRun, EpisodeTask

log = logging.getLogger(__name__)

Deliver = Callable[[EpisodeRun | BaseException], None]


@dataclass
class _Route:
    tasks: Sequence[EpisodeTask]
    deliver: Deliver


class EpisodeServer:
    def __init__(self, agent: AgentRollout) -> None:
        self.agent = agent
        self._intake: list[_Route] = []
        self._live: list[tuple[EpisodeRun, _Route]] = []
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="episodes", daemon=True)
        self._thread.start()

    def submit(self, tasks: Sequence[EpisodeTask], deliver: Deliver) -> None:
        """Run `tasks` to their ends; each ended episode (or the error that ended it) to `deliver`."""
        with self._wake:
            if self._stopped:
                raise RuntimeError("the instance's episode loop has stopped")
            self._intake.append(_Route(tasks, deliver))
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- the loop ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._intake and not self._live and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                intake, self._intake = self._intake, []
            for route in intake:
                self._admit(route)
            self._hand_back_ended()
            if self._live:
                self._round()

    def _admit(self, route: _Route) -> None:
        try:
            runs = self.agent.begin(route.tasks)
        except Exception as err:  # an episode could not start (e.g. its journal is unreadable)
            log.exception("starting %d episode(s) failed", len(route.tasks))
            route.deliver(err)
            return
        self._live += [(r, route) for r in runs]

    def _round(self) -> None:
        live = [r for r, _ in self._live]
        try:
            self.agent.round(live)
        except Exception as err:
            log.exception("a round of %d episode(s) failed", len(live))
            self.agent.abandon(live)
            routes = {id(route): route for _, route in self._live}
            self._live = []
            for route in routes.values():
                route.deliver(err)
            return
        self._hand_back_ended()

    def _hand_back_ended(self) -> None:
        ended = [(r, route) for r, route in self._live if not r.live]
        if not ended:
            return
        self._live = [(r, route) for r, route in self._live if r.live]
        for run, route in ended:
            route.deliver(run)
