"""What a rollout instance's weight pull uses beside the link (`rlsched.rollout.instance`): the buffer
for the next pull, mapped ahead of it (`Spare`), and the loader that stages each tensor into the
engine as the pull verifies its bytes, swapped in whole once the last has arrived (`StagedLoad`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rlsched.engine.protocol import RolloutEngine, WeightStage, WeightVersion
from rlsched.engine.staging import StagingError, stream_into
from rlsched.transfer.manifest import Assembly, Buffer, prefaulted


class Spare:
    """A buffer for the next pull, its pages mapped on a thread of its own ahead of the pull. A fresh
    269 MB buffer costs 0.2 CPU-s of page faults here; eight instances told of a version at once on
    two cores, paying it as the bytes arrived, fell behind the link (`scripts/bench_fanout.py`)."""

    def __init__(self, nbytes: int, allocate: Callable[[int], Buffer], background: bool = True) -> None:
        self._buffer: Buffer | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._fill, args=(nbytes, allocate), name="spare", daemon=True
            )
            self._thread.start()
        else:
            self._fill(nbytes, allocate)

    def _fill(self, nbytes: int, allocate: Callable[[int], Buffer]) -> None:
        self._buffer = prefaulted(nbytes, allocate)

    def take(self) -> Buffer | None:
        """The buffer (waiting for it if it is not yet made); the pull allocates its own if the
        version's size differs."""
        if self._thread is not None:
            self._thread.join()
        return self._buffer


class StagedLoad:
    """The loader beside a pull: a thread that stages each tensor as the pull verifies its bytes
    (`rlsched.engine.staging`); nothing where the engine takes versions only whole."""

    def __init__(self, engine: RolloutEngine | None) -> None:
        self._engine = engine
        self._stage: WeightStage | None = None
        self._thread: threading.Thread | None = None
        self._assembly: Assembly | None = None
        self._sha: str | None = None
        self._error: BaseException | None = None

    @property
    def staged(self) -> bool:
        return self._stage is not None

    def begin(self, assembly: Assembly) -> None:
        """The pull's copy exists: stage it as it fills (a retried pull's earlier copy is dropped)."""
        self.cancel()
        if self._engine is None:
            return
        self._stage = self._engine.stage(WeightVersion(assembly.manifest.version))
        if self._stage is None:
            return
        self._assembly, self._sha, self._error = assembly, None, None
        self._thread = threading.Thread(target=self._run, args=(self._stage, assembly), daemon=True)
        self._thread.start()

    def _run(self, stage: WeightStage, assembly: Assembly) -> None:
        try:
            self._sha = stream_into(stage, assembly)
        except BaseException as err:  # noqa: BLE001 - handed to commit(), which reports it
            self._error = err

    def commit(self) -> str:
        """Wait for the last tensor, swap the version in; the SHA-256 of what was staged."""
        assert self._thread is not None and self._stage is not None
        self._thread.join()
        if self._error is not None:
            raise StagingError(str(self._error))
        assert self._sha is not None
        self._stage.commit()
        return self._sha

    def cancel(self) -> None:
        if self._assembly is not None and not self._assembly.complete:
            self._assembly.abandon()
        if self._thread is not None:
            self._thread.join()
        self._stage = self._thread = self._assembly = None
