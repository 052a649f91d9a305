"""Judge a CUDA program in two stages, both in the sandbox: compile with nvcc (CPU), then run it on a
GPU and compare its output on the host.

The sample's text is the program (a fenced ```cuda / ```cpp / ```c++ block is taken from it if there is
one); the reference is JSON: `{"expected_stdout": "ok\\n", "timeout_s": 10}`. Stage one, on CPU:
`nvcc -O2` in the hardened sandbox (`verifiers/sandbox.py`), with the toolkit bound read-only at its
own path beside the system's compiler, headers and libraries (`/usr`, `/lib*`) and nothing of the
checkout, `/root`, `/home` or the rest of `/usr/local`. A program that does not compile is a wrong
answer (reward 0), and so is one whose compile the sandbox stops (past `compile_timeout_s`, or over
the memory limit: `#include "/dev/zero"`). Stage two needs a GPU of its own: the binary runs in a
fresh sandbox with only the GPU's device nodes added to `/dev` and no address-space limit (the CUDA
runtime reserves terabytes of virtual addresses; the run's cgroup bounds its memory). Its stdout is
compared on the host (exact, after stripping trailing whitespace): the expected output never enters
any process the program can reach, and the host is outside the run's PID namespace. `prepare` and
`run_prepared` are the two stages apart: a pool with GPU workers (`verifier.gpu_workers`) compiles on
a CPU worker and hands the binary's bytes to a GPU worker, which holds one device exclusively (runs
sharing a device distort each other's time and reward); `verify` runs both in one place.

A run past the task's time limit is a wrong answer, as a judge scores a time limit exceeded. What it
cannot judge is a typed fault, never a zero: no nvcc on this node, no CUDA device (or driver) for the
GPU stage, a malformed reference, or a sandbox that refuses to run (a machine without its isolation,
as for the Python sandbox). On a machine without a GPU, such as the 2-core development machine, every
well-formed program therefore ends in `ExecutionFault(RESOURCES, "no CUDA device ...")` after a real
compile, and the rest of the batch proceeds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, replace
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
from verifiers.sandbox import Outcome as Run
from verifiers.sandbox import Sandbox, SandboxLimits, SandboxPolicy, SandboxResult

BINARY_MB = 64  # the largest binary the compile stage may hand on
COMPILE = SandboxLimits(
    timeout_s=120.0,
    cpu_s=120,
    memory_mb=2048,  # cicc and cc1plus on a large translation unit
    file_mb=BINARY_MB,
    open_files=256,
    processes=32,
    work_mb=BINARY_MB * 2,
    tmp_mb=512,  # nvcc's intermediate files
)
RUN = SandboxLimits(
    timeout_s=10.0,
    cpu_s=10,
    memory_mb=4096,
    open_files=256,
    processes=64,  # the CUDA runtime's threads
    limit_address_space=False,
)
MAX_RUN_S = 600.0  # the longest time limit a reference may set
# the nodes a CUDA program opens besides its GPU's own (/dev/nvidiaN)
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


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


def gpu_device_nodes(visible: str | None = None) -> tuple[str, ...]:
    """The device nodes a run on this worker's GPU opens: the control nodes, and `/dev/nvidiaN` for
    each index in `CUDA_VISIBLE_DEVICES` (Ray sets it to the GPUs an actor holds), else every GPU's.
    An index is taken as the node's minor number (nvidia-smi's order, which Ray's indices follow)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    present = sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    if visible is not None and visible.strip():
        wanted = {f"nvidia{v.strip()}" for v in visible.split(",") if v.strip().isdigit()}
        present = [name for name in present if name in wanted]
    controls = [name for name in CONTROL_NODES if Path("/dev", name).exists()]
    return (*controls, *present)


INSTALLED = Path("/usr/local")  # where NVIDIA's installers put cuda and cuda-X.Y


