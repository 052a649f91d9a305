"""Batch-invariant generation: a request's tokens and log-probs do not depend on its batch neighbours.

A requeued request (its instance reclaimed or killed) is generated again from its seed, on another
instance, in another batch; a job's curve after a recovery equals the uninterrupted run's only if
the two generations agree to the bit (the update's importance ratio reads the sampled log-probs).
Sampling already draws from one generator per request (`rlsched.engine.sampling`), and every
per-row operation (norms, attention over the row's own cache, softmax) is independent of the
other rows. The matmuls are not: on the CPU a linear layer over 1 to 3 rows (`M` in BLAS terms)
takes another kernel than over 4 or more, and its sums come out in another order. Measured with
torch 2.13's fp32 `F.linear` on an AMD EPYC (AVX-512 and held to AVX2 alike): rows of an `M` in
{1, 2, 3} product differ in the last bits from the same rows of a larger product, every `M` from
4 to 4096 agrees. The quickstart's 64 seeded requests, generated alone, gave other log-probs for 14
of 16; in batches of 5 (whose last decode steps run 1 to 4 rows), for 6 of 64.

So the engine's linear layers compute at least `ROW_FLOOR` rows: a smaller input is padded with
zero rows and the result cut back. That costs a lone row's decode step about the time of four rows:
SmolLM2 decoding one request ran at 0.64x the tokens/s in fp32, 0.87x in BF16 (`bench_engine.py`).
A job's batches pay it only in their last steps; `engine.batch_invariant: false` turns it off, and
`rlsched serve` on its own, which regenerates nothing, runs without it. BF16 on a
CPU with BF16 units runs through oneDNN and agreed without the floor in the same measurement; GPUs
are not covered (cuBLAS picks kernels by shape in other ways).
"""

from __future__ import annotations

import types
from typing import Any

import torch

ROW_FLOOR = 4  # the fewest rows a CPU matmul runs with the kernel every larger batch runs
_MARK = "_rlsched_row_floor"


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


def make_batch_invariant(model: Any) -> int:
    """Give every `nn.Linear` of `model` the row floor (once; the model keeps it); how many there are."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:  # subclasses (quantized, LoRA) keep their own forward
            if not getattr(module, _MARK, False):
                module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
                setattr(module, _MARK, True)
            count += 1
    return count
