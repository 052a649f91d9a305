"""Rollout instances: Ray actors that hold a rollout engine, follow the instance lifecycle, and stream
each finished sample back the moment it exists (a Ray streaming generator, not a list at the end).

An instance receives each new weight version as BF16 bytes (today through the object store), loads
it, confirms the checksum the engine computed against the published one, and only then is READY to
take requests. Every sample carries the version that produced it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import ray
import torch

from rlsched.engine.protocol import GenerationRequest, RequestId, Sample, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint
from rlsched.policy.lifecycle import InstanceState, transition


class NotReady(RuntimeError):
    """Requests sent to an instance that is not READY: a controller bug, never silently served."""


@ray.remote(max_concurrency=2)  # one thread streams samples, the other can abort them
class RolloutInstance:
    def __init__(
        self, instance_id: str, checkpoint: str | None, max_batch: int, use_cache: bool, seed: int
    ) -> None:
        torch.set_num_threads(1)
        self.instance_id = instance_id
        self.state = transition(InstanceState.REQUESTED, InstanceState.ALLOCATED)
        ckpt = load_checkpoint(Path(checkpoint) if checkpoint else None)
        self.engine = TorchRolloutEngine(
            ckpt.model, ckpt.tokenizer, max_batch=max_batch, use_cache=use_cache, seed=seed
        )

    def _to(self, target: InstanceState) -> None:
        self.state = transition(self.state, target)

    def load(self, blob: bytes, version: int, expected_checksum: str) -> tuple[str, float, float]:
        """LOADING -> CONFIRMING -> READY; returns the state and the span of the load."""
        start = time.monotonic()
        self._to(InstanceState.LOADING)
        loaded = self.engine.load_weights(blob, WeightVersion(version))
        self._to(InstanceState.CONFIRMING)
        if loaded != expected_checksum:
            self._to(InstanceState.LOADING)
            raise RuntimeError(
                f"{self.instance_id}: loaded checksum {loaded[:12]} != published {expected_checksum[:12]}"
            )
        self._to(InstanceState.READY)
        return str(self.state), start, time.monotonic()

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Sample]:
        if self.state is not InstanceState.READY:
            raise NotReady(f"{self.instance_id} is {self.state}, not ready")
        yield from self.engine.generate(requests)

    def complete(self, requests: Sequence[GenerationRequest]) -> list[Sample]:
        """All samples at once (evaluation, where nothing overlaps)."""
        return list(self.generate(requests))

    def abort(self, request_id: str) -> None:
        self.engine.abort(RequestId(request_id))

    def status(self) -> tuple[str, int]:
        return str(self.state), int(self.engine.version)

    def release(self) -> str:
        if self.state is InstanceState.READY:
            self._to(InstanceState.DRAINING)
        self._to(InstanceState.RELEASED)
        return str(self.state)
