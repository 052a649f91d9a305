"""One sandboxed execution in flight (`Running`): its deadline, its captured output, its report and
its request/response channel, and how it is stopped and cleaned up.

`verifiers.sandbox` starts the process in its minimal root; this module watches it. There is no
thread: whichever call waits drains stdout and stderr meanwhile and kills the run at its deadline.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from verifiers.cgroups import RunGroups
from verifiers.sandbox_types import Isolation, Outcome, SandboxLimits, SandboxResult


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
        on_result: Callable[[SandboxResult], None] | None,  # its environment's books (`Sandbox.record`)
        scratch: Path | None,
        outputs: tuple[int, int] = (-1, -1),
    ) -> None:
        self.proc, self.start, self.limits, self.groups = proc, start, limits, groups
        self.deadline = start + limits.timeout_s
        self.isolation, self.missing, self.on_result, self.scratch = isolation, missing, on_result, scratch
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
        if self.on_result is not None:
            self.on_result(result)
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
