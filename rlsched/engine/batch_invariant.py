"""Batch-invariant generation: a request's tokens and log-probs do not depend on its batch neighbours.

A requeued request (its instance reclaimed or killed) is generated again from its seed, on another
instance, in another batch; a job's curve after a recovery equals the uninterrupted run's only if
the two generations agree to the bit (the update's importance ratio reads the sampled log-probs).
Sampling already draws from one generator per request (`rlsched.engine.sampling`), and every
per-row operation (norms, attention over the row's own cache, softmax) is independent of the
other rows. The matmuls are not: on the CPU a linear layer's BLAS kernel, its blocking and the way
its threads split the work depend on the number of rows (`M`), and a row's sums come out in another
order in another `M`. How far that goes is the CPU's, measured with torch 2.13's `F.linear` against
the same rows of a 4,096-row product:

- AMD EPYC (AVX-512, and held to AVX2): `M` of 1 to 3 differ, every `M` tried from 4 up agrees;
- Intel Xeon (AVX-512, AMX), one thread: every `M` below 16 differs for an inner size of 384 and
  up (below 3 for 64); two threads: products of up to 64 rows differ for inner sizes of 1,536 and up.

So no number of rows is a floor above which every CPU agrees. What holds on both, for fp32 and
BF16, one thread or two, is that a row's result in a product of a *fixed* number of rows does not
depend on where in the product it sits. With `engine.batch_invariant: true` every linear layer of
the engine's model therefore computes its rows in products of exactly `ROWS` rows: the input is
padded with zero rows to a multiple of `ROWS`, multiplied as a batch of `ROWS`-row products
(`torch.bmm`, which runs each one alone), and cut back. A row gets the same bits alone, in a batch
of 5 or in one of 64 (`tests/component/test_engine.py`).

What it costs (SmolLM2's 576 x 1,536 projection, Intel Xeon, two threads): a lone row at the price
of 16 (346 us against 70), 64 rows 1.5x, a 2,048-row prefill 1.9x. So it is off by default (as
vLLM's batch-invariant mode is) and on where a run must reproduce itself: the chaos trials, which
compare a recovered run's curve with an uninterrupted one's. GPUs are not covered: cuBLAS picks
kernels by shape in other ways.
"""

from __future__ import annotations

import types
from typing import Any

import torch

ROWS = 16  # the rows of every product: the fewest at which both CPUs measured keep their kernel


def fixed_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, with every row computed in a product of exactly `ROWS` rows."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if rows == 0:
        return torch.nn.functional.linear(x, weight, bias)
    flat = x.reshape(rows, width)
    pad = -rows % ROWS
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad, width)])
    products = flat.shape[0] // ROWS
    out = torch.bmm(flat.view(products, ROWS, width), weight.t().unsqueeze(0).expand(products, -1, -1))
    out = out.reshape(products * ROWS, -1)[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return fixed_rows(x, self.weight, self.bias)


def make_batch_invariant(model: Any) -> None:
    """Give every `nn.Linear` of `model` products of `ROWS` rows; the model keeps them (a second call
    finds them there). Subclasses (quantized, LoRA) keep their own forward."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and getattr(module.forward, "__func__", None) is not _forward:
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
