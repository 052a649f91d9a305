"""Run untrusted model output in a sandbox whose timeout really stops the work.

A program runs in new PID, network and mount namespaces (`unshare`, where the machine allows it; as
root it does), as an unprivileged user, in a private temporary directory (a fresh tmpfs: the only
place it can write), with a minimal environment, resource limits (CPU seconds, address space, file
size, open files, processes) and capped stdout and stderr. Stopping it kills the namespace's first
process, and the kernel then kills every process in the namespace, including ones that double-forked
into a new session; the slot is released only once the launcher's exit has been observed. Where
namespaces are not available the program runs in a new session and process group instead, with a
warning: isolation is weaker there (a daemon that leaves the group survives the kill).

`run_sandboxed` returns a `SandboxResult`: the outcome (`ok`, `exit` (non-zero), `timeout`,
`memory`, `killed`, `error`), the program's own exit code (None when it was killed), resource use,
output, and how long the kill took to be observed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

UNSHARE = shutil.which("unshare")
SANDBOX_USER = "nobody"
# the base interpreter, not the virtual environment's (which the sandbox user may not reach): the
# program gets the standard library only
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


class Outcome(StrEnum):
    OK = "ok"  # exited 0
    EXIT = "exit"  # exited with a non-zero status of its own
    TIMEOUT = "timeout"  # ran past the wall-clock limit and was killed
    MEMORY = "memory"  # hit the address-space limit
    KILLED = "killed"  # died of a signal (e.g. the CPU-time limit)
    ERROR = "error"  # the sandbox itself could not run it


class Isolation(StrEnum):
    NAMESPACES = "namespaces"
    SESSION = "session"


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10
    memory_mb: int = 512  # address space
    file_mb: int = 16  # largest file it may write
    open_files: int = 64
    processes: int = 32  # per sandbox user
    output_bytes: int = 64 * 1024  # kept of stdout and of stderr each

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or min(self.cpu_s, self.memory_mb, self.open_files, self.processes) < 1:
            raise ValueError("sandbox limits must be positive")


@dataclass
class SandboxResult:
    outcome: Outcome
    exit_code: int | None  # the program's own exit status; None when it was killed
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    kill_latency_s: float | None  # from the kill to the exit observed (None: it was not killed)
    isolation: Isolation
    leftover_pids: list[int] = field(default_factory=list)  # processes of the run still alive after

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def namespaces_available() -> bool:
    """True where `unshare` can make PID, network and mount namespaces here (checked once)."""
    global _NS_OK
    if _NS_OK is None:
        _NS_OK = bool(UNSHARE) and os.geteuid() == 0 and _try_unshare()
    return _NS_OK


_NS_OK: bool | None = None


def _try_unshare() -> bool:
    try:
        cmd = [str(UNSHARE), "--pid", "--net", "--mount", "--fork", "--mount-proc", "true"]
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# The launcher runs as root inside the new namespaces, prepares the private directory, sets limits,
# drops to the sandbox user and becomes the program. It is a string so that nothing of the parent's
# modules is imported on the way.
_LAUNCHER = r"""
import ctypes, os, pwd, resource, sys
try:
    code = open(sys.argv[1], "rb").read()  # before /tmp is covered by the private tmpfs
    cpu_s, memory_mb, file_mb, open_files, processes, private = (int(x) for x in sys.argv[2].split(","))
    user = pwd.getpwnam(sys.argv[3])
    python = sys.argv[6]
    if private:
        libc = ctypes.CDLL(None, use_errno=True)
        def mount(source, target, kind, flags, options):
            if libc.mount(source.encode(), target.encode(), kind, flags, options) != 0:
                raise OSError(ctypes.get_errno(), f"cannot mount {source} on {target}")
        for where in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(where):
                mount("tmpfs", where, b"tmpfs", 0, b"size=64m,mode=1777")
        # the interpreter may live where the sandbox user cannot reach (/root): show it read-only
        os.mkdir("/tmp/python", 0o755)
        bind, remount, readonly, recursive = 4096, 32, 1, 16384
        mount(sys.argv[5], "/tmp/python", None, bind | recursive, None)
        mount("none", "/tmp/python", None, bind | remount | readonly, None)
        python = "/tmp/python/" + sys.argv[7]
    work = "/tmp/run" if private else sys.argv[4]
    os.makedirs(work, 0o700, exist_ok=True)
    with open(work + "/main.py", "wb") as f:
        f.write(code)
    os.chown(work, user.pw_uid, user.pw_gid)
    os.chown(work + "/main.py", user.pw_uid, user.pw_gid)
    os.chdir(work)
    mb = 1 << 20
    for what, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mb * mb),
                        (resource.RLIMIT_FSIZE, file_mb * mb), (resource.RLIMIT_NOFILE, open_files),
                        (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8"}
    program = os.fork()
    if program == 0:
        os.execve(python, [python, "-I", "-B", "main.py"], env)
except Exception as err:
    print(f"sandbox: {err}", file=sys.stderr)  # the sandbox failed, not the program: outcome error
    sys.exit(125)
# the namespace's init (as the sandbox user, under the same limits): wait for the program, report its
# own status and resource use on the report pipe, and exit; the kernel then kills whatever it left behind
_, status, usage = os.wait4(program, 0)
report = os.fdopen(int(sys.argv[8]), "w")
report.write(f"{status} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}\n")
report.close()
"""


def _reader(stream: Any, cap: int, out: list[bytes], truncated: list[bool]) -> None:
    """Keep the first `cap` bytes, drain (and drop) the rest so a flood cannot block the program."""
    kept = 0
    while chunk := stream.read(65536):
        if kept < cap:
            out.append(chunk[: cap - kept])
        kept += len(chunk)
    truncated.append(kept > cap)


def _namespace_of(pid: int) -> str | None:
    """The PID namespace of the launcher's first child (the namespace's init), if it exists yet."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return os.readlink(f"/proc/{children[0]}/ns/pid") if children else None
    except OSError:
        return None


