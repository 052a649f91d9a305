"""A job's training problems in their seeded order, and the data cursor its records keep.

The same seed draws the same sequence, so a position in it (the cursor) is all a checkpoint needs to
continue the data where the run left off. A pipelined job's checkpoint also names the positions of
the problems it had in flight: those are drawn again first (`redo`), before any new one.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Sequence

from rlsched.rl.task import TaskProblem
from rlsched.rl.tasks import Task


class ProblemFeed:
    def __init__(self, task: Task, seed: int, cursor: int = 0, redo: Sequence[int] = ()) -> None:
        self.task, self.seed = task, seed
        self.stream, self.cursor = self._stream_at(cursor)
        self.redo = self._problems_at(redo)

    def rewind(self, cursor: int, redo: Sequence[int] = ()) -> None:
        """Back to position `cursor`, with `redo`'s problems first (a recovery's checkpoint)."""
        self.stream, self.cursor = self._stream_at(cursor)
        self.redo = self._problems_at(redo)

    def next(self) -> tuple[int, TaskProblem]:
        """The next training problem with its position in the stream."""
        if self.redo:
            return self.redo.popleft()
        self.cursor += 1
        return self.cursor - 1, next(self.stream)

    def _stream_at(self, cursor: int) -> tuple[Iterator[TaskProblem], int]:
        stream = self.task.train_problems(random.Random(self.seed))
        for _ in range(cursor):
            next(stream)
        return stream, cursor

    def _problems_at(self, positions: Sequence[int]) -> deque[tuple[int, TaskProblem]]:
        wanted = set(positions)
        stream, _ = self._stream_at(0)
        drawn = [next(stream) for _ in range(max(wanted, default=-1) + 1)]
        return deque((position, drawn[position]) for position in sorted(wanted))
