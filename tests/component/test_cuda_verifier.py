"""The CUDA verifier: a real nvcc compile where the toolkit exists; without a GPU the GPU stage is a
typed fault naming what is missing, never a zero; a program that does not compile is a wrong answer."""

from __future__ import annotations

import json
import shutil

import pytest

from verifiers.cuda import CudaVerifier, cuda_device_present, source_of
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed"
)
KERNEL = """```cuda
#include <cstdio>
__global__ void one(int *x) { *x = 1; }
int main() { int *d, h = 0; cudaMalloc(&d, sizeof(int)); one<<<1, 1>>>(d);
  cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost); printf("%d\\n", h); return 0; }
```"""
REFERENCE = json.dumps({"expected_stdout": "1\n", "timeout_s": 10})


@needs_nvcc
def test_two_stages_compile_then_need_a_gpu() -> None:
    outcome = CudaVerifier().verify(VerifyRequest("s1", KERNEL, REFERENCE))
    if cuda_device_present():
        assert isinstance(outcome, Verdict) and outcome.correct
    else:  # compiled for real, then the GPU stage says what is missing
        assert isinstance(outcome, ExecutionFault) and outcome.kind is FaultKind.RESOURCES
        assert "no CUDA device" in outcome.detail


@needs_nvcc
def test_a_program_that_does_not_compile_is_a_wrong_answer() -> None:
    outcome = CudaVerifier().verify(VerifyRequest("s2", "__global__ void broken( {", REFERENCE))
    assert isinstance(outcome, Verdict) and not outcome.correct and "does not compile" in outcome.detail


def test_missing_toolkit_and_bad_reference_are_faults() -> None:
    no_nvcc = CudaVerifier(nvcc="/nonexistent/nvcc").verify(VerifyRequest("s3", KERNEL, REFERENCE))
    assert (
        isinstance(no_nvcc, ExecutionFault)
        and no_nvcc.kind is FaultKind.RESOURCES
        and "nvcc" in no_nvcc.detail
    )
    bad = CudaVerifier().verify(VerifyRequest("s4", KERNEL, "{}"))
    assert isinstance(bad, ExecutionFault) and bad.kind is FaultKind.CRASH
    assert source_of("x\n```cu\nint a;\n```") == "int a;\n"