def find_toolkit(nvcc: str | None = None) -> Path | None:
    """The CUDA toolkit's root (it holds `bin/nvcc` and `nvvm/`): beside `nvcc` when given, else
    `CUDA_HOME` or `CUDA_PATH`, else the real path of the `nvcc` on PATH, else /usr/local/cuda and
    /usr/local/cuda-* (the newest first), else PyPI's toolkit in this interpreter's site-packages
    (`nvidia/cu13` on sys.path: `make setup` installs it where none of the others is found)."""
    candidates: list[Path] = []
    if nvcc is not None:
        candidates.append(Path(nvcc).resolve().parent.parent)
    else:
        candidates += [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
        found = shutil.which("nvcc")
        if found is not None:
            candidates.append(Path(found).resolve().parent.parent)
        candidates.append(INSTALLED / "cuda")
        candidates += sorted(INSTALLED.glob("cuda-*"), key=_version, reverse=True)
        candidates += [Path(d) / "nvidia" / cu for d in sys.path if d for cu in ("cu13", "cu12")]
    for root in candidates:
        root = root.resolve()
        if (root / "bin" / "nvcc").is_file() and (root / "nvvm").is_dir():
            return root
    return None


def _version(path: Path) -> tuple[int, ...]:
    """`cuda-12.10` as (12, 10), so that 12.10 sorts after 12.9."""
    return tuple(int(part) for part in re.findall(r"\d+", path.name))


@dataclass(frozen=True)
class Compiled:
    binary: bytes | None  # None: it did not compile
    log: str


class CudaVerifier:
    name = "cuda"

    def __init__(
        self,
        nvcc: str | None = None,
        compile_timeout_s: float = COMPILE.timeout_s,
        policy: SandboxPolicy | None = None,
    ) -> None:
        self.toolkit = find_toolkit(nvcc)
        self.compile_limits = replace(
            COMPILE, timeout_s=compile_timeout_s, cpu_s=max(1, int(compile_timeout_s))
        )
        self.policy = policy or SandboxPolicy()

    @property
    def compile_timeout_s(self) -> float:
        return self.compile_limits.timeout_s

    def compile_stage(self, source: str) -> Compiled | ExecutionFault:
        """Stage one (CPU): nvcc -O2 in the sandbox. Raises FileNotFoundError when there is no nvcc here."""
        if self.toolkit is None:
            raise FileNotFoundError("nvcc")
        root = str(self.toolkit)
        policy = replace(self.policy, read_only=(*self.policy.read_only, (root, root)))
        with Sandbox.create(policy, work_mb=self.compile_limits.work_mb) as box:
            assert box.work is not None
            _write_owned(box, "main.cu", source.encode())
            # -L lib: PyPI's toolkit keeps its libraries there (an installed one, in lib64)
            argv = [f"{root}/bin/nvcc", "-O2", f"-L{root}/lib", "-o", "/work/main", "/work/main.cu"]
            result = box.exec(argv=argv, limits=self.compile_limits)
            if result.outcome is Run.ERROR:
                return _refused(result)
            if result.outcome is not Run.OK:
                return Compiled(None, _stopped(result, self.compile_limits, "nvcc"))
            binary = _read_owned(box.work / "main", BINARY_MB << 20)
        if binary is None:
            return Compiled(None, "nvcc wrote no binary (or one larger than the limit)")
        return Compiled(binary, result.stderr[-2000:])

    def gpu_stage(self, binary: bytes, expected: str, timeout_s: float, request: VerifyRequest) -> Outcome:
        """Stage two (one GPU, exclusive): run in a sandbox with the GPU's nodes, compare stdout here."""
        if not cuda_device_present():
            return ExecutionFault(
                request.sample_id,
                FaultKind.RESOURCES,
                "cuda: no CUDA device (or driver) on this node for the GPU stage; route cuda "
                "verifications to a worker that holds a GPU",
                request.attempt,
            )
        policy = replace(self.policy, devices=(*self.policy.devices, *gpu_device_nodes()))
        limits = replace(RUN, timeout_s=timeout_s, cpu_s=max(1, int(timeout_s) + 1))
        with Sandbox.create(policy, work_mb=BINARY_MB + 16) as box:
            _write_owned(box, "main", binary, mode=0o500)
            result = box.exec(argv=["/work/main"], limits=limits)
        if result.outcome is Run.ERROR:
            return _refused(result)
        if result.outcome is not Run.OK and result.outcome is not Run.EXIT:
            return Verdict(request.sample_id, 0.0, False, _stopped(result, limits, "the program"))
        correct = result.outcome is Run.OK and result.stdout.rstrip() == expected.rstrip()
        detail = "" if correct else f"exit {result.exit_code}, stdout {result.stdout[:80]!r}"
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
        try:
            compiled = self.compile_stage(source_of(request.text))
        except FileNotFoundError:
            detail = "cuda: nvcc is not installed on this node; install the CUDA toolkit or route cuda work"
            return ExecutionFault(request.sample_id, FaultKind.RESOURCES, detail, request.attempt)
        if isinstance(compiled, ExecutionFault):
            return replace(compiled, sample_id=request.sample_id, attempt=request.attempt)
        if compiled.binary is None:
            return Verdict(request.sample_id, 0.0, False, f"does not compile: {compiled.log[-300:]}")
        return Prepared(request.sample_id, compiled.binary, "compiled")

    def run_prepared(self, request: VerifyRequest, payload: bytes) -> Outcome:
        """Stage two, on a worker holding a GPU of its own: run the binary, compare its stdout."""
        spec = _spec(request)
        if isinstance(spec, ExecutionFault):
            return spec
        expected, timeout_s = spec
        outcome = self.gpu_stage(payload, expected, timeout_s, request)
        if isinstance(outcome, ExecutionFault):
            return replace(outcome, sample_id=request.sample_id, attempt=request.attempt)
        return outcome


def _write_owned(box: Sandbox, name: str, data: bytes, mode: int = 0o600) -> None:
    """A file in the sandbox's work directory, owned by the run's uid (a fresh one: no link followed)."""
    assert box.work is not None
    fd = os.open(box.work / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if box.caps.per_run_uid:
        os.chown(box.work / name, box.uid, box.uid)


def _read_owned(path: Path, cap: int) -> bytes | None:
    """A regular file the run wrote, never through a link, at most `cap` bytes; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
            return None
        return f.read(cap + 1)[:cap]


def _stopped(result: SandboxResult, limits: SandboxLimits, what: str) -> str:
    """Why the sandbox stopped a compile or a run: the limit it passed, in words."""
    if result.outcome is Run.TIMEOUT:
        return f"{what} ran past its time limit ({limits.timeout_s:g} s)"
    if result.outcome is Run.MEMORY:
        return f"{what} ran out of memory (limit {limits.memory_mb} MB)"
    if result.outcome is Run.KILLED:
        return f"{what} was killed by signal {result.signal} (CPU limit {limits.cpu_s} s, or a crash)"
    return f"{what} failed: exit {result.exit_code}: {result.stderr[-1500:]}"


def _refused(result: SandboxResult) -> ExecutionFault:
    detail = (result.error or result.stderr or "the sandbox could not run it")[:300]
    return ExecutionFault("", FaultKind.RESOURCES, f"cuda: sandbox: {detail}")


def _spec(request: VerifyRequest) -> tuple[str, float] | ExecutionFault:
    try:
        spec = json.loads(request.reference)
        timeout_s = float(spec.get("timeout_s", RUN.timeout_s))
        if not 0 < timeout_s <= MAX_RUN_S:
            raise ValueError(f"timeout_s {timeout_s} is not in (0, {MAX_RUN_S:g}]")
        return str(spec["expected_stdout"]), timeout_s
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        detail = f"cuda: reference is not {{'expected_stdout': ...}} JSON: {err}"
        return ExecutionFault(request.sample_id, FaultKind.CRASH, detail, request.attempt)
