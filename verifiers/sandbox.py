"""Run untrusted code in a minimal root that holds only its runtime, under kernel-accounted limits.

A program sees a root built for it alone (`verifiers/_sandbox_init.py` builds it): the interpreter
and its standard library read-only at `/python`, the system's `/usr` and `/lib*` read-only, a small
`/etc`, a `/dev` of null, zero, full, random and urandom, private `/tmp`, `/dev/shm` and `/work`, a
`/proc` of its own PID namespace, and any extra read-only paths a verifier opts in to. Nothing else
of the host is there: not the checkout, `/root`, `/home`, `/run`, `/var`, `/opt`, `/mnt` or `/work`
of the host. It runs in new mount, PID, network, IPC and UTS namespaces, as a uid of its own (so
`RLIMIT_NPROC` is per run), with `no_new_privs`. Memory and process counts are limits of a cgroup of
the run (`verifiers/cgroups.py`: v2 where its controllers are enabled, v1 otherwise), so forking and
allocating in every child does not pass the memory limit; CPU time, file size, open files and the
address space of each process stay rlimits. Stopping a run kills the launcher's process group and the
namespace's init with it; the kernel then kills everything left in the namespace, and a slot is
released only once no process of the run is left.

Isolation policy (`SandboxPolicy.isolation`): `strict`, the default where the machine allows it,
refuses to run (outcome `error`, naming what is missing) when a namespace, the cgroups or per-run uids
are unavailable; `best_effort` runs anyway and names what is missing in every result.

`run_sandboxed` runs one program; `Sandbox` is the same root with a work directory that persists
between `exec` calls of one episode (`create`, `exec`, `destroy`), for multi-turn environments; and
`Sandbox.start` returns a `Running` with a request/response channel on fds 3 and 4, which the code
verifier uses to call a solution's functions from outside its interpreter.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from verifiers.cgroups import Controller, RunGroups, find_controllers

LAUNCHER = Path(__file__).with_name("_sandbox_init.py")
# the base interpreter, not the virtual environment's: the program gets the standard library only
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
PREFIX = os.path.realpath(sys.base_prefix)
INSIDE_PYTHON = "/python/" + os.path.relpath(PYTHON, PREFIX)
UID_BASE, UID_COUNT = 200_000, 4096  # each concurrent run (or environment) holds one, by a file lock
RESERVED = ("/", "/usr", "/python", "/proc", "/dev", "/tmp", "/work", "/etc", "/.program")
CHANNEL_FDS = (3, 4)  # inside: requests in, responses out


class Outcome(StrEnum):
    OK = "ok"  # exited 0
    EXIT = "exit"  # exited with a non-zero status of its own
    TIMEOUT = "timeout"  # ran past the wall-clock limit and was killed
    MEMORY = "memory"  # hit the memory limit: the cgroup's OOM kill, or a MemoryError
    KILLED = "killed"  # died of a signal (e.g. the CPU-time limit)
    ERROR = "error"  # the sandbox itself could not run it (or refused to: see `missing`)


class Isolation(StrEnum):
    STRICT = "strict"  # refuse to run when any isolation is missing
    BEST_EFFORT = "best_effort"  # run anyway; every result names what is missing


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10
    memory_mb: int = 512  # the run's cgroup, and the address space of each process
    file_mb: int = 16  # largest file it may write
    open_files: int = 64
    processes: int = 32  # processes and threads of the run at once
    output_bytes: int = 64 * 1024  # kept of stdout and of stderr each
    work_mb: int = 64  # the writable /work
    tmp_mb: int = 64  # /tmp (and /dev/shm: a quarter of it)

    def __post_init__(self) -> None:
        numbers = (self.cpu_s, self.memory_mb, self.open_files, self.processes, self.work_mb, self.tmp_mb)
        if self.timeout_s <= 0 or min(numbers) < 1:
            raise ValueError("sandbox limits must be positive")


@dataclass(frozen=True)
class SandboxPolicy:
    isolation: Isolation | None = None  # None: strict where the machine allows it, else best effort
    read_only: tuple[tuple[str, str], ...] = ()  # extra (host path, path inside) bound read-only

    @classmethod
    def from_specs(cls, isolation: Isolation | None, specs: Sequence[str]) -> SandboxPolicy:
        """From `HOST[:INSIDE]` specs (the config's `read_only`, the CLI's `--read-only`): a path
        alone is bound at the same path inside."""
        pairs = tuple((host, inside or host) for host, _, inside in (spec.partition(":") for spec in specs))
        return cls(isolation, pairs)

    def check(self) -> str | None:
        """Why this policy cannot be applied (a message naming the fix), or None."""
        for host, inside in self.read_only:
            if not os.path.exists(host):
                return f"read-only path {host} does not exist: create it, or stop asking for it"
            if (
                not inside.startswith("/")
                or ".." in inside.split("/")
                or os.path.normpath(inside) in RESERVED
            ):
                return (
                    f"read-only path {host} cannot be mounted at {inside!r}: give an absolute path "
                    f"other than {', '.join(RESERVED)}"
                )
        return None


@dataclass(frozen=True)
class Capabilities:
    """What isolation this machine gives, found once by trying it (`capabilities()`)."""

    namespaces: str | None  # None: available; otherwise why not
    per_run_uid: bool  # root, so each run gets a uid of its own
    controllers: dict[str, Controller] = field(default_factory=dict)

    def missing(self) -> list[str]:
        found = []
        if self.namespaces is not None:
            found.append(f"namespaces ({self.namespaces})")
        if not self.per_run_uid:
            found.append("per-run uid (needs root)")
        for name in ("memory", "pids"):
            if name not in self.controllers:
                found.append(f"cgroup {name} controller")
        return found


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
    max_rss_mb: float  # of the largest process
    peak_memory_mb: float | None  # of the whole run, as its cgroup measured it (None: no cgroup)
    kill_latency_s: float | None  # from the kill to the exit observed (None: it was not killed)
    isolation: Isolation
    missing: list[str] = field(default_factory=list)  # isolation this run did not have
    error: str | None = None  # why the sandbox could not run it (outcome error)
    leftover_pids: list[int] = field(default_factory=list)  # processes of the run still alive after

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@cache
def capabilities() -> Capabilities:
    """Try the real thing once: a namespaced run of /bin/true in a minimal root, and the cgroups."""
    root = os.geteuid() == 0
    controllers = find_controllers() if root else {}
    probe = Capabilities(None, root, controllers)
    if not root:
        return replace(probe, namespaces="needs root")
    result = _start(
        probe,
        SandboxPolicy(Isolation.BEST_EFFORT),
        SandboxLimits(timeout_s=10),
        None,
        ["/usr/bin/true"],
        None,
        namespaces=True,
    ).wait()
    if result.outcome is not Outcome.OK:
        return replace(probe, namespaces=(result.error or result.stderr or str(result.outcome)).strip()[:200])
    return probe


def run_sandboxed(
    program: str, limits: SandboxLimits | None = None, policy: SandboxPolicy | None = None
) -> SandboxResult:
    """Run a Python program's source text in a fresh sandbox and report what happened."""
    with Sandbox.create(policy, persistent=False) as box:
        return box.exec(program, limits=limits)


