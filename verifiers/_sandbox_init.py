"""The sandbox's launcher: never imported, run as `rlsched-sandbox -I -S /dev/fd/N ORDERS_FD`.

`verifiers/sandbox.py` starts this file with the base interpreter, without site-packages (`-S`, so it
starts in a few milliseconds) and reads its orders, a marshalled dict, from a memfd. Nothing of the
host's paths or of this source appears on any command line the program can read in `/proc`.

Steps, as root:
1. wait until the host has moved it into the run's cgroups (memory, pids), so that everything
   forked below is charged to them;
2. unshare mount, PID, network, IPC and UTS namespaces and fork the namespace's init (PID 1);
3. init builds a minimal root on a tmpfs: `/usr` and the interpreter (at `/python`) bound read-only,
   the `/bin`, `/lib*` links, a small `/etc`, a `/dev` of null, zero, full, random and urandom (and
   the devices a verifier asked for, a GPU's), a
   private `/tmp`, `/dev/shm` and `/work`, any extra read-only paths it was given, and the program
   at `/.program/main.py`; remounts it read-only, `pivot_root`s into it, mounts a fresh `/proc`;
4. init forks the program: rlimits (CPU, address space unless turned off, file size, open files,
   processes),
   `setuid` to the run's own uid, `no_new_privs`, `execve`;
5. init drops to `nobody`, waits for the program, writes its status and resource use to the report
   pipe and exits; the kernel then kills whatever the program left in the namespace.

The report pipe, which the program cannot write to, carries `started`, then `done STATUS CPU RSS`,
or `error MESSAGE` when the sandbox itself failed. Without namespaces (an unprivileged host, policy
`best_effort`) steps 2 and 3 are skipped and the program runs in the host's work directory.
"""

from __future__ import annotations

