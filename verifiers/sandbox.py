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
import io
import marshal
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from verifiers.cgroups import RunGroups, find_controllers
from verifiers.sandbox_run import Running
from verifiers.sandbox_types import (
    Capabilities,
    Isolation,
    Outcome,
    SandboxLimits,
    SandboxPolicy,
    SandboxResult,
)

__all__ = [
    "Capabilities",
    "Isolation",
    "Outcome",
    "Running",
    "Sandbox",
    "SandboxLimits",
    "SandboxPolicy",
    "SandboxResult",
    "capabilities",
    "run_sandboxed",
]

LAUNCHER = Path(__file__).with_name("_sandbox_init.py")
# the base interpreter, not the virtual environment's: the program gets the standard library only
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
PREFIX = os.path.realpath(sys.base_prefix)
INSIDE_PYTHON = "/python/" + os.path.relpath(PYTHON, PREFIX)
UID_BASE, UID_COUNT = 200_000, 4096  # each concurrent run (or environment) holds one, by a file lock
DIR_PREFIX = "rlsched-sandbox-"  # each sandbox's directory under the temporary directory
# the uid locks are the machine's, whatever TMPDIR a process has: two processes with different
# temporary directories must never hold one uid (a kill-all of one run's uid would reach the other's)
UID_LOCKS = Path("/run" if os.access("/run", os.W_OK) else "/tmp") / "rlsched-sandbox-uids"
ALIVE = ".alive"  # locked by the process whose sandbox the directory is
CHANNEL_FDS = (3, 4)  # inside: requests in, responses out


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
        self.host_dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        os.chmod(self.host_dir, 0o711)
        self._alive = _hold(self.host_dir / ALIVE)  # free once this process is gone: `sweep_orphans`
        self.work: Path | None = None
        self.work_mb = 64  # the work directory's size, and the most `save_work` archives
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
        box.work_mb = work_mb
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

    def save_work(self) -> bytes:
        """The work directory as a tar archive, kept outside the environment (links are stored as
        links, never followed): what `restore_work` puts into a new one, so an environment can be
        released between tool calls and rebuilt with the files its episode left. ValueError when its
        files would archive to more than the environment's size (`work_mb`): a sparse file of 0
        bytes on the tmpfs once became 256 MiB of archive in the host's memory."""
        if self.work is None:
            raise ValueError("this sandbox has no work directory to save (persistent=False)")
        data = _file_bytes(self.work)
        if data > self.work_mb << 20:
            raise ValueError(
                f"the work directory's files hold {data / (1 << 20):.0f} MB of data, more than the "
                f"environment's {self.work_mb} MB (a sparse file counts at its full size, which an "
                "archive would store): not saved"
            )
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for entry in sorted(self.work.iterdir()):
                tar.add(entry, arcname=entry.name)
        return out.getvalue()

    def restore_work(self, archive: bytes) -> int:
        """Unpack `save_work`'s archive into this sandbox's work directory, owned by this sandbox's
        uid; tar's `data` filter refuses absolute paths, links leading out and device files
        (ValueError). The number of entries restored."""
        if self.work is None:
            raise ValueError("this sandbox has no work directory to restore into (persistent=False)")
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
                members = tar.getmembers()
                tar.extractall(self.work, filter="data")
        except tarfile.TarError as err:
            raise ValueError(f"the archive was refused: {err}") from err
        if self.caps.per_run_uid:
            for root, dirs, files in os.walk(self.work):
                for name in dirs + files:
                    os.lchown(os.path.join(root, name), self.uid, self.uid)
        return len(members)

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
            if self._alive >= 0:
                os.close(self._alive)
                self._alive = -1
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


def _file_bytes(root: Path) -> int:
    """The bytes an archive of `root` would hold: every regular file at its apparent size (links not
    followed), so a sparse file of 0 bytes on disk counts as what its holes would become."""
    total, pending = 0, [str(root)]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _used_bytes(path: Path, mounted: bool) -> int:
    """Bytes in a work directory: its tmpfs's own count, or (a plain directory) a walk that no depth
    of nesting can overflow."""
    if mounted:
        stats = os.statvfs(path)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return _file_bytes(path)


def _hold(lock: Path) -> int:
    """An exclusive lock on `lock`, held by this process until the fd is closed or the process ends."""
    fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the sandbox directories whose process died without destroying them (a SIGKILL, a Ray
    worker that was lost): each live `Sandbox` holds a lock on its directory's `.alive` file, which
    the kernel frees with its process. Their work mounts are undone first. A directory without that
    file (a one-shot run's, or one being made) is left alone. Returns what was removed."""
    removed = []
    for host_dir in sorted(Path(root or tempfile.gettempdir()).glob(DIR_PREFIX + "*")):
        alive = host_dir / ALIVE
        try:
            fd = os.open(alive, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its sandbox lives
        try:
            work = host_dir / "work"
            if os.path.ismount(work):
                subprocess.run(["umount", "-l", str(work)], capture_output=True)
            shutil.rmtree(host_dir, ignore_errors=True)
            removed.append(host_dir)
        finally:
            os.close(fd)
    return removed


def _claim_uid() -> tuple[int, int]:
    """A uid no other live run holds: an exclusive lock on its file, released with the environment."""
    locks = UID_LOCKS
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
    host_dir = box.host_dir if box is not None else Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
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
        "allow": sorted(str(opening) for opening in policy.allow),
        "work": str(work) if work is not None else None,
        "work_mb": limits.work_mb,
        "tmp_mb": limits.tmp_mb,
        "shm_mb": max(1, limits.tmp_mb // 4),
        "uid": uid if caps.per_run_uid else None,
        "limits": {name: getattr(limits, name) for name in _RLIMITS}
        | {"address_space_mb": limits.memory_mb if limits.limit_address_space else 0},
        "devices": list(policy.devices),
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
        box.record if box is not None else None,
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
