"""Memory and process limits for one sandboxed run, through the kernel's cgroup accounting.

A per-process `RLIMIT_AS` does not bound a program that forks and allocates in every child; a cgroup
does: the kernel charges every page of every process of the run (and of its private tmpfs) to one
group, OOM-kills inside it when the sum passes the limit, and records the peak. The pids controller
caps how many processes and threads the run may hold at once.

Which hierarchy: cgroup v2 where its `memory` and `pids` controllers are enabled for our own cgroup's
children; cgroup v1 otherwise, controller by controller. "v2 is mounted" is not enough: a machine may
mount cgroup2 with only `hugetlb` enabled (this development machine does) and keep memory and pids on
v1. `find_controllers` reads `/proc/self/mountinfo` and `/proc/self/cgroup` to decide, and a run's
groups are made beneath the cgroup this process already lives in, so the limits of the container
still hold above them.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class Controller:
    """Where runs' groups for one controller are made, and in which cgroup version."""

    name: str  # memory | pids
    version: int  # 1 | 2
    base: Path  # the directory under which each run gets a group of its own


def find_controllers(proc: Path = Path("/proc/self")) -> dict[str, Controller]:
    """The usable memory and pids controllers (v2 where enabled for children, else v1), by name;
    a missing name means the machine offers no writable hierarchy for it."""
    mounts = _cgroup_mounts(proc / "mountinfo")
    paths = _own_cgroups(proc / "cgroup")
    found: dict[str, Controller] = {}
    for name in CONTROLLERS:
        controller = _v2(name, mounts, paths) or _v1(name, mounts, paths)
        if controller is not None:
            found[name] = controller
    return found


def _cgroup_mounts(mountinfo: Path) -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, super options) of every cgroup and cgroup2 mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in mountinfo.read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((tail[0], Path(fields[4]), set(tail[2].split(","))))
    return found


def _own_cgroups(cgroup_file: Path) -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under the key '' its v2 path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in cgroup_file.read_text().splitlines():
            _, names, path = line.split(":", 2)
            for name in names.split(",") if names else [""]:
                paths[name] = path
    return paths


def _v2(name: str, mounts: list[tuple[str, Path, set[str]]], paths: dict[str, str]) -> Controller | None:
    for kind, point, _ in mounts:
        if kind != "cgroup2" or "" not in paths:
            continue
        own = point / paths[""].lstrip("/")
        if name in _words(own / "cgroup.subtree_control"):
            return _writable(Controller(name, 2, own / "rlsched-sandbox"))
        if paths[""] == "/" and name in _words(own / "cgroup.controllers"):  # the root may enable it
            with contextlib.suppress(OSError):
                (own / "cgroup.subtree_control").write_text(f"+{name}")
                return _writable(Controller(name, 2, own / "rlsched-sandbox"))
    return None


def _v1(name: str, mounts: list[tuple[str, Path, set[str]]], paths: dict[str, str]) -> Controller | None:
    for kind, point, options in mounts:
        if kind == "cgroup" and name in options:
            own = point / paths.get(name, "/").lstrip("/")
            return _writable(Controller(name, 1, (own if own.is_dir() else point) / "rlsched-sandbox"))
    return None


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _writable(controller: Controller) -> Controller | None:
    """The controller if we may make groups under its base (made now if need be)."""
    try:
        controller.base.mkdir(exist_ok=True)
    except OSError:
        return None
    if controller.version == 2:  # children of the base need the controller enabled in it too
        with contextlib.suppress(OSError):
            if controller.name not in _words(controller.base / "cgroup.subtree_control"):
                (controller.base / "cgroup.subtree_control").write_text(f"+{controller.name}")
        if controller.name not in _words(controller.base / "cgroup.subtree_control"):
            return None
    return controller if os.access(controller.base, os.W_OK) else None


@dataclass(frozen=True)
class Usage:
    peak_memory_mb: float | None  # the most the group held at once (None: not measured)
    oom_kills: int  # processes the kernel killed for the group's memory limit
    pids_refused: int  # forks refused at the process limit


class RunGroups:
    """One run's groups, one per controller: made with limits, joined by the launcher (the host moves
    it in before it forks anything), read after the run, then removed."""

    def __init__(self, controllers: dict[str, Controller], run_name: str) -> None:
        self.controllers = controllers
        self.dirs = {name: c.base / run_name for name, c in controllers.items()}

    def create(self, memory_mb: int, processes: int) -> None:
        for name, path in self.dirs.items():
            path.mkdir()
            version = self.controllers[name].version
            if name == "memory":
                limit = str(memory_mb << 20)
                if version == 2:
                    (path / "memory.max").write_text(limit)
                    _try_write(path / "memory.swap.max", "0")
                else:
                    (path / "memory.limit_in_bytes").write_text(limit)
                    _try_write(path / "memory.memsw.limit_in_bytes", limit)  # no swapping past it
            else:
                (path / "pids.max").write_text(str(processes))

    def join(self, pid: int) -> None:
        """Move a process into every group of the run (its children are then born there)."""
        for path in self.procs_files:
            Path(path).write_text(str(pid))

    @property
    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def members(self) -> list[int]:
        """PIDs still in any of the run's groups."""
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(path).read_text().split())
        return sorted(found)

    def memory_bytes(self) -> int | None:
        """The memory the run's processes hold now (None: no memory group)."""
        memory = self.dirs.get("memory")
        if memory is None:
            return None
        v2 = self.controllers["memory"].version == 2
        return _read_int(memory / ("memory.current" if v2 else "memory.usage_in_bytes"))

    def usage(self) -> Usage:
        peak, ooms, refused = None, 0, 0
        if (memory := self.dirs.get("memory")) is not None:
            v2 = self.controllers["memory"].version == 2
            raw = _read_int(memory / ("memory.peak" if v2 else "memory.max_usage_in_bytes"))
            peak = raw / (1 << 20) if raw is not None else None
            events = _keyed(memory / ("memory.events" if v2 else "memory.oom_control"))
            ooms = events.get("oom_kill", 0)
        if (pids := self.dirs.get("pids")) is not None:
            refused = _keyed(pids / "pids.events").get("max", 0)
        return Usage(peak, ooms, refused)

    def remove(self, wait_s: float = 2.0) -> None:
        """Remove the groups; a group is removable once its last process has gone (retried briefly)."""
        until = time.monotonic() + wait_s
        for path in self.dirs.values():
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > until:
                        break
                    time.sleep(0.002)


def _try_write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """A `key value` per line file (memory.events, memory.oom_control, pids.events)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                found[key] = int(value)
    return found