class Sandbox:
    """One environment: a uid and a work directory of its own, kept across `exec` calls until
    `destroy`. With `persistent=False` every call gets a fresh `/work` (the one-shot case)."""

    def __init__(self, policy: SandboxPolicy, persistent: bool, caps: Capabilities) -> None:
        self.policy, self.persistent, self.caps = policy, persistent, caps
        self.uid, self._uid_lock = _claim_uid()
        self.host_dir = Path(tempfile.mkdtemp(prefix="rlsched-sandbox-"))
        os.chmod(self.host_dir, 0o711)
        self.work: Path | None = None
        self.work_mounted = False
        self.executions = 0
        self.cpu_s = 0.0
        self.peak_memory_mb: float | None = None
        self._running: list[Running] = []

    @classmethod
    def create(
        cls,
        policy: SandboxPolicy | None = None,
        persistent: bool = True,
        work_mb: int = 64,
        caps: Capabilities | None = None,
    ) -> Sandbox:
        box = cls(policy or SandboxPolicy(), persistent, caps or capabilities())
        if persistent or box.caps.namespaces is not None:
            box._make_work(work_mb)
        return box

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.destroy()

    def _make_work(self, work_mb: int) -> None:
        self.work = self.host_dir / "work"
        self.work.mkdir(mode=0o700)
        if self.caps.per_run_uid:
            cmd = [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={work_mb}m,mode=700,nosuid,nodev",
                "tmpfs",
                str(self.work),
            ]
            self.work_mounted = subprocess.run(cmd, capture_output=True).returncode == 0
            os.chown(self.work, self.uid, self.uid)

    @property
    def isolation(self) -> Isolation:
        if self.policy.isolation is not None:
            return self.policy.isolation
        return Isolation.BEST_EFFORT if self.caps.missing() else Isolation.STRICT

    def exec(
        self, program: str | None = None, argv: list[str] | None = None, limits: SandboxLimits | None = None
    ) -> SandboxResult:
        """Run Python source (`program`) or a command (`argv`, resolved inside the root) to its end."""
        return self.start(program, argv, limits).wait()

    def start(
        self,
        program: str | None = None,
        argv: list[str] | None = None,
        limits: SandboxLimits | None = None,
        channel: bool = False,
    ) -> Running:
        if (program is None) == (argv is None):
            raise ValueError("give a program's source or an argv, not both")
        limits = limits or SandboxLimits()
        refusal = self._refusal()
        if refusal is not None:
            return Running.refused(refusal, self.isolation, self.caps.missing())
        self.executions += 1
        self._running = [run for run in self._running if run.result is None]
        self._running.append(
            run := _start(
                self.caps,
                self.policy,
                limits,
                program,
                argv,
                self,
                channel=channel,
                namespaces=self.caps.namespaces is None,
                isolation=self.isolation,
            )
        )
        return run

    def _refusal(self) -> str | None:
        if (problem := self.policy.check()) is not None:
            return problem
        missing = self.caps.missing()
        if self.isolation is Isolation.STRICT and missing:
            return (
                f"strict isolation refused to run: missing {'; '.join(missing)}. Run as root on a "
                "machine with namespaces and cgroup memory/pids controllers, or set "
                "sandbox.isolation: best_effort to run with weaker isolation"
            )
        return None

    def record(self, result: SandboxResult) -> None:
        self.cpu_s += result.cpu_s
        if result.peak_memory_mb is not None:
            self.peak_memory_mb = max(self.peak_memory_mb or 0.0, result.peak_memory_mb)

    def destroy(self) -> dict[str, Any]:
        """End the environment: its work directory and everything in it go; returns its resource use.
        An execution still in flight (its caller failed before waiting for it) is killed first."""
        for run in self._running:
            if run.result is None:
                run.kill()
                with contextlib.suppress(Exception):
                    run.wait()
        self._running.clear()
        work_bytes = 0
        try:
            work_bytes = _used_bytes(self.work, self.work_mounted) if self.work is not None else 0
        finally:
            if self.work_mounted:
                subprocess.run(["umount", "-l", str(self.work)], capture_output=True)
                self.work_mounted = False
            shutil.rmtree(self.host_dir, ignore_errors=True)
            if self._uid_lock >= 0:
                os.close(self._uid_lock)
                self._uid_lock = -1
        return {
            "executions": self.executions,
            "cpu_s": self.cpu_s,
            "peak_memory_mb": self.peak_memory_mb,
            "work_bytes": work_bytes,
            "uid": self.uid,
        }


