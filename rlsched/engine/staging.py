"""Loading a weight version while its bytes arrive, into a staging copy that is swapped in at once.

The sequential path waits for the whole file, then copies it into the model (`load_weights`). The
staged path overlaps the two: `stream_into` walks the version's tensors in file order, waits for
each one's bytes to be verified by the pull (`Assembly.wait_verified`), and hands it to the
engine's `WeightStage` while the next bytes are still on the wire. It advances the copy's whole
SHA-256 over each tensor's bytes just before staging them (`Assembly.digest_through`), so the
checksum the instance confirms is of the bytes staged, and the pull's own confirmation has nothing
left to hash when the last chunk lands (hashing it all then took 0.2 s per 270 MB here).

A stage holds the new tensors beside the live ones and `commit` swaps them in between two decoding
steps, all of them at once, only after every expected tensor is in: the engine never decodes with a
mix of two versions. A tensor handed to `put` stays valid and unchanged (each staged pull fills a
buffer of its own), so where the engine computes in the published dtype on the CPU the stage keeps
the buffer's own bytes as the new weights, with no copy at all; elsewhere (another dtype, a GPU) it
copies each tensor as it comes. Either way the update holds two versions at once, until the swap.
A tensor that does not belong to the model (a name it lacks, a shape that differs) is refused
where it arrives, naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from rlsched.engine.protocol import WeightStage
from rlsched.model.checkpoint import published_state
from rlsched.transfer.manifest import Assembly, Buffer, TensorInfo

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


class StagingError(ValueError):
    """The bytes being staged do not fit the model, or stopped arriving."""


class ModelStage:
    """A staging copy of a torch model's published tensors; `commit` swaps it in under `lock` (the
    lock the engine holds around each forward) and calls `swapped` there (the engine's new version)."""

    def __init__(
        self, model: torch.nn.Module, lock: threading.RLock, swapped: Callable[[], None] = lambda: None
    ) -> None:
        self._model = model
        self._lock = lock
        self._swapped = swapped
        self._own = published_state(model)
        self._staged: dict[str, torch.Tensor] = {}

    def put(self, name: str, tensor: torch.Tensor) -> None:
        own = self._own.get(name)
        if own is None:
            raise StagingError(f"tensor {name} is not one of the model's weights")
        if tuple(tensor.shape) != tuple(own.shape):
            raise StagingError(f"{name}: shape {tuple(tensor.shape)} != model {tuple(own.shape)}")
        if tensor.dtype == own.dtype and tensor.device == own.device:
            self._staged[name] = tensor  # the pull's buffer becomes the weights: no copy
            return
        staged = torch.empty(own.shape, dtype=own.dtype, device=own.device)
        staged.copy_(tensor)
        self._staged[name] = staged

    @property
    def missing(self) -> list[str]:
        return sorted(set(self._own) - set(self._staged))

    def commit(self) -> None:
        if self.missing:
            raise StagingError(f"the version lacks {len(self.missing)} tensor(s): {self.missing[:3]}")
        with self._lock, torch.no_grad():
            for name, staged in self._staged.items():
                self._swap(name, staged)
            self._swapped()
        self._staged = {}

    def _swap(self, name: str, staged: torch.Tensor) -> None:
        try:
            self._model.get_parameter(name).data = staged  # a tied head shares this Parameter
        except AttributeError:
            self._model.get_buffer(name).copy_(staged)


def tensor_of(buffer: Buffer | memoryview, info: TensorInfo) -> torch.Tensor:
    """A view of one tensor's bytes in `buffer` (no copy)."""
    dtype = DTYPES.get(info.dtype)
    if dtype is None:
        raise StagingError(f"tensor {info.name}: dtype {info.dtype} is not one of {sorted(DTYPES)}")
    count = (info.end - info.start) // dtype.itemsize
    if info.end == info.start:
        return torch.empty(info.shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=info.start)
    return flat.view(info.shape)


def stream_into(stage: WeightStage, assembly: Assembly, wait_s: float = 60.0) -> str:
    """Hand each of `assembly`'s tensors to `stage` as soon as its bytes are verified; returns the
    SHA-256 of every byte handed over (the whole file, header included). A StagingError if the pull
    is abandoned or stalls past `wait_s` before the last tensor."""
    manifest = assembly.manifest
    for info in manifest.tensors:
        _wait(assembly, info.end, wait_s)
        assembly.digest_through(info.end)  # hashed as it is staged, while it is still in cache
        stage.put(info.name, tensor_of(assembly.buffer, info))
    _wait(assembly, manifest.nbytes, wait_s)
    return assembly.digest()


def _wait(assembly: Assembly, upto: int, wait_s: float) -> None:
    got = assembly.wait_verified(upto, wait_s)
    if got < upto:
        why = "the pull was abandoned" if assembly.abandoned else f"no progress for {wait_s:.0f} s"
        raise StagingError(f"staging stopped at byte {got} of {assembly.manifest.nbytes}: {why}")
