"""`rlsched run --requeue` (what `rlsched submit` runs): bring a job back after a preemption or a failure.

Kueue requeues a preempted workload and recreates its pods. Here a job's driver is one process, so a
supervisor runs it as a child (`rlsched run ... --attempt N`) and, whenever the child exits with a
non-zero status, asks the cluster scheduler what that means (`Scheduler.failed`). The scheduler's
core decides, with the admin file's `requeue` rules:

- preempted: the child saw the eviction, checkpointed and reported it; the job is pending again
  at once (the report for that attempt changes nothing more);
- failed (an exception, a kill -9, an OOM): the job is pending behind a backoff that doubles with
  each failure, or, after `requeue.limit` failures, parked with the reason;
- cancelled, done, parked: no attempt follows.

While the job is pending, the supervisor starts the next attempt with `--resume` (once a commit log
exists): it registers under the same name, takes its entry back, waits out the backoff and its
admission, and continues from the newest checkpoint that verifies. SIGTERM or SIGINT to the
supervisor passes to the child, which checkpoints and stops; no attempt follows. The supervisor's
exit status is the last child's (1 when parked after a kill).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rlsched.policy.lifecycle import JobState
from rlsched.store.commit_log import LOG_NAME


def exit_words(rc: int) -> str:
    """A child's exit status in words, for the scheduler's reason."""
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return {3: "stopped (exit status 3)"}.get(rc, f"exit status {rc}")


class Supervisor:
    """Runs the job's attempts one after another while the scheduler keeps it pending."""

    def __init__(
        self,
        argv: list[str],
        out_dir: Path,
        name: str,
        report: Callable[[str, int], dict[str, Any]],
        log: Callable[[str], None] = print,
    ) -> None:
        """`report(why, attempt)`: tell the cluster scheduler the attempt ended; its view of the job
        (`actors.cluster_client.report_attempt`)."""
        self.argv, self.out_dir, self.name, self.report, self.log = argv, out_dir, name, report, log
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def command(self, attempt: int) -> list[str]:
        cmd = [sys.executable, "-m", "rlsched.cli", *self.argv, "--attempt", str(attempt)]
        if attempt > 0 and "--resume" not in self.argv and (self.out_dir / LOG_NAME).exists():
            cmd.append("--resume")
        return cmd

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._attempts()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _attempts(self) -> int:
        attempt = 0
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.command(attempt))
            rc = self.child.wait()
            if rc == 0 or rc == 2 or self.stopping:
                return rc  # done; bad input (the same input fails the same way); or told to stop
            why = exit_words(rc)
            view = self.report(why, attempt)
            state, reason = view.get("state", "unknown"), view.get("reason", "")
            if state != JobState.PENDING:
                self.log(f"attempt {attempt + 1} ended ({why}); the job is {state}: {reason}")
                return rc if rc > 0 else 1
            requeued = view.get("requeued") or reason
            waits = f" (now waiting: {reason})" if reason != requeued else ""
            self.log(
                f"attempt {attempt + 1} ended after {time.monotonic() - started:.0f} s ({why}); "
                f"{requeued}{waits}. Starting attempt {attempt + 2}"
            )
            attempt += 1

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
