"""The vLLM worker extension rlsched loads weights through (`worker_extension_cls`).

vLLM mixes this class into each of its worker processes, so it must live in an importable module
(the workers are spawned). `collective_rpc("rlsched_load_file", args=(path,))` hands every worker
the path of the new version's BF16 safetensors bytes (the same bytes the weight service carries),
written once to shared memory; the worker maps the file, loads the tensors by their Hugging Face
names one at a time from the mapping, and answers with the checksum of the bytes it read, computed
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

    def rlsched_load_file(self, path: str) -> list[Any]:
        """Load the safetensors file at `path` (in shared memory) by Hugging Face names, straight
        from its mapping; answer with the SHA-256 of the bytes read and the number of tensors."""
        import hashlib
        import mmap

        from safetensors import safe_open

        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            digest = hashlib.sha256(view).hexdigest()
        with safe_open(path, framework="pt") as tensors:
            names = list(tensors.keys())
            self.reload_weights(
                weights_iterator=((n, tensors.get_tensor(n)) for n in names), is_checkpoint_format=True
            )
        self._repack_tied_head(set(names))
        return [digest, len(names)]

    def _repack_tied_head(self, names: set[str]) -> None:
        """A head tied to the embeddings comes without weights of its own, so the reload leaves its
        post-load processing undone; on CPUs vLLM packed its weight into a oneDNN kernel at start,
        which would go on computing logits with the first version's weights. Pack it again."""
        head = getattr(self.model_runner.model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if head is not None and method is not None and "lm_head.weight" not in names:
            method.process_weights_after_loading(head)