def processes_in(namespace: str) -> list[int]:
    """PIDs (as seen here) of every live process in a PID namespace: a scan of /proc. Zombies (dead,
    waiting for their new parent, the host's init, to reap them) hold nothing and are not counted."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace and not _zombie(entry):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _zombie(proc_dir: Path) -> bool:
    stat = (proc_dir / "stat").read_text()
    return stat[stat.rindex(")") + 2] in "ZX"


def _command(source: Path, limits: SandboxLimits, isolation: Isolation, report_fd: int) -> list[str]:
    private = int(isolation is Isolation.NAMESPACES)
    numbers = [limits.cpu_s, limits.memory_mb, limits.file_mb, limits.open_files, limits.processes, private]
    work = str(source.parent / "run")
    limits_arg = ",".join(map(str, numbers))
    prefix, inside = sys.base_prefix, os.path.relpath(PYTHON, sys.base_prefix)
    launcher = [
        PYTHON,
        "-I",
        "-c",
        _LAUNCHER,
        str(source),
        limits_arg,
        SANDBOX_USER,
        work,
        prefix,
        PYTHON,
        inside,
        str(report_fd),
    ]
    if isolation is Isolation.SESSION:
        return launcher
    ns = ["--pid", "--net", "--mount", "--fork", "--kill-child", "--mount-proc"]
    return [str(UNSHARE), *ns, "--", *launcher]


def run_sandboxed(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run a Python program's source text in the sandbox and report what happened."""
    limits = limits or SandboxLimits()
    isolation = Isolation.NAMESPACES if namespaces_available() else Isolation.SESSION
    if isolation is Isolation.SESSION:
        warnings.warn(
            "sandbox: PID/network/mount namespaces are not available here (needs root and unshare); "
            "running in a new session instead, where a daemonised child can outlive the kill",
            stacklevel=2,
        )
    with tempfile.TemporaryDirectory(prefix="rlsched-sandbox-") as host_dir:
        source = Path(host_dir) / "main.py"
        source.write_text(program)
        os.chmod(host_dir, 0o755)
        os.chmod(source, 0o644)
        return _run(source, limits, isolation, host_dir)


def _run(source: Path, limits: SandboxLimits, isolation: Isolation, cwd: str) -> SandboxResult:
    start = time.monotonic()
    report_r, report_w = os.pipe()
    proc = subprocess.Popen(
        _command(source, limits, isolation, report_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        pass_fds=(report_w,),
    )
    os.close(report_w)
    outputs: dict[str, tuple[list[bytes], list[bool]]] = {"stdout": ([], []), "stderr": ([], [])}
    readers = [
        threading.Thread(target=_reader, args=(getattr(proc, name), limits.output_bytes, *outputs[name]))
        for name in outputs
    ]
    for r in readers:
        r.start()
    namespace = None
    killed_at = 0.0
    deadline = start + limits.timeout_s
    while not os.wait4(proc.pid, os.WNOHANG)[0]:  # until the launcher's exit is observed
        if namespace is None and isolation is Isolation.NAMESPACES:
            namespace = _namespace_of(proc.pid)
        if not killed_at and time.monotonic() >= deadline:
            killed_at = time.monotonic()
            _kill(proc)
        time.sleep(0.0005 if killed_at else 0.002)
    proc.returncode = 0  # reaped above
    leftovers = _drain(namespace)  # the slot is free only once nothing of the run is left
    kill_latency = time.monotonic() - killed_at if killed_at else None
    wall = time.monotonic() - start
    with os.fdopen(report_r) as report:
        line = report.read().split()
    for r in readers:
        r.join(timeout=5)
    stdout, stderr = (b"".join(outputs[n][0]).decode(errors="replace") for n in ("stdout", "stderr"))
    status = int(line[0]) if line else None
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    return SandboxResult(
        outcome=_outcome(code, bool(killed_at), stderr),
        exit_code=code if code is not None and code >= 0 else None,
        signal=-code if code is not None and code < 0 else (9 if killed_at else None),
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=bool(outputs["stdout"][1] and outputs["stdout"][1][0]),
        stderr_truncated=bool(outputs["stderr"][1] and outputs["stderr"][1][0]),
        wall_s=wall,
        cpu_s=float(line[1]) if line else 0.0,
        max_rss_mb=int(line[2]) / 1024 if line else 0.0,
        kill_latency_s=kill_latency,
        isolation=isolation,
        leftover_pids=leftovers,
    )


def _drain(namespace: str | None, wait_s: float = 5.0) -> list[int]:
    """Wait (up to `wait_s`) until no process of the namespace is left; return any that still are."""
    if namespace is None:
        return []
    until = time.monotonic() + wait_s
    while (left := processes_in(namespace)) and time.monotonic() < until:
        time.sleep(0.0005)
    return left


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's whole process group; with namespaces, `--kill-child` takes the
    namespace's init with it and the kernel then kills everything left in the namespace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _outcome(returncode: int | None, timed_out: bool, stderr: str) -> Outcome:
    if timed_out:
        return Outcome.TIMEOUT
    if returncode is None:
        return Outcome.ERROR if stderr.startswith("sandbox:") else Outcome.KILLED
    if returncode == 0:
        return Outcome.OK
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return Outcome.MEMORY
    if returncode < 0 or returncode > 128:  # a signal (some launchers report it as 128 + signal)
        return Outcome.KILLED
    return Outcome.EXIT
