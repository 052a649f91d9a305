"""The checks that need a GPU, in one short run that prints one table (`scripts/gpu_check.sh` runs it
on a lent machine; `--device cpu` runs the same steps here, to keep the script working).

Needs torch, transformers, safetensors, pydantic and this checkout; no Ray, no vLLM, no model
download: the model is a random-weight Llama of SmolLM2-135M's shape (or `--small`), built locally.

1. **Trainer step.** rlsched's own rank (`RankTrainer`) in a one-rank process group (NCCL on a GPU,
   gloo on the CPU) on one fixed batch, three ways: `replicate`, `fsdp` (at one rank, a replica),
   and `fsdp` with `offload`, which shards with FSDP2 (CPU offload: parameters and optimizer state
   in host memory, copied in per layer). BF16 mixed precision on the GPU. Figures: median step time
   and the losses of each, which must agree (the same step, done three ways).
2. **Torch engine.** The rollout engine (`TorchRolloutEngine`) on the device: `--requests` requests of
   `--tokens` tokens each (seeded, no stop), tokens per second, and that every request finished.
3. **Weight load.** The engine loads the model's BF16 safetensors bytes in place, by tensor name
   (median of 3), with the SHA-256 it returns checked against the bytes. Loading bucket by bucket
   as bytes arrive is not built yet; this is the whole-file load it will be compared with.
4. **CUDA verifier.** Where a CUDA toolkit is found: a kernel compiled and run by the `cuda` verifier,
   both stages in the sandbox (the run stage with only the GPU's device nodes and no address-space
   limit), scored against its expected output; a fault names what stopped it.
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import time

import torch
import torch.distributed as dist
from bench_fsdp import random_batch

from rlsched.config import GRPOConfig, Precision, TrainerConfig
from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams, WeightVersion
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import checksum, load_checkpoint, to_bf16_bytes
from rlsched.rl.rank import RankTrainer
from rlsched.rl.sharding import join_group


def llama(small: bool, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = (128, 2, 512, 320) if small else (576, 30, 1536, 49152)  # hidden, layers, mlp, vocab
    hidden, layers, mlp, vocab = shape
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 192), head_dim=64,
        max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=3, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def trainer_steps(args: argparse.Namespace, gpu: bool) -> list[list[object]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    device = torch.device("cuda" if gpu else "cpu")
    join_group(address, 0, 1, 120, device)
    rows: list[list[object]] = []
    try:
        for strategy, offload in (("replicate", False), ("fsdp", False), ("fsdp", True)):
            if offload and not gpu:
                continue  # offload moves a GPU rank's shards to host memory
            cfg = TrainerConfig(
                ranks=1,
                strategy=strategy,
                offload=offload,
                gpus_per_rank=1 if gpu else 0,
                precision=Precision.BF16 if gpu else Precision.FP32,
                micro_batch_tokens=4096,
            )
            model = llama(args.small, args.seed)
            trainer = RankTrainer(0, 1, model, 3, GRPOConfig(lr=1e-5, warmup_steps=0), cfg)
            items = random_batch(args.rows, args.length, args.length, model.config.vocab_size, args.seed)
            total = float(sum(len(i.token_ids) for i in items))
            losses, times = [], []
            for _ in range(args.steps):
                if gpu:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                losses.append(trainer.step(items, total).loss)
                if gpu:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            held = trainer.held()
            name = f"{strategy}{' + offload' if offload else ''}"
            rows.append(
                [f"train {name}", f"{statistics.median(times[1:]):.3f} s/step",
                 f"losses {losses[0]:+.5f} .. {losses[-1]:+.5f}", f"held {held.total / 2**20:.0f} MiB"]
            )  # fmt: skip
            print(rows[-1], flush=True)
            del trainer, model
            if gpu:
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return rows


def engine_and_load(args: argparse.Namespace, gpu: bool) -> list[list[object]]:
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    model = llama(args.small, args.seed).to(device, dtype)
    engine = TorchRolloutEngine(
        model, load_checkpoint(None).tokenizer, max_batch=args.requests, seed=args.seed
    )
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    requests = [
        GenerationRequest(
            RequestId(f"r{i}"),
            tuple(torch.randint(4, vocab, (32,), generator=gen).tolist()),
            SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i),
        )
        for i in range(args.requests)
    ]
    list(engine.generate(requests[:2]))  # warm-up
    start = time.perf_counter()
    samples = list(engine.generate(requests))
    took = time.perf_counter() - start
    made = sum(len(s.token_ids) for s in samples)
    complete = len(samples) == len(requests) and made == args.requests * args.tokens
    rows: list[list[object]] = [
        ["torch engine", f"{made / took:.0f} tokens/s", f"{args.requests} x {args.tokens} tokens",
         "every request complete" if complete else "INCOMPLETE"]
    ]  # fmt: skip
    blob = to_bf16_bytes(model)
    times, sums = [], set()
    for v in range(3):
        start = time.perf_counter()
        sums.add(engine.load_weights(blob, WeightVersion(v + 1)))
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    good = sums == {checksum(blob)}
    load = statistics.median(times)
    rows.append(
        ["weight load (whole file)", f"{load:.3f} s",
         f"{len(blob) / 1e6:.0f} MB at {len(blob) / load / 1e9:.2f} GB/s",
         "checksum confirmed" if good else "CHECKSUM MISMATCH"]
    )  # fmt: skip
    return rows


KERNEL = """#include <cstdio>
__global__ void one(int *x) { *x = 1; }
int main() { int *d, h = 0; cudaMalloc(&d, sizeof(int)); one<<<1, 1>>>(d);
  cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost); printf("%d\\n", h); return 0; }
"""


def cuda_verifier() -> list[list[object]]:
    """The cuda kind's two stages, in the sandbox, on this machine's GPU (or its fault)."""
    from verifiers.cuda import CudaVerifier, find_toolkit, gpu_device_nodes
    from verifiers.protocol import VerifyRequest

    if find_toolkit() is None:
        return [["cuda verifier", "skipped", "no CUDA toolkit (nvcc, nvvm/) here", ""]]
    start = time.perf_counter()
    outcome = CudaVerifier().verify(VerifyRequest("k", KERNEL, '{"expected_stdout": "1"}'))
    took = time.perf_counter() - start
    nodes = ",".join(gpu_device_nodes()) or "none"
    return [["cuda verifier (sandboxed)", f"{took:.2f} s", f"devices {nodes}", repr(outcome)[:160]]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="a 0.5M-parameter Llama instead of SmolLM2's shape")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=128, help="prompt and completion tokens each")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        print("no CUDA device here: run it on a machine with a GPU, or pass --device cpu")
        raise SystemExit(2)
    where = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    print(f"gpu_check on {where}, torch {torch.__version__}", flush=True)
    rows = trainer_steps(args, gpu) + engine_and_load(args, gpu) + cuda_verifier()
    width = [max(len(str(r[k])) for r in rows) for k in range(4)]
    print()
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, width, strict=True)))


if __name__ == "__main__":
    main()
