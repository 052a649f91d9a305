"""The sandbox's vocabulary: what a run may use (`SandboxLimits`), how strict its isolation is
(`SandboxPolicy`), what this machine offers (`Capabilities`) and what happened (`SandboxResult`).

Kept apart from `verifiers.sandbox` (which builds the root and starts the run) and
`verifiers.sandbox_run` (which watches it) so that both read one set of types.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from verifiers.cgroups import Controller

RESERVED = ("/", "/usr", "/python", "/proc", "/dev", "/tmp", "/work", "/etc", "/.program")


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


class Opening(StrEnum):
    """What the sandbox's system-call filter denies unless a policy opens it (`SandboxPolicy.allow`):
    Docker's default profile denies them too."""

    IO_URING = "io_uring"  # a second system-call interface the filter cannot see into
    NETLINK = "netlink"  # sockets to the kernel's own interfaces
    VSOCK = "vsock"  # sockets to the hypervisor


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10
    memory_mb: int = 512  # the run's cgroup, and the address space of each process (unless below)
    file_mb: int = 16  # largest file it may write
    open_files: int = 64
    processes: int = 32  # processes and threads of the run at once
    output_bytes: int = 64 * 1024  # kept of stdout and of stderr each
    work_mb: int = 64  # the writable /work
    tmp_mb: int = 64  # /tmp (and /dev/shm: a quarter of it)
    # each process's address space held to memory_mb; off for CUDA, whose runtime reserves terabytes
    # of virtual addresses (the cgroup still bounds the memory used)
    limit_address_space: bool = True

    def __post_init__(self) -> None:
        numbers = (self.cpu_s, self.memory_mb, self.open_files, self.processes, self.work_mb, self.tmp_mb)
        if self.timeout_s <= 0 or min(numbers) < 1:
            raise ValueError("sandbox limits must be positive")


@dataclass(frozen=True)
class SandboxPolicy:
    isolation: Isolation | None = None  # None: strict where the machine allows it, else best effort
    read_only: tuple[tuple[str, str], ...] = ()  # extra (host path, path inside) bound read-only
    devices: tuple[str, ...] = ()  # device nodes of the host's /dev the run may open (a GPU's)
    allow: frozenset[Opening] = frozenset()  # what the filter denies that these programs need

    @classmethod
    def from_specs(
        cls, isolation: Isolation | None, specs: Sequence[str], allow: Sequence[Opening] = ()
    ) -> SandboxPolicy:
        """From `HOST[:INSIDE]` specs (the config's `read_only`, the CLI's `--read-only`): a path
        alone is bound at the same path inside."""
        pairs = tuple((host, inside or host) for host, _, inside in (spec.partition(":") for spec in specs))
        return cls(isolation, pairs, allow=frozenset(allow))

    def check(self) -> str | None:
        """Why this policy cannot be applied (a message naming the fix), or None."""
        for name in self.devices:
            path = f"/dev/{name}"
            if "/" in name or name in ("", ".", "..") or not os.path.exists(path):
                return f"device {name!r} is not a node of /dev: name one such as nvidia0"
            if not stat.S_ISCHR(os.stat(path).st_mode):
                return f"{path} is not a character device; only those can be passed to a run"
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
