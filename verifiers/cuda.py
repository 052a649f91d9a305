"""Judge a CUDA program in two stages: compile with nvcc (CPU), then run it on a GPU and compare output.

The sample's text is the program (a fenced ```cuda / ```cpp / ```c++ block is taken from it if there is
one); the reference is JSON: `{"expected_stdout": "ok\\n", "timeout_s": 10}`. Stage one, on CPU:
`nvcc -O2` in a private temporary directory; a program that does not compile is a wrong answer
(reward 0). Stage two needs a GPU of its own: the binary runs with the time limit and its stdout is
compared with the expected output (exact, after stripping trailing whitespace). `prepare` and
`run_prepared` are the two stages apart: a pool with GPU workers (`verifier.gpu_workers`) compiles on
a CPU worker and hands the binary's bytes to a GPU worker, which holds one device exclusively (runs
sharing a device distort each other's time and reward); `verify` runs both in one place.

What it cannot judge is a typed fault, never a zero: no nvcc on this node, no CUDA device (or driver)
for the GPU stage, a malformed reference. On a machine without a GPU, such as the 2-core development
machine, every well-formed program therefore ends in `ExecutionFault(RESOURCES, "no CUDA device ...")`
after a real compile, and the rest of the batch proceeds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from verifiers.protocol import (
    ExecutionFault,
    FaultKind,
    Outcome,
    Prepared,
    Verdict,
    VerifyRequest,
    fenced_code,
)


def source_of(text: str) -> str:
    return fenced_code(text, ("cuda", "cpp", "c++", "cu"))


def cuda_device_present() -> bool:
    """A CUDA device node and a working driver on this machine."""
    if not Path("/dev/nvidia0").exists():
        return False
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass(frozen=True)
class Compiled:
    binary: Path | None  # None: it did not compile
    log: str


class CudaVerifier:
    name = "cuda"

    def __init__(self, nvcc: str | None = None, compile_timeout_s: float = 120.0) -> None:
        self.nvcc = nvcc or shutil.which("nvcc")
        self.compile_timeout_s = compile_timeout_s

    def compile_stage(self, source: str, workdir: Path) -> Compiled:
        """Stage one (CPU): nvcc -O2. Raises FileNotFoundError when there is no nvcc here."""
        if self.nvcc is None or not Path(self.nvcc).exists():
            raise FileNotFoundError("nvcc")
        (workdir / "main.cu").write_text(source)
        proc = subprocess.run(
            [self.nvcc, "-O2", "-o", str(workdir / "main"), str(workdir / "main.cu")],
            capture_output=True,
            text=True,
            timeout=self.compile_timeout_s,
            cwd=workdir,
        )
        ok = proc.returncode == 0
        return Compiled(workdir / "main" if ok else None, (proc.stderr or proc.stdout)[-2000:])

    def gpu_stage(self, binary: Path, expected: str, timeout_s: float, request: VerifyRequest) -> Outcome:
        """Stage two (one GPU, exclusive): run and compare stdout."""
        if not cuda_device_present():
            return ExecutionFault(
                request.sample_id,
                FaultKind.RESOURCES,
                "cuda: no CUDA device (or driver) on this node for the GPU stage; route cuda "
                "verifications to a worker that holds a GPU",
                request.attempt,
            )
        try:
            proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:  # subprocess.run kills the program and waits for it
            return Verdict(request.sample_id, 0.0, False, f"timeout: did not finish within {timeout_s:g} s")
        correct = proc.returncode == 0 and proc.stdout.rstrip() == expected.rstrip()
        detail = "" if correct else f"exit {proc.returncode}, stdout {proc.stdout[:80]!r}"
        return Verdict(request.sample_id, 1.0 if correct else 0.0, correct, detail)

    def verify(self, request: VerifyRequest) -> Outcome:
        """Both stages here, one after the other (a pool without GPU workers)."""
        prepared = self.prepare(request)
        if not isinstance(prepared, Prepared):
            return prepared
        return self.run_prepared(request, prepared.payload)

    def prepare(self, request: VerifyRequest) -> Outcome | Prepared:
        """Stage one, on a CPU worker: the compiled binary's bytes, or the outcome if it ends here."""
        spec = _spec(request)
        if isinstance(spec, ExecutionFault):
            return spec
        with tempfile.TemporaryDirectory(prefix="rlsched-cuda-") as tmp:
            try:
                compiled = self.compile_stage(source_of(request.text), Path(tmp))
            except FileNotFoundError:
                detail = (
                    "cuda: nvcc is not installed on this node; install the CUDA toolkit or route cuda work"
                )
                return ExecutionFault(request.sample_id, FaultKind.RESOURCES, detail, request.attempt)
            except subprocess.TimeoutExpired:
                detail = f"cuda: nvcc took longer than {self.compile_timeout_s:g} s"
                return ExecutionFault(request.sample_id, FaultKind.TIMEOUT, detail, request.attempt)
            if compiled.binary is None:
                return Verdict(request.sample_id, 0.0, False, f"does not compile: {compiled.log[-300:]}")
            return Prepared(request.sample_id, compiled.binary.read_bytes(), "compiled")

    def run_prepared(self, request: VerifyRequest, payload: bytes) -> Outcome:
        """Stage two, on a worker holding a GPU of its own: run the binary, compare its stdout."""
        spec = _spec(request)
        if isinstance(spec, ExecutionFault):
            return spec
        expected, timeout_s = spec
        with tempfile.TemporaryDirectory(prefix="rlsched-cuda-") as tmp:
            binary = Path(tmp) / "main"
            binary.write_bytes(payload)
            binary.chmod(0o700)
            return self.gpu_stage(binary, expected, timeout_s, request)


def _spec(request: VerifyRequest) -> tuple[str, float] | ExecutionFault:
    try:
        spec = json.loads(request.reference)
        return str(spec["expected_stdout"]), float(spec.get("timeout_s", 10.0))
    except (ValueError, KeyError, TypeError) as err:
        detail = f"cuda: reference is not {{'expected_stdout': ...}} JSON: {err}"
        return ExecutionFault(request.sample_id, FaultKind.CRASH, detail, request.attempt)
