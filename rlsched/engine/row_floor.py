"""Batch-invariant generation: a request's tokens and log-probs do not depend on its batch neighbours.

A requeued request (its instance reclaimed or killed) is generated again from its seed, on another
instance, in another batch; a job's curve after a recovery equals the uninterrupted run's only if
the two generations agree to the bit (the update's importance ratio reads the sampled log-probs).
Sampling already draws from one generator per request (`rlsched.engine.sampling`), and every
per-row operation (norms, attention over the row's own cache, softmax) is independent of the
other rows. The matmuls are not: on the CPU a linear layer over 1 to 3 rows (`M` in BLAS terms)
takes another kernel than over 4 or more, and its sums come out in another order. Measured with
torch 2.13's fp32 `F.linear` on an AMD EPYC (AVX-512 and held to AVX2 alike): rows of an `M` in
{1, 2, 3} product differ in the last bits from the same rows of a 4,096-row product; every `M`
tried from 4 up (4 to 32, and 11 sizes from 47 to 3,000) agrees. Of the quickstart's 64 seeded
requests of one iteration, 14 of the first 16 got other log-probs generated alone than in one batch
of 64, and 6 of 64 in batches of 5 (whose last decode steps run 1 to 4 rows).

So with `engine.batch_invariant: true` the engine's linear layers compute at least `ROW_FLOOR`
rows: a smaller input is padded with zero rows and the result cut back. BF16 needs it as much:
SmolLM2 in BF16 here gave 5 of 6 seeded requests other tokens alone than in a batch of 16 without
the floor, none with it. It costs a lone row's decode step about the time of four rows: SmolLM2
decoding one request ran at 0.64x the tokens/s in fp32 and 0.87x in BF16 (`bench_engine.py`), and
the multi-turn Ray test, whose instances run a few episodes each, took 144 s with it against 117 s.
So it is off by default (as vLLM's batch-invariant mode is) and on where a run must reproduce
itself: the chaos trials, which compare a recovered run's curve with an uninterrupted one's. GPUs
are not covered: cuBLAS picks kernels by shape in other ways.
"""

from __future__ import annotations

import types
from typing import Any

import torch

ROW_FLOOR = 4  # the fewest rows a CPU matmul runs with the kernel every larger batch runs


def floor_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, computed over at least `ROW_FLOOR` rows."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows >= ROW_FLOOR or rows == 0:
        return torch.nn.functional.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(ROW_FLOOR - rows, flat.shape[-1])])
    out = torch.nn.functional.linear(padded, weight, bias)[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return floor_rows(x, self.weight, self.bias)


def make_batch_invariant(model: Any) -> None:
    """Give every `nn.Linear` of `model` the row floor; the model keeps it (a second call finds it
    there). Subclasses (quantized, LoRA) keep their own forward."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and getattr(module.forward, "__func__", None) is not _forward:
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
