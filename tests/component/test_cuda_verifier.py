"""The CUDA verifier: a real nvcc compile where the toolkit exists; without a GPU the GPU stage is a
typed fault naming what is missing, never a zero; a program that does not compile is a wrong answer.
Both stages run in the sandbox (issue 41, finding 1): a program cannot read the expected output from
its parent's memory, include a file of the host, or make the compiler eat the machine's memory. The
GPU stage's device check is faked where a test needs the run stage on this CPU machine: a CUDA program
still runs there, its CUDA calls failing."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers import cuda
from verifiers.cuda import CudaVerifier, cuda_device_present, find_toolkit, gpu_device_nodes, source_of
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest
from verifiers.sandbox import capabilities

REPO = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# with CI=true a missing toolkit fails these tests (test_ci_has_the_cuda_toolkit) instead of skipping
needs_nvcc = pytest.mark.skipif(
    find_toolkit() is None and not CI, reason="nvcc (the CUDA toolkit) is not installed"
)
MISSING = capabilities().missing()
isolated = pytest.mark.skipif(bool(MISSING), reason=f"this machine lacks: {'; '.join(MISSING)}")
SECRET = f"rlsched-secret-{secrets.token_hex(8)}"
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


def test_ci_has_the_cuda_toolkit() -> None:
    """CI runs the cuda tests, never skips them: a machine without nvcc fails here, saying why."""
    if not CI:
        pytest.skip("only CI requires the toolkit")
    assert find_toolkit() is not None, "CI=true but no CUDA toolkit (nvcc and nvvm/) was found: install one"


def _toolkit_at(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("")
    (root / "nvvm").mkdir()
    return root.resolve()


def test_an_installed_toolkit_comes_first_and_pypis_is_found_where_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make setup` installs PyPI's cuda-toolkit where the machine has no nvcc (scripts/setup_venv.sh):
    its layout, `nvidia/cu13` on sys.path, is the last place looked at, after CUDA_HOME, PATH and
    /usr/local/cuda* (the newest version first)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cuda.shutil, "which", lambda name: None)
    monkeypatch.setattr(cuda, "INSTALLED", tmp_path / "usr-local")
    monkeypatch.setattr(cuda.sys, "path", ["", str(tmp_path / "site-packages")])
    assert find_toolkit() is None
    pypi = _toolkit_at(tmp_path / "site-packages" / "nvidia" / "cu13")
    assert find_toolkit() == pypi
    _toolkit_at(tmp_path / "usr-local" / "cuda-12.9")
    newest = _toolkit_at(tmp_path / "usr-local" / "cuda-12.10")
    assert find_toolkit() == newest


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stage's device check passes on this machine (the program runs; its CUDA calls fail)."""
    monkeypatch.setattr(cuda, "cuda_device_present", lambda: True)


FORGERY = r"""```cuda
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <fcntl.h>
#include <unistd.h>
// look for the expected output in the memory of the parent (the verifier, when it was run directly)
int main() {
  const char *needle = "rlsched-secret-";
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)getppid());
  FILE *maps = fopen(path, "r");
  if (!maps) { printf("no maps\n"); return 0; }
  snprintf(path, sizeof path, "/proc/%d/mem", (int)getppid());
  int mem = open(path, O_RDONLY);
  if (mem < 0) { printf("no mem\n"); return 0; }
  char line[512];
  while (fgets(line, sizeof line, maps)) {
    unsigned long lo, hi; char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (perms[0] != 'r' || hi - lo > (1ul << 28)) continue;
    std::string buf(hi - lo, '\0');
    ssize_t got = pread(mem, &buf[0], buf.size(), (off_t)lo);
    if (got <= 0) continue;
    for (size_t at = buf.find(needle); at != std::string::npos; at = buf.find(needle, at + 1)) {
      if (at + 31 > (size_t)got) break;
      std::string hit = buf.substr(at, 31);
      bool clean = true;
      for (char c : hit.substr(15)) clean = clean && isxdigit((unsigned char)c);
      if (clean) { printf("%s\n", hit.c_str()); return 0; }
    }
  }
  printf("not found\n");
  return 0;
}
```"""


