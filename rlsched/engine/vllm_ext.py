"""The vLLM worker extension rlsched loads weights through (`worker_extension_cls`).

vLLM mixes this class into each of its worker processes, so it must live in an importable module
(the workers are spawned). `collective_rpc("rlsched_load", args=(blob,))` hands every worker the
new version's BF16 safetensors bytes (the same bytes the weight service carries); the worker loads
them by their Hugging Face names (`load_weights` maps them onto vLLM's fused parameters) and answers
with the checksum of the bytes it loaded, computed there, so the caller confirms what the worker
holds rather than what it sent.
"""

from __future__ import annotations

from typing import Any


class RlschedWeights:
    """Mixed into vLLM's worker class: `self` is the worker (`self.model_runner.model`)."""

    model_runner: Any

    def rlsched_load(self, blob: bytes) -> list[Any]:
        from safetensors.torch import load

        from rlsched.model.checkpoint import checksum

        state = load(bytes(blob))
        loaded = self.model_runner.model.load_weights(weights=list(state.items()))
        return [checksum(bytes(blob)), len(loaded)]
