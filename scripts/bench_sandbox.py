"""The sandbox's start-up overhead and timeout-to-exit latency, against today's, bwrap and a bare start.

    .venv/bin/python scripts/bench_sandbox.py [--runs 30] [--timeout 0.2] [--json OUT]

Start-up: `--runs` runs of a program that does nothing (`pass`), from the call to the result. The
bound is a bare start of the same interpreter with the same flags (`python -I -S -B`, through
`subprocess.run`); each sandbox's figure is its overhead over that bound, p50 and p99, measured in
the same run. Every peer runs `-I -S -B`: with `site` on, ours would do less work than the bare
start, since it masks the base interpreter's site-packages. Two more rows show the code verifier's
own way (`run_sandboxed`, `-I -B`) against a bare `-I -B`. Peers:
- `rlsched`: verifiers/sandbox.py (a minimal root, five namespaces, memory and pids cgroups, a uid
  of its own, the report pipe);
- `before`: the sandbox this one replaced (commit 20832d7: PID, net and mount namespaces through
  `unshare`, the host's whole filesystem visible, the shared `nobody` uid), loaded from git;
- `bwrap`: bubblewrap 0.8 (`apt-get install bubblewrap`) giving the same root, with
  `--unshare-all --die-with-parent` and a uid inside a user namespace, and `bwrap+cgroups`: the
  same after a shell has joined memory and pids cgroups made for the run. As root, bwrap's `--uid`
  maps to root outside, so no bwrap row has a uid of its own.

Kill latency: three hostile programs (an infinite loop, a double-forked setsid daemon, a 64-process
fork tree), each `--runs` times with a `--timeout` limit: from the kill to the exit observed and no
process of the run left (rlsched: its cgroups; before: its PID namespace; bwrap: a marker in the
command lines). The peer `subprocess.run(timeout=...)`, what most RL reward code uses, is timed
from its deadline to its return, with the processes it leaves alive counted (then killed).
Writes bench_results/bench_sandbox.json.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from _bench import parser, write
from rich.console import Console
from rich.table import Table

from verifiers.cgroups import RunGroups
from verifiers.sandbox import (
    INSIDE_PYTHON,
    PREFIX,
    PYTHON,
    Sandbox,
    SandboxLimits,
    capabilities,
    run_sandboxed,
)

BEFORE = "20832d7"  # the last commit with the previous sandbox
FLAGS = ["-I", "-S", "-B"]
PROGRAMS = {
    "infinite loop": "while True: pass",
    "setsid daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)\n    os._exit(0)\ntime.sleep(600)"
    ),
    # a bounded fork tree (64 processes): a real bomb would take the machine down under the peer
    "fork tree": "import os, time\nfor _ in range(6):\n    os.fork()\ntime.sleep(600)",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(seconds: list[float], bound: float | None = None) -> dict[str, float]:
    p50, p99 = 1000 * statistics.median(seconds), 1000 * percentile(seconds, 0.99)
    found = {"p50_ms": p50, "p99_ms": p99}
    if bound is not None:
        found |= {"overhead_p50_ms": p50 - bound, "ratio_p50": p50 / bound}
    return found


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm: first-use costs (page cache, the capability probe) are not start-up
    found = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        found.append(time.perf_counter() - start)
    return found


def load_before() -> ModuleType | None:
    """The previous sandbox, from git (None outside a clone that has the commit)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{BEFORE}:verifiers/sandbox.py"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "sandbox_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sandbox_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    # the same interpreter flags as every other peer (it ran `-I -B`)
    flags = '[python, "-I", "-B", "main.py"]'
    if flags not in module._LAUNCHER:
        raise RuntimeError(f"the sandbox at {BEFORE} no longer starts its program with {flags}: update this")
    module._LAUNCHER = module._LAUNCHER.replace(flags, '[python, "-I", "-S", "-B", "main.py"]')
    return module


def bwrap_command(program_file: str, marker: str) -> list[str]:
    root = [
        "--ro-bind",
        "/usr",
        "/usr",
        "--tmpfs",
        "/usr/local",
        "--ro-bind",
        PREFIX,
        "/python",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/work",
        "--dir",
        "/etc",
        "--ro-bind",
        program_file,
        "/.program/main.py",
        "--chdir",
        "/work",
    ]
    for name in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{name}"):
            root += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    inside = "/python/" + os.path.relpath(PYTHON, PREFIX)
    return [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--uid",
        "200000",
        "--gid",
        "200000",
        "--clearenv",
        "--setenv",
        "LD_LIBRARY_PATH",
        "/python/lib",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        *root,
        inside,
        "-I",
        "-B",
        "/.program/main.py",
        marker,
    ]


def run_bwrap(program: str, timeout: float | None, cgroups: bool) -> float:
    """One bwrap run; with a timeout, the kill latency (to no marked process left), else 0."""
    marker = f"rlsched-bench-{uuid.uuid4().hex}"
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(program)
        f.flush()
        os.chmod(f.name, 0o644)
        command = bwrap_command(f.name, marker)
        groups = None
        if cgroups:
            groups = RunGroups(capabilities().controllers, f"bench-{marker}")
            groups.create(512, 64)
            joins = "; ".join(f"echo $$ > {p}" for p in groups.procs_files)
            command = ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh", *command]
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        latency = 0.0
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            killed = time.perf_counter()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            while marked(marker):
                time.sleep(0.0005)
            latency = time.perf_counter() - killed
        if groups is not None:
            groups.remove()
        return latency


def marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in "ZX":
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def plain_subprocess(program: str, timeout: float) -> tuple[float, int]:
    marker = f"rlsched-bench-{uuid.uuid4().hex}"
    called = time.monotonic()
    latency = 0.0
    try:
        subprocess.run([sys.executable, "-c", program, marker], timeout=timeout, capture_output=True)
    except subprocess.TimeoutExpired:  # run() killed its child and waited: from the deadline to here
        latency = time.monotonic() - (called + timeout)
    survivors = marked(marker)
    for pid in survivors:  # clean up what the peer left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return latency, len(survivors)


def startup(runs: int, before: ModuleType | None, bwrap: bool) -> dict[str, dict[str, float]]:
    """Every peer runs `python -I -S -B` on `pass`: the same interpreter work inside and out (with
    `site` on, our sandbox would win by masking the base interpreter's site-packages)."""
    with tempfile.TemporaryDirectory() as scratch:
        main = Path(scratch) / "main.py"
        main.write_text("pass")
        bare = timed(lambda: subprocess.run([PYTHON, *FLAGS, str(main)], check=True), runs)
        bare_site = timed(lambda: subprocess.run([PYTHON, "-I", "-B", str(main)], check=True), runs)
    bound = 1000 * statistics.median(bare)
    found = {"bare python -I -S -B": summary(bare, bound)}
    found["rlsched"] = summary(timed(lambda: one_shot([INSIDE_PYTHON, *FLAGS, "-c", "pass"]), runs), bound)
    if before is not None:
        found["before"] = summary(timed(lambda: before.run_sandboxed("pass"), runs), bound)
    if bwrap:
        found["bwrap"] = summary(timed(lambda: run_bwrap("pass", None, False), runs), bound)
        found["bwrap+cgroups"] = summary(timed(lambda: run_bwrap("pass", None, True), runs), bound)
    # as the code verifier runs a program (`-I -B`, site on): against the bare start with site on
    site_bound = 1000 * statistics.median(bare_site)
    found["bare python -I -B (site)"] = summary(bare_site, site_bound)
    found["rlsched run_sandboxed (site)"] = summary(timed(lambda: run_sandboxed("pass"), runs), site_bound)
    return found


def one_shot(argv: list[str]) -> None:
    with Sandbox.create(persistent=False) as box:
        box.exec(argv=argv)


def kill_latency(runs: int, timeout: float, before: ModuleType | None, bwrap: bool) -> dict[str, Any]:
    found: dict[str, Any] = {}
    limits = SandboxLimits(timeout_s=timeout, processes=128)  # room for the 64-process tree
    for name, program in PROGRAMS.items():
        rows: dict[str, Any] = {}
        ours = [run_sandboxed(program, limits) for _ in range(runs)]
        rows["rlsched"] = summary([r.kill_latency_s or 0.0 for r in ours]) | {
            "left_alive": sum(len(r.leftover_pids) for r in ours)
        }
        if before is not None:
            old = [
                before.run_sandboxed(program, before.SandboxLimits(timeout_s=timeout, processes=128))
                for _ in range(runs)
            ]
            rows["before"] = summary([r.kill_latency_s or 0.0 for r in old]) | {
                "left_alive": sum(len(r.leftover_pids) for r in old)
            }
        if bwrap:
            rows["bwrap"] = summary([run_bwrap(program, timeout, False) for _ in range(runs)]) | {
                "left_alive": 0
            }
        peer = [plain_subprocess(program, timeout) for _ in range(runs)]
        rows["subprocess.run"] = summary([p[0] for p in peer]) | {"left_alive": sum(p[1] for p in peer)}
        found[name] = rows
    return found


def main() -> None:
    ap = parser(__doc__, "bench_sandbox")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=0.2)
    args = ap.parse_args()
    console = Console(width=120)
    missing = capabilities().missing()
    if missing:
        console.print(f"this machine lacks: {'; '.join(missing)}; the figures are of a weaker sandbox")
    before = load_before()
    bwrap = shutil.which("bwrap") is not None and os.geteuid() == 0
    if before is None:
        console.print(f"no git history with {BEFORE}: the 'before' rows are left out")
    if not bwrap:
        console.print("bwrap is not installed (apt-get install bubblewrap): its rows are left out")
    console.print("start-up ...", highlight=False)
    starts = startup(args.runs, before, bwrap)
    console.print("kill latency ...", highlight=False)
    kills = kill_latency(args.runs, args.timeout, before, bwrap)
    table = Table(
        title=f"sandbox start-up and timeout -> exit, {args.runs} runs each (timeout {args.timeout} s)"
    )
    for col in ("measure", "peer", "p50", "p99", "over bare p50 / left alive"):
        table.add_column(col, justify="left" if col in ("measure", "peer") else "right")
    for peer, r in starts.items():
        table.add_row(
            "start-up",
            peer,
            f"{r['p50_ms']:.1f} ms",
            f"{r['p99_ms']:.1f} ms",
            f"{r['overhead_p50_ms']:+.1f} ms",
        )
    for name, rows in kills.items():
        for peer, r in rows.items():
            table.add_row(
                f"kill: {name}", peer, f"{r['p50_ms']:.1f} ms", f"{r['p99_ms']:.1f} ms", str(r["left_alive"])
            )
    console.print(table)
    write(
        args.json,
        {
            "benchmark": "bench_sandbox",
            "workload": vars(args) | {"json": str(args.json), "programs": PROGRAMS, "seed": None},
            "missing_isolation": missing,
            "bound": "start-up: a bare `python -I -B main.py` of the same interpreter, same run; kill: "
            "subprocess.run(timeout=...) on the same programs",
            "goal": "start-up overhead <= 30 ms over the bound (p50); "
            "kill latency within 10 ms p50 / 20 ms p99",
            "startup": starts,
            "kill": kills,
        },
    )


if __name__ == "__main__":
    main()