@needs_nvcc
@isolated
def test_a_program_cannot_read_the_expected_output_from_its_parent(fake_gpu: None) -> None:
    """Finding 1: unsandboxed, this binary scanned the verifier's memory and printed the answer."""
    outcome = CudaVerifier().verify(VerifyRequest("forge", FORGERY, json.dumps({"expected_stdout": SECRET})))
    assert isinstance(outcome, Verdict) and not outcome.correct and outcome.reward == 0.0, outcome
    assert SECRET not in outcome.detail


@pytest.fixture()
def planted() -> Iterator[Path]:
    """A file in the checkout, which a program names by its absolute path."""
    path = REPO / f".rlsched-cuda-{secrets.token_hex(4)}-planted.h"
    path.write_text(f"{SECRET} is the expected output\n")
    yield path
    path.unlink(missing_ok=True)


@needs_nvcc
@isolated
def test_a_program_cannot_include_a_file_of_the_host(planted: Path) -> None:
    """Finding 1: `#include` of a checkout file by its path put the file's text into the verdict."""
    program = f'#include "{planted}"\nint main() {{ return 0; }}\n'
    outcome = CudaVerifier().verify(VerifyRequest("include", program, json.dumps({"expected_stdout": "x"})))
    assert isinstance(outcome, Verdict) and not outcome.correct, outcome
    assert "does not compile" in outcome.detail and SECRET not in outcome.detail
    assert planted.name in outcome.detail  # the compiler looked for it, and it was not there


@needs_nvcc
@isolated
def test_including_dev_zero_is_stopped_by_the_compile_limits() -> None:
    """Finding 1: `#include "/dev/zero"` made the preprocessor allocate without bound."""
    verifier = CudaVerifier(compile_timeout_s=20)
    start = time.monotonic()
    outcome = verifier.verify(
        VerifyRequest("zero", '#include "/dev/zero"\n', json.dumps({"expected_stdout": "x"}))
    )
    assert isinstance(outcome, Verdict) and not outcome.correct, outcome
    assert "does not compile" in outcome.detail
    assert "out of memory" in outcome.detail or "time limit" in outcome.detail or "killed" in outcome.detail
    assert time.monotonic() - start < 20 + 10


@needs_nvcc
@isolated
def test_the_run_stage_runs_in_the_sandbox_and_a_hang_is_a_wrong_answer(fake_gpu: None) -> None:
    """A program that never ends is stopped at the reference's time limit and scored 0 (a judge's time
    limit exceeded), not a fault to retry."""
    program = '```cuda\n#include <cstdio>\n#include <unistd.h>\nint main() { printf("%d\\n", getuid()); '
    program += "fflush(stdout); for (;;) pause(); }\n```"
    start = time.monotonic()
    outcome = CudaVerifier().verify(
        VerifyRequest("hang", program, json.dumps({"expected_stdout": "0", "timeout_s": 2}))
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 0.0, outcome
    assert "time limit (2 s)" in outcome.detail
    assert time.monotonic() - start < 2 + 10


def test_a_reference_time_limit_must_be_a_positive_number() -> None:
    for limit in ("nan", "-1", "1e9"):
        bad = CudaVerifier().verify(
            VerifyRequest(
                "t",
                "int main(){}",
                f'{{"expected_stdout": "", "timeout_s": {limit if limit != "nan" else "NaN"}}}',
            )
        )
        assert isinstance(bad, ExecutionFault) and bad.kind is FaultKind.CRASH and "timeout_s" in bad.detail


def test_the_run_stage_gets_only_its_gpus_nodes(tmp_path: Path) -> None:
    nodes = gpu_device_nodes("")
    assert all(n.startswith("nvidia") for n in nodes)
    assert gpu_device_nodes("7,8") == tuple(
        n for n in nodes if not n[6:].isdigit() or n in ("nvidia7", "nvidia8")
    )
