"""Which precision a device computes well, decided once for every path that trains or generates.

BF16 is a trap on a CPU without BF16 units: there oneDNN emulates it, and a 1024^3 matmul ran 50
times slower than fp32 on an AVX2-only EPYC (0.6 against 29 GFLOPS on one thread). So `auto` (the
default of `trainer.precision` and `engine.dtype`) picks BF16 only where the device computes it
natively: a GPU with BF16 support, or a CPU whose oneDNN reports BF16 (AVX-512 BF16 or AMX). The
trainer, the tool-call warm-up and the benchmarks all resolve their setting here, and so does the
engine's `dtype: auto`: one test for one question.

Forcing `bf16` on a device without BF16 units is allowed (a user may want the numerics), but it
prints one warning with the measured ratio of a BF16 matmul's time to an fp32 one's.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from rlsched.config import Precision

log = logging.getLogger(__name__)


def bf16_native(device_type: str = "cpu") -> bool:
    """Whether `device_type` ("cpu" or "cuda") computes BF16 in hardware rather than emulating it."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def matmul_ratio(device_type: str = "cpu", side: int = 256, repeats: int = 3) -> float:
    """How many times longer a `side`^3 BF16 matmul takes than an fp32 one here (best of `repeats`)."""
    device = torch.device(device_type)
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(side, side, device=device).to(dtype)
        b = torch.randn(side, side, device=device).to(dtype)
        best = float("inf")
        for _ in range(repeats + 1):  # the first one warms the kernel up
            start = time.perf_counter()
            (a @ b).sum().item()
            best = min(best, time.perf_counter() - start)
        seconds[dtype] = best
    return seconds[torch.bfloat16] / max(seconds[torch.float32], 1e-9)


@functools.cache
def _warn_emulated(device_type: str) -> None:
    """The one warning for BF16 forced where it is emulated, with its measured cost."""
    ratio = matmul_ratio(device_type)
    log.warning(
        "trainer.precision is bf16, but this %s has no BF16 units: a BF16 matmul took %.1fx an fp32 "
        "one here; set trainer.precision: auto (or fp32) to train in fp32",
        device_type,
        ratio,
    )


def train_precision(requested: Precision, device_type: str = "cpu") -> Precision:
    """`trainer.precision` resolved for `device_type`: auto becomes bf16 where BF16 is native, fp32
    elsewhere; bf16 forced where it is emulated stays bf16, with one warning."""
    native = bf16_native(device_type)
    if requested is Precision.AUTO:
        return Precision.BF16 if native else Precision.FP32
    if requested is Precision.BF16 and not native:
        _warn_emulated(device_type)
    return requested


def autocast(precision: Precision, device_type: str = "cpu") -> torch.autocast:
    """The autocast context for a training pass at `precision` (resolved here first): BF16 matmuls
    over fp32 masters, or a disabled autocast for fp32."""
    resolved = train_precision(precision, device_type)
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=resolved is Precision.BF16)
