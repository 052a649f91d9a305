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
kind of CPU (and on GPUs, where it keeps the tensors CUDA graphs captured). A head tied to the
embeddings is then packed again (`_repack_tied_head`): the reload does not process it, and on CPUs its
packed kernel would otherwise keep the first version's weights (found by the conformance suite: on
tied SmolLM2 and tied Llama, vLLM's log-probs after an update sat 3-4 times further from the
reference than before it).
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
        self._repack_tied_head(state)
        return [checksum(data), len(state)]

    def _repack_tied_head(self, state: dict[str, Any]) -> None:
        """A head tied to the embeddings comes without weights of its own, so the reload leaves its
        post-load processing undone; on CPUs vLLM packed its weight into a oneDNN kernel at start,
        which would go on computing logits with the first version's weights. Pack it again."""
        head = getattr(self.model_runner.model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if head is not None and method is not None and "lm_head.weight" not in state:
            method.process_weights_after_loading(head)
