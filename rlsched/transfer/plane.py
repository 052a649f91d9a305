"""Which path a version's bytes take from the weight service to an instance."""

from __future__ import annotations

from enum import StrEnum


class Plane(StrEnum):
    TCP = "tcp"  # raw TCP into a preallocated buffer: the fast path (about 0.9x of a raw socket here)
    GRPC = "grpc"  # chunks as gRPC messages (0.13x of a raw socket here: docs/benchmarks.md)