import _signal  # not `signal`, which imports enum: this file starts in a few milliseconds
import ctypes
import fcntl
import marshal
import os
import resource
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
NOBODY = 65534
DEVICES = ("null", "zero", "full", "random", "urandom")
LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# files of /proc that describe the host rather than the run (as Docker masks them): its kernel command
# line, boot id, load, uptime, and the kernel's own tables
MASKED_PROC = (
    "cmdline",
    "sys/kernel/random/boot_id",
    "loadavg",
    "uptime",
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
)

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if x is None else x.encode() for x in (source, target, kind, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def bind_read_only(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def tmpfs(target: str, mb: int, mode: int, extra: int = 0) -> None:
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | extra, f"size={mb}m,mode={mode:o}")


def touch(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def build_root(o: dict[str, Any]) -> None:
    """Steps 3 (before pivot_root): the new root, assembled under o['root']."""
    root = o["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    tmpfs(root, 8, 0o755)
    for name in ("usr", "python", "proc", "dev", "tmp", "work", "etc", ".program"):
        os.mkdir(f"{root}/{name}", 0o755)
    for name in LINKS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif os.path.isdir(host):
            os.mkdir(f"{root}/{name}")
            bind_read_only(host, f"{root}/{name}")
    bind_read_only("/usr", f"{root}/usr")
    local = f"{root}/usr/local"
    if os.path.isdir(local):  # the host's own installs: not the program's runtime (read-only below)
        tmpfs(local, 1, 0o755)
    bind_read_only(o["python_prefix"], f"{root}/python")
    site = f"{root}/python/{o['site_packages']}"
    if os.path.isdir(site):  # the standard library only: the base interpreter's installs are masked
        tmpfs(site, 1, 0o755, MS_RDONLY)
    for host, inside in o["binds"]:
        target = root + inside
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
        else:
            touch(target)
        bind_read_only(host, target)
    if os.path.isdir(local):  # after the binds, which may lie below it (a CUDA toolkit)
        mount(None, local, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m")
    build_dev(f"{root}/dev", o["shm_mb"], o["devices"])
    build_etc(f"{root}/etc", o["uid"])
    tmpfs(f"{root}/tmp", o["tmp_mb"], 0o1777)
    if o["work"]:  # an episode's directory, kept by the host between executions
        mount(o["work"], f"{root}/work", None, MS_BIND)
        mount(None, f"{root}/work", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    else:
        tmpfs(f"{root}/work", o["work_mb"], 0o700)
        os.chown(f"{root}/work", o["uid"], o["uid"])
    if o["program"] is not None:
        with open(f"{root}/.program/main.py", "w") as f:
            f.write(o["program"])
        os.chmod(f"{root}/.program/main.py", 0o444)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=8m")


def build_dev(dev: str, shm_mb: int, extra: list[str]) -> None:
    """The run's `/dev`: the five harmless nodes, and the devices a verifier asked for (a GPU's)."""
    tmpfs(dev, 1, 0o755)
    for name in (*DEVICES, *extra):
        if os.path.exists(f"/dev/{name}"):
            touch(f"{dev}/{name}")
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    tmpfs(f"{dev}/shm", shm_mb, 0o1777, MS_NOEXEC)
    mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID, "size=1m")


def build_etc(etc: str, uid: int) -> None:
    files = {
        "passwd": f"root:x:0:0:root:/:/bin/false\nsandbox:x:{uid}:{uid}::/work:/bin/sh\n"
        f"nobody:x:{NOBODY}:{NOBODY}::/:/bin/false\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:{NOBODY}:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        "hostname": "sandbox\n",
    }
    for name, text in files.items():
        with open(f"{etc}/{name}", "w") as f:
            f.write(text)


def enter_root(o: dict[str, Any]) -> None:
    """pivot_root into the new root and detach the host's tree from this namespace."""
    os.chdir(o["root"])
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in MASKED_PROC:  # what describes the host, not the run: /dev/null over it
        if os.path.isfile(f"/proc/{name}"):
            mount("/dev/null", f"/proc/{name}", None, MS_BIND)
    check(libc.sethostname(b"sandbox", 7), "sethostname")


def become_program(o: dict[str, Any], errors: list[int]) -> None:
    """Step 4, in the program's process: fds, limits, identity, seccomp, then execve. `errors[0]`
    is the fd that carries an exec error back to init (moved to 5 here)."""
    channel = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in o["channel"] or ()]
    for fd, target in zip(channel, (3, 4), strict=False):  # the request and response pipes
        os.dup2(fd, target, inheritable=True)
    os.dup2(errors[0], 5, inheritable=False)
    errors[0] = 5
    for fd in (3, 4)[len(channel) :]:
        try:  # noqa: SIM105 (contextlib costs milliseconds to import)
            os.close(fd)
        except OSError:
            pass
    os.closerange(6, os.sysconf("SC_OPEN_MAX"))  # every other fd, whatever its number
    lim = o["limits"]
    mb = 1 << 20
    for what, value in (
        (resource.RLIMIT_CPU, lim["cpu_s"]),
        (resource.RLIMIT_AS, lim["address_space_mb"] * mb if lim["address_space_mb"] else -1),
        (resource.RLIMIT_FSIZE, lim["file_mb"] * mb),
        (resource.RLIMIT_NOFILE, lim["open_files"]),
        (resource.RLIMIT_NPROC, lim["processes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(what, (value, value))
    if o["uid"] is not None:
        os.setgroups([])
        os.setgid(o["uid"])
        os.setuid(o["uid"])
    check(
        libc.prctl(
            PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ),
        "no_new_privs",
    )
    if o["namespaces"]:
        install_seccomp(frozenset(o.get("allow", ())))
    os.chdir(o["cwd"])
    os.execve(o["argv"][0], o["argv"], o["env"])


# System calls the program is refused (EPERM): kernel keyrings, which outlive a run in the per-uid
# keyring and would carry a message to the next run of that uid, new namespaces (user namespaces
# would let it mount a read-only cgroup or proc of its own), io_uring, and netlink and vsock sockets
# (closer to Docker's default profile). clone3 is ENOSYS, so the C
# library falls back to clone, whose flags a filter can read; x32 and foreign-arch calls are ENOSYS.
SYSCALLS = {
    "x86_64": {
        "arch": 0xC000003E,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "setns": 308,
        "clone": 56,
        "clone3": 435,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "socket": 41,
        "socketpair": 53,
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "unshare": 97,
        "setns": 268,
        "clone": 220,
        "clone3": 435,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "socket": 198,
        "socketpair": 199,
    },
}
CLONE_NAMESPACES = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
# refused outright (EPERM); io_uring (a second system-call interface the filter cannot see into)
# unless the policy opens it (`SandboxPolicy.allow`)
REFUSED = ("add_key", "request_key", "keyctl", "unshare", "setns")
IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")
AF_NETLINK, AF_VSOCK = 16, 40  # socket families refused: the kernel's own interfaces, the hypervisor's
FAMILIES = {"netlink": AF_NETLINK, "vsock": AF_VSOCK}  # by the name a policy opens each with
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_ALLOW, RET_EPERM, RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38


def seccomp_program(
    n: dict[str, int], allow: frozenset[str] = frozenset()
) -> list[tuple[int, int, int, int]]:
    """The BPF filter: (code, jump if true, jump if false, k) per instruction; a string in the list
    below names the instruction after it, as a jump target. `allow`: the openings a policy asked
    for (`io_uring`, `netlink`, `vsock`), left out of the refusals."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    refused = REFUSED + (() if "io_uring" in allow else IO_URING)
    families = [family for name, family in FAMILIES.items() if name not in allow]
    code: list[tuple[int, str | None, str | None, int] | str] = [
        (ld, None, None, 4),  # seccomp_data.arch
        (jeq, None, "enosys", n["arch"]),
        (ld, None, None, 0),  # seccomp_data.nr
        (jge, "enosys", None, 0x40000000),  # the x32 ABI
        *((jeq, "eperm", None, n[name]) for name in refused),
        (jeq, "enosys", None, n["clone3"]),
        (jeq, "family", None, n["socket"]),
        (jeq, "family", None, n["socketpair"]),
        (jeq, None, "allow", n["clone"]),
        (ld, None, None, 16),  # the low word of args[0]: clone's flags
        (jset, "eperm", "allow", CLONE_NAMESPACES),
        "family",
        (ld, None, None, 16),  # the low word of args[0]: the socket's family
        *((jeq, "eperm", None, family) for family in families),
        (jeq, "allow", "allow", 0),  # the end of the family checks (every family left is allowed)
    ]
    labels: dict[str, int] = {}
    instructions: list[tuple[int, str | None, str | None, int]] = []
    for entry in code:
        if isinstance(entry, str):
            labels[entry] = len(instructions)
        else:
            instructions.append(entry)
    end = len(instructions)
    labels |= {"allow": end, "eperm": end + 1, "enosys": end + 2}
    out = [
        (c, labels[t] - i - 1 if t else 0, labels[f] - i - 1 if f else 0, k)
        for i, (c, t, f, k) in enumerate(instructions)
    ]
    return [*out, (ret, 0, 0, RET_ALLOW), (ret, 0, 0, RET_EPERM), (ret, 0, 0, RET_ENOSYS)]


def install_seccomp(allow: frozenset[str] = frozenset()) -> None:
    numbers = SYSCALLS.get(os.uname().machine)
    if numbers is None:
        raise SetupError(f"seccomp: no syscall table for {os.uname().machine}")

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    instructions = seccomp_program(numbers, allow)
    table = (Filter * len(instructions))(*(Filter(*i) for i in instructions))
    program = Program(len(instructions), table)
    check(
        libc.prctl(
            PR_SET_SECCOMP,
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.byref(program),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "seccomp",
    )


def run_program(o: dict[str, Any], report: int) -> None:
    """Fork the program, tell the host it started (or why not), wait, report, return."""
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    program = os.fork()
    if program == 0:
        os.close(errors_r)
        errors = [fcntl.fcntl(errors_w, fcntl.F_DUPFD_CLOEXEC, 100)]  # out of the way of fds 3 to 5
        try:
            become_program(o, errors)
        except BaseException as err:  # noqa: BLE001 (whatever stopped the exec is reported)
            os.write(errors[0], f"{o['argv'][0]}: {err}".encode()[:1000])
        os._exit(125)
    os.close(errors_w)
    for fd in o["channel"] or ():
        os.close(fd)
    failure = os.read(errors_r, 1000)  # empty once execve succeeded (the pipe closed on exec)
    os.close(errors_r)
    if os.geteuid() == 0 and o["namespaces"]:  # init cannot be signalled or traced by the program
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    if failure:
        os.write(report, b"error " + failure.replace(b"\n", b" ") + b"\n")
        os.waitpid(program, 0)
        return
    os.write(report, b"started\n")
    _, status, usage = os.wait4(program, 0)
    os.write(report, f"done {status} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}\n".encode())


def init(o: dict[str, Any], report: int) -> None:
    """Step 3 to 5, as PID 1 of the new namespace."""
    check(
        libc.prctl(
            PR_SET_PDEATHSIG,
            ctypes.c_ulong(_signal.SIGKILL),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "pdeathsig",
    )
    _signal.signal(_signal.SIGALRM, lambda *_: os._exit(137))  # the host vanished: end the run anyway
    _signal.alarm(o["backstop_s"])
    build_root(o)
    enter_root(o)
    run_program(o, report)


def main() -> None:
    os.close(int(sys.argv[0].rsplit("/", 1)[1]))  # this file, read already: /dev/fd/N
    orders_fd = int(sys.argv[1])
    os.lseek(orders_fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(orders_fd, 1 << 20):
        chunks.append(chunk)
    os.close(orders_fd)
    o = marshal.loads(b"".join(chunks))
    report = o["report_fd"]
    try:
        # the host moves this process into the run's cgroups while it starts (a cgroup v1 move
        # waits for an RCU grace period, ~10 ms), then says go; nothing is forked before that
        if os.read(o["go_fd"], 1) != b"1":
            raise SetupError("the host did not place the run in its cgroups")
        os.close(o["go_fd"])
        if not o["namespaces"]:
            run_program(o, report)
            return
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
        check(libc.unshare(flags), "unshare")
        pid = os.fork()
        if pid == 0:
            try:
                init(o, report)
            except BaseException as err:  # noqa: BLE001 (whatever stopped the setup is reported)
                os.write(report, f"error {err}".replace("\n", " ").encode()[:1000] + b"\n")
            os._exit(0)
        os.close(report)
        for fd in o["channel"] or ():
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) % 256)
    except (SetupError, OSError) as err:
        os.write(report, f"error {err}".replace("\n", " ").encode()[:1000] + b"\n")
        os._exit(125)


if __name__ == "__main__":
    main()
