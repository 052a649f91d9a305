"""The cluster side of the CLI: `rlsched admin check` (every problem at once, the warnings, what the
file means) and `rlsched simulate` on cluster scenarios (variants, job logs, and every shipped
scenario with `--out`). In this process, as `tests/e2e/test_cli.py` runs the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_cli import ROOT, assert_user_error, rlsched


def test_admin_check_says_what_the_file_means() -> None:
    proc = rlsched("admin", "check", "configs/admin/example.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "example.yaml: valid.\n" in proc.stdout and "warning" not in proc.stdout
    assert "online (1000): never preempted; admitted within 2 s; walltime 86400 s" in proc.stdout
    assert "Reserve: 1 H100, 8 CPU kept for online" in proc.stdout
    assert (
        "Requeue (supervised jobs): preempted, back in the queue at once; failed, after 30 s, doubling to at "
        "most 1800 s; 5 failures are requeued, the next one parks the job." in proc.stdout
    )


ADMIN_BASE = """
nodes: [{name: n, count: 2, resources: {H100: 8, CPU: 64}}]
priority_classes:
  online: {value: 1000, preemptible: false, max_wait_s: 2}
  batch: {value: 10, grace_s: 30}
cohorts: {research: {}}
queues:
  a: {cohort: research, nominal: {H100: 4}}
reserve: {classes: [online], resources: {H100: 1}}
"""


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (
            "queues:\n  a: {nominal: {H100: 32}}\n",
            ["queues.a.nominal.H100 is 32 but the cluster has 16 H100"],
        ),
        (
            "queues:\n  a: {nominal: {H100: 10}}\n  b: {nominal: {H100: 10}}\n",
            ["the nominal quotas promise 20 H100 (plus 1 reserved) but the cluster has 16"],
        ),
        (
            "cohorts: {research: {parent: x}, x: {parent: research}}\n",
            ["cohorts form a cycle: research -> x -> research"],
        ),
        (
            "queues:\n  a: {nominal: {H100: 4}, default_priority: urgent}\n",
            ["queues.a.default_priority 'urgent' is not a defined priority class (batch, online)"],
        ),
        (  # every problem at once
            "queues:\n  a: {cohort: nope, nominal: {H100: 32}, default_priority: urgent}\n",
            [
                "has 4 problem(s):",
                "queues.a.cohort 'nope' is not defined in cohorts (research)",
                "queues.a.default_priority 'urgent' is not a defined priority class",
                "queues.a.nominal.H100 is 32 but the cluster has 16 H100",
                "the nominal quotas promise 32 H100 (plus 1 reserved)",
            ],
        ),
        (
            "reserve: null\n",
            [
                "priority_classes.online may wait at most 2 s",
                "needs up to 30 s to save (class batch)",
                "reserve.classes",
            ],
        ),
    ],
)
def test_admin_check_bad_files(tmp_path: Path, change: str, needles: list[str]) -> None:
    import yaml

    tree = yaml.safe_load(ADMIN_BASE)
    tree.update(yaml.safe_load(change))
    path = tmp_path / "admin.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert_user_error(rlsched("admin", "check", str(path)), *needles)


def test_simulate_a_cluster_scenario_compares_its_variants() -> None:
    proc = rlsched(
        "simulate", "configs/scenarios/cluster.yaml", "--set", "hours=4", "--set", "seeds=1", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    results = summary["results"]
    assert list(results)[:2] == ["gangs only", "gangs + borrowers (drf)"]
    alone, shared = results["gangs only"], results["gangs + borrowers (drf)"]
    assert shared["allocation"] > alone["allocation"] and alone["unfinished"] == 0
    # a borrower evicted for a gang ends, as on the runtime (requeueing is the durability work's)
    assert 0 < shared["unfinished"] <= shared["preemptions"]
    assert summary["max_wait_s"]["training"] == 43200 and "batch_wait_mean_s" not in alone
    assert all(0.0 <= x <= 1.0 + 1e-9 for x in shared["allocation_series"])
    table = rlsched("simulate", "configs/scenarios/cluster.yaml", "--set", "hours=2", "--set", "seeds=1")
    assert "training wait mean / max (bound)" in table.stdout and "allocated % over time" in table.stdout


def test_simulate_a_cluster_scenario_from_a_job_log(tmp_path: Path) -> None:
    log = tmp_path / "jobs.csv"
    log.write_text(
        "submit_s,duration_s,devices,queue,priority,elastic\n"
        "0,3600,64,team-a,training,0\n10,600,8,spot,batch,2\n20,1800,128,team-b,training,0\n"
    )
    scenario = tmp_path / "log.yaml"
    scenario.write_text(
        f"kind: cluster\nadmin: {ROOT / 'configs/admin/gpu_farm.yaml'}\ntrace: jobs.csv\nseeds: 1\n"
    )
    proc = rlsched("simulate", str(scenario), "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)["results"]["as configured"]
    assert r["unfinished"] == 0 and r["training_wait_max_s"] >= 3600 - 20  # the 128-GPU job waits for the 64
    log.write_text(
        "submit_s,duration_s,devices,queue,priority\n0,60,8,team-a,training\n5,60,8,team-c,trainnig\n"
    )
    assert_user_error(rlsched("simulate", str(scenario)), "jobs.csv, line 3: queue 'team-c' is not one of")
    log.write_text("when,how_long\n1,2\n")
    assert_user_error(rlsched("simulate", str(scenario)), "cannot read the job log", "submit_s,duration_s")
    overlay = "variants: [{name: v, admin: {queues: {team-a: {nominal: {GPU: -1}}}}}]\n"
    scenario.write_text(scenario.read_text().replace("seeds: 1\n", "seeds: 1\n" + overlay))
    assert_user_error(
        rlsched("simulate", str(scenario)), "variant's overlay", "queues.team-a", "non-negative"
    )
    scenario.write_text("kind: cluster\nadmin: ../nope.yaml\nstreams: []\n")
    assert_user_error(rlsched("simulate", str(scenario)), "give streams")


# every shipped scenario, shortened, with --out: what each writes, and a picture that opens
SHORT = {"cluster": ["--set", "hours=3"], "head_of_line": ["--set", "hours=6"]}


@pytest.mark.parametrize(
    "scenario", sorted((ROOT / "configs/scenarios").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_shipped_scenario_writes_its_outputs(scenario: Path, tmp_path: Path) -> None:
    import matplotlib.image

    cluster = "\nkind: cluster" in "\n" + scenario.read_text()
    short = SHORT.get(scenario.stem, []) if cluster else ["--set", "jobs.0.iterations=2"]
    proc = rlsched("simulate", str(scenario), "--seeds", "1", *short, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    pictures = sorted(tmp_path.glob("*.png"))
    assert (tmp_path / ("cluster.json" if cluster else "simulate.json")).is_file() and pictures
    for png in pictures:
        height, width = matplotlib.image.imread(png).shape[:2]
        assert height > 300 and width > 600, png
    if cluster:
        variants = json.loads((tmp_path / "cluster.json").read_text())["results"]
        assert len(pictures) == len(variants)
