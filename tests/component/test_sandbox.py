"""The sandbox against hostile programs: each outcome recorded, nothing planted read, nothing left behind.

Real subprocesses in a real minimal root, in real mount, PID, network, IPC and UTS namespaces, under
real cgroups (this machine allows them as root). After every hostile run the host is scanned: no
process of the run alive, no file the program wrote in any directory the host would let it write
to, no SysV object it made, no cgroup or root directory of the run left. Where the machine lacks
the isolation (not root, no cgroups), those tests are skipped with the reason, and the refusal and
best-effort paths are tested with the machine's real capabilities replaced by what is missing.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from verifiers.cgroups import find_controllers
from verifiers.sandbox import (
    Isolation,
    Outcome,
    Sandbox,
    SandboxLimits,
    SandboxPolicy,
    capabilities,
    run_sandboxed,
)
from verifiers.sandbox_types import Opening

REPO = Path(__file__).resolve().parents[2]
MISSING = capabilities().missing()
isolated = pytest.mark.skipif(bool(MISSING), reason=f"this machine lacks: {'; '.join(MISSING)}")
LIMITS = SandboxLimits(timeout_s=1.5, memory_mb=256, processes=32, output_bytes=4096)
# for a program that must end by another cause than the wall clock (a memory kill, its own exit, even
# `print(1)`'s): on two cores beside the Ray lane, 8 forks touching 100 MB each, or the interpreter's
# start, took over 1.5 s (CI at e800ea5: TIMEOUT where MEMORY was due, and an empty "still fine"; at
# 50393fb a best-effort `print('ran')`). The forks' run ends at the wall clock whatever happens (its
# children sleep), so this is also what that test costs.
PATIENT = replace(LIMITS, timeout_s=10.0)
MARK = f"rlsched-canary-{secrets.token_hex(6)}"  # in every file a hostile program tries to write
SECRET = secrets.token_hex(16)  # in every file planted for a hostile program to find
SHM_KEY, MSG_KEY = 0x5A17_0001, 0x5A17_0002


LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "tmpfs", "zfs", "f2fs"}
SCAN_DEPTH, SCAN_BUDGET_S = 6, 60.0


def _world_writable() -> list[str]:
    """Directories on the host that any uid may write to: where a run could leave something.

    A breadth-first walk of the local filesystems (network and FUSE mounts, /proc and /sys are left
    out), shallowest first, to a fixed depth and within a time budget: an unbounded `find /` took
    over two minutes on a CI machine with a large disk. The usual places are always included.
    """
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    roots = sorted({m[1] for m in mounts if m[2] in LOCAL_FS and not m[1].startswith(("/proc", "/sys"))})
    found: set[str] = {"/tmp", "/var/tmp", "/dev/shm", "/run/lock"}
    deadline = time.monotonic() + SCAN_BUDGET_S
    for root in roots:
        found |= _writable_under(root, os.stat(root).st_dev, deadline)
    return sorted(found)[:400]


def _writable_under(root: str, device: int, deadline: float) -> set[str]:
    """World-writable directories under root on its own filesystem, breadth first, until the deadline."""
    found: set[str] = set()
    level = [root]
    for _ in range(SCAN_DEPTH):
        below: list[str] = []
        for directory in level:
            if time.monotonic() > deadline:
                return found
            for entry in _entries(directory):
                if entry.path in ("/tmp/ray", "/proc", "/sys"):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.st_dev != device or not entry.is_dir(follow_symlinks=False):
                    continue
                if stat.st_mode & 0o002:
                    found.add(entry.path)
                below.append(entry.path)
        level = below
    return found


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except OSError:
        return []


@pytest.fixture(scope="module")
def host() -> Iterator[dict[str, object]]:
    """Files planted on the host, and the directories a run could write to."""
    planted = [REPO / f".{MARK}-planted", Path("/var/lib") / f"{MARK}-planted"]
    for path in planted:
        path.write_text(SECRET)
        path.chmod(0o644)
    yield {"planted": [str(p) for p in planted], "writable": _world_writable()}
    for path in planted:
        path.unlink(missing_ok=True)


def _scan(writable: list[str]) -> list[str]:
    """What a run left on the host: files of ours in writable places, SysV objects, cgroups, roots."""
    left = [f"{d}/{n}" for d in writable if os.path.isdir(d) for n in _names(d) if MARK in n]
    for kind in ("shm", "msg"):
        rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        left += [f"sysv {kind} {r.split()[0]}" for r in rows if int(r.split()[0]) in (SHM_KEY, MSG_KEY)]
    for controller in find_controllers().values():  # runs of this process (a cgroup is run-UID-PID-N)
        left += [str(p) for p in controller.base.glob(f"run-*-{os.getpid()}-*")]
    return left


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _hostile(host: dict[str, object]) -> dict[str, tuple[str, set[Outcome]]]:
    planted, writable = host["planted"], host["writable"]
    return {
        "fork bomb": (
            "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
            {Outcome.TIMEOUT},
        ),
        "memory bomb": ("x = bytearray(4 << 30)", {Outcome.MEMORY}),
        "fork and allocate in 8 processes": (
            "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        b = bytearray(100 << 20)\n"
            "        for i in range(0, len(b), 4096): b[i] = 1\n        time.sleep(30)\n"
            "while True:\n    try: os.wait()\n    except ChildProcessError: break",
            {Outcome.MEMORY},
        ),
        "infinite loop": ("while True: pass", {Outcome.TIMEOUT}),
        "double fork + setsid daemon": (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(600)\n    os._exit(0)\ntime.sleep(600)",
            {Outcome.TIMEOUT},
        ),
        "read planted files and a task's references": (
            f"for p in {[*planted, str(REPO / 'configs/tasks/addition_sample.jsonl')]!r}:\n"
            "    try: print(open(p).read())\n    except OSError as e: print('refused', p, e.errno)",
            {Outcome.OK},
        ),
        "list /, /home, /root and /proc/1": (
            "import os\nfor d in ['/', '/home', '/root', '/proc/1']:\n"
            "    try: print(d, sorted(os.listdir(d)))\n"
            "    except OSError as e: print(d, 'refused', e.errno)\n"
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "print('cmdline', [open(f'/proc/{p}/cmdline').read() for p in pids])",
            {Outcome.OK},
        ),
        "write to every host-writable directory": (
            f"for d in {writable!r} + ['/', '/etc', '/usr', '/python', '/run', '/var/tmp', '/dev/mqueue']:\n"
            f"    try: open(d + '/{MARK}', 'w').write('x'); print('wrote', d)\n"
            "    except OSError: pass",
            {Outcome.OK},
        ),
        "leave SysV shared memory and a message queue": (
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            f"print(libc.shmget({SHM_KEY}, 4096, 0o1000 | 0o666), libc.msgget({MSG_KEY}, 0o1000 | 0o666))",
            {Outcome.OK},
        ),
        "connect to a local port": (
            "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)",
            {Outcome.EXIT},
        ),
        "read the parent's environment": (
            "import os\nprint(open(f'/proc/{os.getppid() or 1}/environ').read())",
            {Outcome.EXIT},
        ),
        "signal the parent": (  # its parent is the namespace's init, which runs as another uid
            "import os, signal\nos.kill(os.getppid() or 1, signal.SIGKILL)\nimport time; time.sleep(600)",
            {Outcome.EXIT},
        ),
        "flood stdout": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", {Outcome.TIMEOUT}),
    }


HOSTILE_NAMES = [
    "fork bomb",
    "memory bomb",
    "fork and allocate in 8 processes",
    "infinite loop",
    "double fork + setsid daemon",
    "read planted files and a task's references",
    "list /, /home, /root and /proc/1",
    "write to every host-writable directory",
    "leave SysV shared memory and a message queue",
    "connect to a local port",
    "read the parent's environment",
    "signal the parent",
    "flood stdout",
]


@isolated
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_program(name: str, host: dict[str, object]) -> None:
    program, expected = _hostile(host)[name]
    me = os.getpid()
    roots_before = set(Path("/tmp").glob("rlsched-sandbox-*"))
    result = run_sandboxed(program, LIMITS if Outcome.TIMEOUT in expected else PATIENT)
    assert result.isolation is Isolation.STRICT and result.missing == []
    assert result.outcome in expected, (result.outcome, result.error, result.stderr[-300:])
    assert result.leftover_pids == [], "a process of the run survived the release of its slot"
    assert SECRET not in result.stdout + result.stderr, "a planted secret was read"
    assert '"tests"' not in result.stdout, "a task's reference file was read"
    assert _scan(host["writable"]) == [], "the run left something on the host"  # type: ignore[arg-type]
    assert set(Path("/tmp").glob("rlsched-sandbox-*")) <= roots_before
    assert os.getpid() == me and run_sandboxed("print('still fine')", PATIENT).stdout == "still fine\n"
    assert len(result.stdout.encode()) <= LIMITS.output_bytes
    if Outcome.TIMEOUT in expected:
        assert result.exit_code is None and result.kill_latency_s is not None
    if name == "fork and allocate in 8 processes":  # the cgroup held the sum, not each process
        assert result.peak_memory_mb is not None and result.peak_memory_mb <= LIMITS.memory_mb + 1
    if name == "list /, /home, /root and /proc/1":
        lines = result.stdout.splitlines()
        root = set(eval(lines[0].removeprefix("/ ")))
        assert {".program", "dev", "etc", "proc", "python", "tmp", "usr", "work"} <= root
        assert root <= {
            ".program",
            "dev",
            "etc",
            "proc",
            "python",
            "tmp",
            "usr",
            "work",
            "bin",
            "sbin",
            "lib",
            "lib32",
            "lib64",
            "libx32",
        }
        assert lines[1] == "/home refused 2" and lines[2] == "/root refused 2"
        cmdlines = lines[4]
        for host_path in ("/root", str(REPO), "/work/", "/tmp/rlsched", "import ", "marshal"):
            assert host_path not in cmdlines, f"{host_path!r} shows in the run's /proc"
    if name == "write to every host-writable directory":
        wrote = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("wrote")}
        assert wrote <= {"/tmp", "/var/tmp", "/dev/shm"}, wrote  # the run's own tmpfs, gone with it
    if name == "leave SysV shared memory and a message queue":
        assert result.stdout.split() != ["-1", "-1"]  # it did make them, inside its IPC namespace


@isolated
def test_a_second_run_cannot_find_what_the_first_left() -> None:
    first = run_sandboxed(
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        f"print(libc.shmget({SHM_KEY}, 4096, 0o1000 | 0o666))\nopen('/tmp/{MARK}', 'w').write('x')\n"
        f"open('/work/{MARK}', 'w').write('x')",
        PATIENT,
    )
    second = run_sandboxed(
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        f"print(libc.shmget({SHM_KEY}, 4096, 0o666), os.listdir('/tmp'), os.listdir('/work'))",
        PATIENT,
    )
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK
    assert second.stdout.strip() == "-1 [] []"


@isolated
def test_no_socket_reaches_another_run_or_the_host() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    with Sandbox.create(persistent=False) as a, Sandbox.create(persistent=False) as b:
        server = a.start(
            "import socket, time\ns = socket.socket(socket.AF_UNIX)\n"
            "s.bind('\\0rlsched-canary')\ns.listen()\nt = socket.socket()\n"
            "try:\n    t.bind(('127.0.0.1', 7777)); t.listen(); print('tcp up', flush=True)\n"
            "except OSError as e: print('tcp', e.errno, flush=True)\ntime.sleep(3)",
            limits=SandboxLimits(timeout_s=2),
        )
        time.sleep(0.3)
        client = b.exec(
            "import socket\nfor addr, family in (('\\0rlsched-canary', socket.AF_UNIX), "
            f"(('127.0.0.1', 7777), socket.AF_INET), (('127.0.0.1', {port}), socket.AF_INET)):\n"
            "    try: socket.socket(family).connect(addr); print('connected', addr)\n"
            "    except OSError as e: print('refused', e.errno)",
            limits=SandboxLimits(timeout_s=2),
        )
        server.wait()
    listener.close()
    assert client.outcome is Outcome.OK
    assert "connected" not in client.stdout and client.stdout.count("refused") == 3


@isolated
def test_each_run_has_its_own_uid_and_process_limit() -> None:
    limits = SandboxLimits(timeout_s=5, processes=24)
    program = (
        "import os, time\nkids = 0\nfor _ in range(20):\n    if os.fork() == 0:\n        time.sleep(1.5)\n"
        "        os._exit(0)\n    kids += 1\nprint(os.getuid(), kids, flush=True)\n"
        "while True:\n    try: os.wait()\n    except ChildProcessError: break"
    )
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(run_sandboxed(program, limits).stdout))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (uid_a, kids_a), (uid_b, kids_b) = (r.split() for r in results)
    assert uid_a != uid_b  # a shared uid would share RLIMIT_NPROC: the second run's forks would fail
    assert kids_a == kids_b == "20"


@isolated
def test_well_behaved_program_sees_a_minimal_world() -> None:
    program = (
        "import os, sys\nprint(os.getcwd(), sorted(os.environ))\n"
        "open('out.txt', 'w').write('kept')\nprint(open('out.txt').read())\nsys.exit(3)"
    )
    result = run_sandboxed(program, PATIENT)
    assert result.outcome is Outcome.EXIT and result.exit_code == 3 and result.signal is None
    assert result.stdout.startswith("/work ['HOME', 'LANG', 'LD_LIBRARY_PATH', 'PATH', 'TMPDIR']")
    assert "kept" in result.stdout
    assert result.max_rss_mb > 1 and result.cpu_s >= 0 and result.peak_memory_mb and result.peak_memory_mb > 1


@isolated
def test_the_standard_library_works_inside() -> None:
    program = (
        "import sqlite3, ssl, json, decimal, hashlib, tempfile, zlib, lzma, bz2, ctypes, asyncio, csv, re\n"
        "import concurrent.futures, multiprocessing\n"
        "with concurrent.futures.ProcessPoolExecutor(2) as ex: print(sum(ex.map(abs, [-1, -2])))\n"
        "print(sqlite3.connect(':memory:').execute('select 41 + 1').fetchone()[0], tempfile.gettempdir())"
    )
    result = run_sandboxed(program, SandboxLimits(timeout_s=10))
    assert result.outcome is Outcome.OK, result.stderr[-500:]
    assert result.stdout.split() == ["3", "42", "/tmp"]


@isolated
def test_an_opted_in_read_only_path_is_readable_and_nothing_else(tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "rows.txt").write_text("row 1\n")
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    policy = SandboxPolicy(read_only=((str(data), "/data"),))
    result = run_sandboxed(
        "import os\nprint(open('/data/rows.txt').read().strip(), os.listdir('/data'))\n"
        "try: open('/data/new', 'w')\nexcept OSError as e: print('read-only', e.errno)",
        PATIENT,
        policy,
    )
    assert result.outcome is Outcome.OK, result.error
    assert result.stdout.splitlines() == ["row 1 ['rows.txt']", "read-only 30"]


@isolated
def test_an_environment_keeps_its_work_directory_until_destroyed() -> None:
    box = Sandbox.create()
    other = Sandbox.create()
    try:
        wrote = box.exec("open('notes.txt', 'w').write('turn one')\nimport os; print(os.getuid())")
        read = box.exec("print(open('/work/notes.txt').read())")
        shell = box.exec(argv=["/bin/sh", "-c", "ls /work; id -u"])
        elsewhere = other.exec("import os; print(os.listdir('/work'))")
        assert wrote.outcome is read.outcome is shell.outcome is Outcome.OK, (shell.error, shell.stderr)
        assert read.stdout == "turn one\n"
        assert shell.stdout.split() == ["notes.txt", wrote.stdout.strip()]
        assert elsewhere.stdout == "[]\n" and box.uid != other.uid
        host_dir = box.host_dir
    finally:
        usage = box.destroy()
        other.destroy()
    assert not host_dir.exists()
    assert usage["executions"] == 3 and 0 < usage["work_bytes"] <= 64 << 10 and usage["cpu_s"] > 0


@isolated
def test_no_host_fd_reaches_the_program_whatever_its_number() -> None:
    spare = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]  # a busy verifier's fds
    try:
        result = run_sandboxed(
            "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n"
            "for fd in range(3, 4096):\n    try: os.write(fd, b'done 0 0 0\\nerror forged\\n')\n"
            "    except OSError: pass\nraise SystemExit(3)",
            PATIENT,
        )
    finally:
        for fd in spare:
            os.close(fd)
    assert result.outcome is Outcome.EXIT and result.exit_code == 3 and result.error is None
    assert result.stdout.strip() == "[0, 1, 2, 3]"  # 3: the directory listdir itself opened


KEYRINGS_AND_NAMESPACES = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "nr = {'x86_64': (248, 250), 'aarch64': (217, 219)}[os.uname().machine]\n"
    "print(libc.syscall(nr[0], b'user', b'rlsched', b'hello', 5, -2), ctypes.get_errno())\n"
    "print(libc.syscall(nr[1], 0, -2, 0, 0, 0), ctypes.get_errno())\n"
    "print(libc.unshare(0x10000000), ctypes.get_errno())"
)
# issue 41, finding 8 and the low ones: closer to Docker's default profile
IO_URING_NETLINK_VSOCK = (
    "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "params = ctypes.create_string_buffer(120)\n"
    "fd = libc.syscall(425, 8, params)\n"
    "print('fd' if fd >= 0 else -1, 0 if fd >= 0 else ctypes.get_errno())\n"
    "for family in (socket.AF_NETLINK, 40):\n"
    "    try:\n        socket.socket(family, socket.SOCK_DGRAM if family == 40 else socket.SOCK_RAW)\n"
    "        print('opened')\n    except OSError as err:\n        print(err.errno)\n"
    "socket.socket(socket.AF_UNIX).close(); print('unix ok')"
)


@isolated
@pytest.mark.parametrize(
    ("program", "expected"),
    [
        pytest.param(
            KEYRINGS_AND_NAMESPACES, ["-1", "1", "-1", "1", "-1", "1"], id="keyrings-and-new-namespaces"
        ),
        pytest.param(
            IO_URING_NETLINK_VSOCK, ["-1", "1", "1", "1", "unix", "ok"], id="io_uring-netlink-vsock"
        ),
    ],
)
def test_refused_system_calls(program: str, expected: list[str]) -> None:
    result = run_sandboxed(program, PATIENT)
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.split() == expected  # EPERM each time


@isolated
def test_a_policy_opens_what_the_filter_denies_when_its_programs_need_it() -> None:
    """`sandbox.allow` (io_uring, netlink, vsock): each answers inside as it answers on the host."""
    import subprocess
    import sys

    host = subprocess.run([sys.executable, "-c", IO_URING_NETLINK_VSOCK], capture_output=True, text=True)
    assert host.returncode == 0, host.stderr
    result = run_sandboxed(IO_URING_NETLINK_VSOCK, PATIENT, SandboxPolicy(allow=frozenset(Opening)))
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.split() == host.stdout.split()


@isolated
def test_an_environment_is_destroyed_whatever_it_left_in_work() -> None:
    box = Sandbox.create()
    deep = box.exec("import os\nfor _ in range(1900):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')")
    host_dir = box.host_dir
    usage = box.destroy()
    assert deep.stdout == "deep\n" and usage["work_bytes"] >= 0
    assert not host_dir.exists() and str(host_dir) not in Path("/proc/self/mounts").read_text()


@isolated
def test_cpu_limit_kills_with_a_signal() -> None:
    result = run_sandboxed("while True: pass", SandboxLimits(timeout_s=10, cpu_s=1))
    assert result.outcome is Outcome.KILLED and result.exit_code is None and result.signal is not None
    # one CPU-second, before the 10 s wall limit: on two loaded cores it took up to 6 s of wall time
    assert 0.8 < result.wall_s < 10


def test_output_is_capped_not_blocking() -> None:
    result = run_sandboxed("print('y' * 1_000_000)", PATIENT, SandboxPolicy(Isolation.BEST_EFFORT))
    assert result.outcome is Outcome.OK and result.stdout_truncated
    assert len(result.stdout) == LIMITS.output_bytes


# -- bad input and missing isolation: a clear outcome, never a silent run ---------------------------


def test_a_read_only_path_that_does_not_exist_is_refused() -> None:
    result = run_sandboxed("print(1)", LIMITS, SandboxPolicy(read_only=(("/no/such/dataset", "/data"),)))
    assert result.outcome is Outcome.ERROR and result.stdout == ""
    assert result.error is not None and "/no/such/dataset does not exist" in result.error
    reserved = run_sandboxed("print(1)", LIMITS, SandboxPolicy(read_only=(("/usr/share", "/proc"),)))
    assert reserved.outcome is Outcome.ERROR and "/proc" in str(reserved.error)
    outside = run_sandboxed("print(1)", LIMITS, SandboxPolicy(read_only=(("/usr/share", "/../../tmp/x"),)))
    assert outside.outcome is Outcome.ERROR and "/../../tmp/x" in str(outside.error)


def test_a_killed_process_s_sandbox_directories_are_swept_and_live_ones_kept() -> None:
    import signal
    import subprocess
    import sys

    from verifiers.sandbox import sweep_orphans

    code = (
        "import os, signal\n"
        "from verifiers.sandbox import Sandbox\n"
        "box = Sandbox.create(persistent=True, work_mb=8)\n"
        "(box.work / 'kept.txt').write_text('x')\n"
        "print(box.host_dir, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    orphan = Path(proc.stdout.strip())
    assert (orphan / "work" / "kept.txt").exists()  # the kill left it
    with Sandbox.create(persistent=True, work_mb=8) as live:
        removed = sweep_orphans()
        assert orphan in removed and not orphan.exists()
        assert live.host_dir not in removed and live.host_dir.exists()


@isolated
def test_proc_entries_that_describe_the_host_are_masked() -> None:
    names = ("cmdline", "sys/kernel/random/boot_id", "loadavg", "uptime")
    program = "for n in " + repr(names) + ":\n    print(n, repr(open('/proc/' + n).read()))"
    result = run_sandboxed(program, PATIENT)
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.splitlines() == [f"{n} ''" for n in names]
    assert Path("/proc/cmdline").read_text()  # the host's own are untouched


@isolated
def test_a_sparse_file_is_not_archived_past_the_environment_size() -> None:
    """A sparse file of 0 bytes on the environment's tmpfs became 256 MiB of archive in host memory."""
    box = Sandbox.create(work_mb=8)
    try:
        big_files = SandboxLimits(file_mb=512)  # an environment's tool that may write large files
        made = box.exec("f = open('/work/holes', 'wb'); f.truncate(256 << 20); f.close()", limits=big_files)
        assert made.outcome is Outcome.OK, made.stderr
        with pytest.raises(ValueError, match="256 MB of data, more than the environment's 8 MB"):
            box.save_work()
        box.exec("import os; os.remove('/work/holes'); open('/work/small', 'w').write('kept')")
        assert len(box.save_work()) < 64 << 10
    finally:
        box.destroy()