def _used_bytes(path: Path, mounted: bool) -> int:
    """Bytes in a work directory: its tmpfs's own count, or (a plain directory) a walk that no depth
    of nesting can overflow."""
    if mounted:
        stats = os.statvfs(path)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    total, pending = 0, [str(path)]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _claim_uid() -> tuple[int, int]:
    """A uid no other live run holds: an exclusive lock on its file, released with the environment."""
    locks = Path(tempfile.gettempdir()) / "rlsched-sandbox-uids"
    locks.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(UID_COUNT)
    for k in range(UID_COUNT):
        uid = UID_BASE + (start + k) % UID_COUNT
        fd = os.open(locks / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError(f"all {UID_COUNT} sandbox uids are in use")


def _start(
    caps: Capabilities,
    policy: SandboxPolicy,
    limits: SandboxLimits,
    program: str | None,
    argv: list[str] | None,
    box: Sandbox | None,
    channel: bool = False,
    namespaces: bool = True,
    isolation: Isolation = Isolation.STRICT,
) -> Running:
    """Launch one execution: its cgroups, its orders, the launcher process."""
    host_dir = box.host_dir if box is not None else Path(tempfile.mkdtemp(prefix="rlsched-sandbox-"))
    root = Path(tempfile.mkdtemp(dir=host_dir, prefix="root-"))
    scratch = root if box is not None else host_dir  # removed when the execution ends
    uid = box.uid if box is not None else UID_BASE - 1
    groups = RunGroups(caps.controllers, f"run-{uid}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        groups.create(limits.memory_mb, limits.processes)
    except OSError as err:
        groups.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        return Running.refused(f"cannot make the run's cgroups: {err}", isolation, caps.missing())
    work = box.work if box is not None and (box.persistent or not namespaces) else None
    if argv is None:
        script = "/.program/main.py" if namespaces else _program_file(host_dir, program or "")
        argv = [INSIDE_PYTHON if namespaces else PYTHON, "-I", "-B", script]
    requests, responses = (os.pipe(), os.pipe()) if channel else (None, None)
    inner = [requests[0], responses[1]] if requests and responses else []
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    orders = {
        "namespaces": namespaces,
        "root": str(root),
        "python_prefix": PREFIX,
        "site_packages": os.path.relpath(sysconfig.get_path("purelib", vars={"base": PREFIX}), PREFIX),
        "binds": [list(pair) for pair in policy.read_only],
        "work": str(work) if work is not None else None,
        "work_mb": limits.work_mb,
        "tmp_mb": limits.tmp_mb,
        "shm_mb": max(1, limits.tmp_mb // 4),
        "uid": uid if caps.per_run_uid else None,
        "limits": {name: getattr(limits, name) for name in _RLIMITS},
        "program": program if namespaces else None,
        "argv": argv,
        "cwd": "/work" if namespaces else str(work),
        "env": _environment(namespaces, work, channel),
        "channel": inner or None,
        "report_fd": report_w,
        "go_fd": go_r,
        "backstop_s": int(limits.timeout_s) + 30,
    }
    start = time.monotonic()
    try:
        proc, outputs = _spawn(orders, (report_w, go_r, *inner))
    except OSError as err:  # no process could be started (out of processes or memory)
        for fd in (report_r, go_w, *(requests or ()), *(responses or ())):
            if fd not in inner:
                os.close(fd)
        groups.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        return Running.refused(f"cannot start the launcher: {err}", isolation, caps.missing())
    run = Running(
        proc,
        start,
        limits,
        groups,
        report_r,
        requests,
        responses,
        isolation,
        caps.missing(),
        box,
        scratch,
        outputs,
    )
    run.place(go_w)
    return run


_RLIMITS = ("cpu_s", "memory_mb", "file_mb", "open_files", "processes")


def _program_file(host_dir: Path, program: str) -> str:
    """Without a private root: the program in a fresh directory the run cannot write to (so a link
    it planted in its work directory is never written through)."""
    holder = Path(tempfile.mkdtemp(dir=host_dir, prefix="program-"))
    holder.chmod(0o755)
    script = str(holder / "main.py")
    with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
        f.write(program)
    return script


def _environment(namespaces: bool, work: Path | None, channel: bool) -> dict[str, str]:
    env = {
        "PATH": "/python/bin:/usr/bin:/bin" if namespaces else "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/work" if namespaces else str(work),
        "TMPDIR": "/tmp",
    }
    if namespaces:
        env["LD_LIBRARY_PATH"] = "/python/lib"  # the interpreter's own libpython, not the system's
    if channel:
        env["RLSCHED_CHANNEL"] = ",".join(map(str, CHANNEL_FDS))
    return env


def _spawn(
    orders: dict[str, Any], passed: tuple[int, ...]
) -> tuple[subprocess.Popen[bytes], tuple[int, int]]:
    """Start the launcher with its orders in a memfd; the passed fds are closed here either way.
    Returns the process and the read ends of its stdout and stderr."""
    orders_fd = os.memfd_create("orders")
    os.write(orders_fd, marshal.dumps(orders))
    launcher_fd = os.open(LAUNCHER, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    handed = (launcher_fd, orders_fd, *passed)
    try:
        proc = subprocess.Popen(
            # relative to its own directory, so that no host path shows in the run's /proc
            ["./" + os.path.basename(PYTHON), "-I", "-S", f"/dev/fd/{launcher_fd}", str(orders_fd)],
            executable=PYTHON,
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            cwd=os.path.dirname(PYTHON),
            env={"PATH": "/usr/bin:/bin"},
            pass_fds=handed,
        )
    except OSError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        for fd in (*handed, out_w, err_w):
            os.close(fd)
    return proc, (out_r, err_r)


class Running:
    """One execution in flight: its deadline, output, report and (optionally) its channel. There is
    no thread: whichever call waits (`receive`, `wait`) drains stdout and stderr meanwhile, so a
    flood cannot block the program, and kills the run at its deadline."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes] | None,
        start: float,
        limits: SandboxLimits,
        groups: RunGroups | None,
        report_r: int,
        requests: tuple[int, int] | None,
        responses: tuple[int, int] | None,
        isolation: Isolation,
        missing: list[str],
        box: Sandbox | None,
        scratch: Path | None,
        outputs: tuple[int, int] = (-1, -1),
    ) -> None:
        self.proc, self.start, self.limits, self.groups = proc, start, limits, groups
        self.deadline = start + limits.timeout_s
        self.isolation, self.missing, self.box, self.scratch = isolation, missing, box, scratch
        self.killed_at = 0.0
        self.result: SandboxResult | None = None
        self.setup_error: str | None = None
        self._send = requests[1] if requests else -1
        if self._send >= 0:
            os.set_blocking(self._send, False)
        self._receive = responses[0] if responses else -1
        self._buffer = b""
        self._captures = {fd: _Capture(limits.output_bytes) for fd in outputs if fd >= 0}
        self._streams = dict(self._captures)  # those still open
        self._out, self._err = outputs
        self._report_r = report_r
        self._pidfd = os.pidfd_open(proc.pid) if proc is not None else -1
        self._exited = False

    @classmethod
    def refused(cls, reason: str, isolation: Isolation, missing: list[str]) -> Running:
        run = cls(
            None, time.monotonic(), SandboxLimits(), None, -1, None, None, isolation, missing, None, None
        )
        run.result = SandboxResult(
            outcome=Outcome.ERROR,
            exit_code=None,
            signal=None,
            stdout="",
            stderr=f"sandbox: {reason}",
            stdout_truncated=False,
            stderr_truncated=False,
            wall_s=0.0,
            cpu_s=0.0,
            max_rss_mb=0.0,
            peak_memory_mb=None,
            kill_latency_s=None,
            isolation=isolation,
            missing=missing,
            error=reason,
        )
        return run

    def place(self, go_w: int) -> None:
        """Move the launcher into the run's cgroups (while its interpreter starts), then let it go."""
        try:
            assert self.proc is not None
            if self.groups is not None:
                self.groups.join(self.proc.pid)
            os.write(go_w, b"1")
        except OSError as err:
            self.setup_error = f"cannot place the run in its cgroups: {err}"
            self._kill()
        finally:
            os.close(go_w)

    # -- waiting: output drained, deadline kept --------------------------------------------------------

    def _pump(self, until: float, response: bool = False) -> bool:
        """Wait until `until` for the program's exit (or, with `response`, a response byte), reading
        stdout and stderr meanwhile. True when what was waited for happened."""
        while True:
            watch = [*self._streams.keys()]
            if not self._exited:
                watch.append(self._pidfd)
            if response and self._receive >= 0:
                watch.append(self._receive)
            left = until - time.monotonic()
            if left <= 0 or not watch:
                return False
            ready = _ready(watch, left)
            for fd in ready:
                if fd in self._streams and not self._streams[fd].read(fd):
                    del self._streams[fd]
                    os.close(fd)
            if self._pidfd in ready:
                self._exited = True
                if not response:
                    return True
            if response and (self._receive in ready or self._exited):
                return True

    # -- the channel -------------------------------------------------------------------------------

    def send(self, line: bytes) -> bool:
        """Write one request line; False if the program is gone, never listened, or stopped reading
        until its deadline (it is then killed)."""
        if self._send < 0 or self.result is not None:
            return False
        data = memoryview(line + b"\n")
        while data:
            try:
                data = data[os.write(self._send, data) :]
            except BlockingIOError:  # a full pipe: wait for room, not past the deadline
                left = self.deadline - time.monotonic()
                poller = select.poll()
                poller.register(self._send, select.POLLOUT)
                if left <= 0 or not poller.poll(int(left * 1000) + 1):
                    self._kill()
                    return False
            except OSError:
                return False
        return True

    def receive(self, cap: int = 16 << 20) -> bytes | None:
        """The next response line, or None: the program closed the channel, exited, went past the
        deadline (it is then killed) or sent more than `cap` bytes without a newline."""
        while b"\n" not in self._buffer:
            if self._receive < 0 or self.result is not None or len(self._buffer) > cap:
                return None
            if not self._pump(self.deadline, response=True):
                self._kill()
                return None
            if not _ready([self._receive], 0):
                if self._exited:
                    return None
                continue
            chunk = os.read(self._receive, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close_channel(self) -> None:
        for fd in (self._send, self._receive):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._send = self._receive = -1

    # -- the end -----------------------------------------------------------------------------------

    def _kill(self) -> None:
        """SIGKILL the launcher's process group (the launcher, the namespace's init, the program);
        the kernel then kills everything left in the namespace."""
        if not self.killed_at and self.proc is not None:
            self.killed_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        self._kill()

    def wait(self) -> SandboxResult:
        """Wait for the end (killing the run at its deadline) and report it; the cgroups and the
        root are gone by the time this returns."""
        if self.result is not None:
            return self.result
        assert self.proc is not None
        if not self._exited and not self._pump(self.deadline):
            self._kill()
            self._pump(time.monotonic() + 5.0)
        _, status = os.waitpid(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._pidfd)
        self.close_channel()
        leftovers = self._drain()
        ended = time.monotonic()
        kill_latency = ended - self.killed_at if self.killed_at else None
        while self._streams:  # every writer is gone with the namespace: the rest is already buffered
            self._pump(time.monotonic() + 1.0)
            if self._streams:
                for fd in list(self._streams):
                    os.close(fd)
                self._streams.clear()
        report = _read_all(self._report_r).decode(errors="replace").splitlines()
        self.result = self._result(report, ended - self.start, kill_latency, leftovers)
        self._cleanup()
        return self.result

    def _drain(self, wait_s: float = 5.0) -> list[int]:
        """Wait (up to `wait_s`) until no process of the run is left; return any that still are."""
        if self.groups is None or not self.groups.dirs:
            return []
        until = time.monotonic() + wait_s
        while (left := self.groups.members()) and time.monotonic() < until:
            time.sleep(0.0005)
        return left

    def _result(
        self, report: list[str], wall: float, kill_latency: float | None, leftovers: list[int]
    ) -> SandboxResult:
        captures = self._captures
        stdout, stderr = (captures[fd].text() if fd in captures else "" for fd in (self._out, self._err))
        usage = self.groups.usage() if self.groups is not None else None
        done = next((ln.split() for ln in report if ln.startswith("done ")), None)
        reported = (ln.removeprefix("error ") for ln in report if ln.startswith("error "))
        error = self.setup_error or next(reported, None)
        code = os.waitstatus_to_exitcode(int(done[1])) if done else None
        if error is not None:
            outcome = Outcome.ERROR
        elif usage is not None and usage.oom_kills:  # the first limit it hit, even if it then timed out
            outcome = Outcome.MEMORY
        elif self.killed_at:
            outcome = Outcome.TIMEOUT
        elif code is not None:
            outcome = _outcome_of(code, stderr)
        elif "started" in report:  # the program ran, and the namespace's init died under it
            outcome = Outcome.KILLED
        else:
            outcome = Outcome.ERROR
            status = self.proc.returncode if self.proc is not None else None
            error = f"the launcher exited with status {status}: {stderr.strip()[-300:]}"
        result = SandboxResult(
            outcome=outcome,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else (9 if self.killed_at else None),
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=self._out in captures and captures[self._out].truncated,
            stderr_truncated=self._err in captures and captures[self._err].truncated,
            wall_s=wall,
            cpu_s=float(done[2]) if done else 0.0,
            max_rss_mb=int(done[3]) / 1024 if done else 0.0,
            peak_memory_mb=usage.peak_memory_mb if usage is not None else None,
            kill_latency_s=kill_latency,
            isolation=self.isolation,
            missing=self.missing,
            error=error,
            leftover_pids=leftovers,
        )
        if self.box is not None:
            self.box.record(result)
        return result

    def _cleanup(self) -> None:
        if self.groups is not None:
            self.groups.remove()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class _Capture:
    """The first `cap` bytes of a stream; the rest is read and dropped so a flood cannot block."""

    def __init__(self, cap: int) -> None:
        self.cap, self.seen = cap, 0
        self.chunks: list[bytes] = []

    def read(self, fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if self.seen < self.cap:
            self.chunks.append(chunk[: self.cap - self.seen])
        self.seen += len(chunk)
        return bool(chunk)

    @property
    def truncated(self) -> bool:
        return self.seen > self.cap

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


def _ready(fds: list[int], timeout_s: float) -> list[int]:
    """The fds of `fds` readable (or closed) within `timeout_s`: poll, which has no fd-number limit."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [fd for fd, _ in poller.poll(max(0, int(timeout_s * 1000 + 0.999)))]


def _read_all(fd: int) -> bytes:
    if fd < 0:
        return b""
    chunks = []
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _outcome_of(code: int, stderr: str) -> Outcome:
    if code == 0:
        return Outcome.OK
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return Outcome.MEMORY
    if code < 0:
        return Outcome.KILLED
    return Outcome.EXIT
