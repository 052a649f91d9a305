"""Writing a version's safetensors bytes tensor by tensor into one buffer, as the tensors are gathered.

Publishing used to hold every gathered BF16 tensor in a state dict and then serialize them all
(`safetensors.torch.save`): two full copies of the weights in rank 0's memory at once. The header of
a safetensors file depends only on the tensors' names, dtypes and shapes, which every rank knows
before gathering anything, so the file's layout is fixed up front (`Layout`) and each tensor, once
gathered and cast, is copied straight to its place (`SafetensorsWriter.put`) and dropped: one copy,
plus the tensor being gathered.

The layout is the one `safetensors.torch.save` writes (tensors by dtype size, largest first, then by
name; the header's JSON compact, `__metadata__` first, padded with spaces to 8 bytes), so the bytes
and their SHA-256 are the same as before: a receiver cannot tell the two apart.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch

DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


@dataclass(frozen=True)
class Layout:
    header: bytes  # the 8-byte length and the padded JSON
    spans: dict[str, tuple[int, int]]  # each tensor's byte range in the whole file
    nbytes: int


def layout(specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> Layout:
    """Where each tensor's bytes go, and the header that says so."""
    unknown = [s.name for s in specs if s.dtype not in DTYPE_NAMES]
    if unknown:
        raise ValueError(f"tensors {unknown[:3]} have dtypes outside {sorted(map(str, DTYPE_NAMES))}")
    ordered = sorted(specs, key=lambda s: (-s.dtype.itemsize, s.name))
    entries: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    relative: dict[str, tuple[int, int]] = {}
    for s in ordered:
        relative[s.name] = (offset, offset + s.nbytes)
        entries[s.name] = {
            "dtype": DTYPE_NAMES[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    header = struct.pack("<Q", len(text)) + text
    base = len(header)
    spans = {name: (base + a, base + b) for name, (a, b) in relative.items()}
    return Layout(header, spans, base + offset)


class SafetensorsWriter:
    """One preallocated buffer filled tensor by tensor; `done` once every tensor is in."""

    def __init__(self, specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> None:
        self.layout = layout(specs, metadata)
        self._specs = {s.name: s for s in specs}
        self.buffer = bytearray(self.layout.nbytes)
        self.buffer[: len(self.layout.header)] = self.layout.header
        self._written: set[str] = set()

    def put(self, name: str, tensor: torch.Tensor) -> None:
        spec = self._specs.get(name)
        if spec is None:
            raise ValueError(f"tensor {name} is not in this file's layout")
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"{name}: {tensor.dtype} {tuple(tensor.shape)} does not match the layout's "
                f"{spec.dtype} {spec.shape}"
            )
        start, end = self.layout.spans[name]
        if end > start:
            place = torch.frombuffer(
                self.buffer, dtype=spec.dtype, count=(end - start) // spec.dtype.itemsize, offset=start
            )
            place.copy_(tensor.reshape(-1))
        self._written.add(name)

    @property
    def done(self) -> bool:
        return len(self._written) == len(self._specs)
