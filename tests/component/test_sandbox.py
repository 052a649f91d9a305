"""The sandbox against hostile programs: each outcome recorded, the parent healthy, nothing left behind.

Real subprocesses in real PID, network and mount namespaces (this machine allows them as root); where
they are not available the isolation tests are skipped with the reason and the fallback is tested.
"""

from __future__ import annotations

import os

import pytest

from verifiers.sandbox import Isolation, Outcome, SandboxLimits, namespaces_available, run_sandboxed

needs_ns = pytest.mark.skipif(
    not namespaces_available(), reason="PID/net/mount namespaces need root and unshare"
)

HOSTILE = {
    "fork bomb": ("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", Outcome.TIMEOUT),
    "memory bomb": ("x = bytearray(4 << 30)", Outcome.MEMORY),
    "infinite loop": ("while True: pass", Outcome.TIMEOUT),
    "double fork + setsid daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)\n    os._exit(0)\ntime.sleep(600)",
        Outcome.TIMEOUT,
    ),
    "write outside the temporary directory": ("open('/etc/rlsched-evil', 'w').write('x')", Outcome.EXIT),
    "connect to a local port": (
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)",
        Outcome.EXIT,
    ),
    "read the parent's environment": (
        "import os\nprint(open(f'/proc/{os.getppid() or 1}/environ').read())",
        Outcome.EXIT,
    ),
    "signal the parent": (
        "import os, signal\nos.kill(os.getppid() or 1, signal.SIGKILL)\nimport time; time.sleep(600)",
        Outcome.TIMEOUT,
    ),
    "flood stdout": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", Outcome.TIMEOUT),
}
LIMITS = SandboxLimits(timeout_s=1.5, memory_mb=256, processes=32, output_bytes=4096)


@needs_ns
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program(name: str) -> None:
    program, expected = HOSTILE[name]
    me = os.getpid()
    result = run_sandboxed(program, LIMITS)
    assert result.isolation is Isolation.NAMESPACES
    assert result.outcome is expected, (result.outcome, result.stderr[-300:])
    assert result.leftover_pids == [], "a process of the run survived the release of its slot"
    assert os.getpid() == me and os.path.exists("/proc/self")  # the parent is alive and well
    assert len(result.stdout.encode()) <= LIMITS.output_bytes
    if expected is Outcome.TIMEOUT:
        assert result.exit_code is None and result.kill_latency_s is not None
    assert not os.path.exists("/etc/rlsched-evil")


@needs_ns
def test_well_behaved_program_sees_a_minimal_world() -> None:
    program = (
        "import os, sys\nprint(os.getuid(), os.getcwd(), sorted(os.environ))\n"
        "open('out.txt', 'w').write('kept')\nprint(open('out.txt').read())\nsys.exit(3)"
    )
    result = run_sandboxed(program, LIMITS)
    assert result.outcome is Outcome.EXIT and result.exit_code == 3 and result.signal is None
    assert result.stdout.startswith("65534 /tmp/run ['HOME', 'LANG', 'PATH']")
    assert "kept" in result.stdout
    assert result.max_rss_mb > 1 and result.cpu_s >= 0


@needs_ns
def test_cpu_limit_kills_with_a_signal() -> None:
    result = run_sandboxed("while True: pass", SandboxLimits(timeout_s=10, cpu_s=1))
    assert result.outcome is Outcome.KILLED and result.exit_code is None and result.signal is not None
    assert 0.8 < result.wall_s < 5


def test_output_is_capped_not_blocking() -> None:
    result = run_sandboxed("print('y' * 1_000_000)", LIMITS)
    assert result.outcome is Outcome.OK and result.stdout_truncated
    assert len(result.stdout) == LIMITS.output_bytes


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        SandboxLimits(timeout_s=0)
