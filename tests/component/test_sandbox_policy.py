"""The sandbox's policy against what the machine allows: `strict` refuses to run where namespaces or
cgroups are missing, naming what is missing and the `best_effort` way out; `best_effort` runs there
with what it has, never writing through a link a program planted; the default is the strictest the
machine allows. The machine's real capabilities are replaced by what is missing
(`test_sandbox.py` runs the hostile programs under the real isolation).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.component.test_sandbox import LIMITS, MISSING, PATIENT
from verifiers.cgroups import find_controllers
from verifiers.sandbox import (
    Capabilities,
    Isolation,
    Outcome,
    Sandbox,
    SandboxLimits,
    SandboxPolicy,
    capabilities,
    run_sandboxed,
)


def _without(**missing: object) -> Capabilities:
    real = capabilities()
    return Capabilities(
        namespaces=missing.get("namespaces", real.namespaces),  # type: ignore[arg-type]
        per_run_uid=bool(missing.get("per_run_uid", real.per_run_uid)),
        controllers=missing.get("controllers", real.controllers),  # type: ignore[arg-type]
    )


def test_strict_refuses_without_namespaces_and_best_effort_names_them() -> None:
    # an unprivileged host: no namespaces, no uid of its own (as root with namespaces missing, the
    # interpreter under /root would be out of the sandbox uid's reach, and the run an error saying so)
    caps = _without(namespaces="unshare: Operation not permitted", per_run_uid=False)
    with Sandbox.create(SandboxPolicy(Isolation.STRICT), persistent=False, caps=caps) as box:
        refused = box.exec("print('ran')", limits=LIMITS)
    assert refused.outcome is Outcome.ERROR and refused.stdout == ""
    assert "namespaces (unshare: Operation not permitted)" in str(refused.error)
    assert "best_effort" in str(refused.error)
    with Sandbox.create(SandboxPolicy(Isolation.BEST_EFFORT), persistent=False, caps=caps) as box:
        ran = box.exec("print('ran')", limits=PATIENT)
    assert ran.outcome is Outcome.OK and ran.stdout == "ran\n"
    assert ran.isolation is Isolation.BEST_EFFORT and any("namespaces" in m for m in ran.missing)


def test_cgroups_unavailable_is_found_and_named(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    assert find_controllers(tmp_path) == {}  # a machine with no cgroup mounts
    (tmp_path / "mountinfo").write_text("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    hugetlb_only = find_controllers(tmp_path)  # cgroup2 mounted does not mean memory is on it
    assert "memory" not in hugetlb_only or hugetlb_only["memory"].version == 2
    caps = _without(controllers={})
    with Sandbox.create(SandboxPolicy(Isolation.STRICT), persistent=False, caps=caps) as box:
        refused = box.exec("print('ran')", limits=LIMITS)
    assert refused.outcome is Outcome.ERROR
    assert "cgroup memory controller" in str(refused.error) and "cgroup pids controller" in str(refused.error)
    with Sandbox.create(SandboxPolicy(Isolation.BEST_EFFORT), persistent=False, caps=caps) as box:
        ran = box.exec("print('ran')", limits=PATIENT)
    assert ran.outcome is Outcome.OK and ran.peak_memory_mb is None
    assert ran.missing == ["cgroup memory controller", "cgroup pids controller"] or not caps.per_run_uid


def test_the_default_policy_is_strict_where_the_machine_allows_it() -> None:
    box = Sandbox.create(persistent=False)
    try:
        assert box.isolation is (Isolation.BEST_EFFORT if MISSING else Isolation.STRICT)
    finally:
        box.destroy()


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        SandboxLimits(timeout_s=0)


def test_results_are_json() -> None:
    result = run_sandboxed("print(1)", PATIENT, SandboxPolicy(Isolation.BEST_EFFORT))
    assert json.loads(json.dumps(result.to_json()))["outcome"] == "ok"


def test_best_effort_without_namespaces_never_writes_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    caps = _without(namespaces="unshare: Operation not permitted", per_run_uid=False)
    with Sandbox.create(SandboxPolicy(Isolation.BEST_EFFORT), caps=caps) as box:
        planted = box.exec(f"import os\nos.symlink({str(victim)!r}, 'main.py')\nprint('planted')")
        again = box.exec("print('second run')")
    assert planted.stdout == "planted\n" and again.stdout == "second run\n"
    assert victim.read_text() == "untouched"
