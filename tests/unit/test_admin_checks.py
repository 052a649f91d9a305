"""`rlsched admin check`'s warnings: settings a valid admin file accepts that cannot do what they say."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlsched.admin import AdminConfig, load_admin, warnings

ROOT = Path(__file__).resolve().parents[2]
BASE = """
nodes: [{name: n, count: 2, resources: {H100: 8, CPU: 64}}]
priority_classes:
  online: {value: 1000, preemptible: false, max_wait_s: 2}
  batch: {value: 10, grace_s: 30}
cohorts: {research: {}}
queues:
  a: {cohort: research, nominal: {H100: 7, CPU: 64}, default_priority: batch}
  b: {cohort: research, nominal: {H100: 7, CPU: 56}, lending_limit: {H100: 2}, default_priority: batch}
  serving: {nominal: {H100: 1, CPU: 8}, default_priority: online}
reserve: {classes: [online], resources: {H100: 1}}
"""


def check(change: str = "") -> list[str]:
    tree = yaml.safe_load(BASE)
    for k, v in (yaml.safe_load(change) or {}).items():
        tree[k] = v if not isinstance(v, dict) else {**tree.get(k, {}), **v}
    return warnings(AdminConfig.model_validate(tree))


@pytest.mark.parametrize("path", sorted((ROOT / "configs/admin").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_admin_file_passes_without_warnings(path: Path) -> None:
    assert warnings(load_admin(path)) == []


def test_capacity_in_no_quota_is_named() -> None:
    assert check() == []
    (w,) = check("queues: {a: {cohort: research, nominal: {H100: 4, CPU: 60}}}")
    assert w.startswith("3 H100, 4 CPU of the cluster are in no queue's nominal quota nor the reserve")


def test_a_borrowing_limit_beyond_what_the_cohort_can_lend() -> None:
    (w,) = check("queues: {a: {cohort: research, nominal: {H100: 7, CPU: 64}, borrowing_limit: {H100: 4}}}")
    assert (
        "queues.a.borrowing_limit.H100 is 4, but the other queues of cohort research can lend at most 2" in w
    )
    assert "a can never use more than 9 H100" in w


def test_a_reserve_its_classes_queues_can_never_use() -> None:
    change = "queues: {a: {cohort: research, nominal: {H100: 8, CPU: 64}}, serving: {nominal: {CPU: 8}, "
    (w,) = check(change + "default_priority: online}}")
    assert (
        "reserve.resources.H100 holds 1 H100 for online, but none of the queues whose jobs default to " in w
    )
    assert "(serving) can ever get H100" in w
