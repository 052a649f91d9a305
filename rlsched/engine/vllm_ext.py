"""The vLLM worker extension rlsched loads weights through (`worker_extension_cls`).

vLLM mixes this class into each of its worker processes, so it must live in an importable module
(the workers are spawned). `collective_rpc("rlsched_load", args=(blob,))` hands every worker the
new version's BF16 safetensors bytes (the same bytes the weight service carries); the worker loads
them by their Hugging Face names and answers with the checksum of the bytes it loaded, computed
there, so the caller confirms what the worker holds rather than what it sent.

Why `reload_weights` and not `model.load_weights`: on CPUs with AVX-512/AMX, vLLM's CPU back-end
repacks each linear layer's weight for oneDNN once the model is loaded and replaces the parameter
with an empty tensor (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`). A plain
`load_weights` then fails ("Attempted to load weight (torch.Size([128, 128])) into parameter
(torch.Size([0]))"); on an AVX2 CPU the repacking falls back to torch and the weight stays, which
is why the plain call seemed to work. The worker's `reload_weights` (vLLM's own in-place reload)
restores each layer's parameters at their checkpoint shapes, loads the tensors by name, and runs
the layer's post-load processing again, so the repacked kernels hold the new weights on either
kind of CPU (and on GPUs, where it keeps the tensors CUDA graphs captured).
"""

from __future__ import annotations

from typing import Any


class RlschedWeights:
    """Mixed into vLLM's worker class: `self` is the worker (`self.model_runner.model`)."""

    model_runner: Any
    # the worker's own `reload_weights` (vLLM forbids an extension to redefine a worker attribute)
    reload_weights: Any

    def rlsched_load(self, blob: bytes) -> list[Any]:
        from safetensors.torch import load

        from rlsched.model.checkpoint import checksum

        data = bytes(blob)
        state = load(data)
        self.reload_weights(weights_iterator=list(state.items()), is_checkpoint_format=True)
        return [checksum(data), len(state)]
