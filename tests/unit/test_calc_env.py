"""SPEC section 9's worked numbers (the seed chapter's environment models), through `rlsched calc env`."""

from __future__ import annotations

import json

import pytest

from rlsched.calc import run
from rlsched.cli import build_parser
from rlsched.errors import UserError

TASK = ("--rounds", "3", "--tool-s", "1", "--env-gib", "2", "--rate", "10")
CLUSTER = ("--cores", "48", "--slots", "320", "--memory-gib", "358", "--template-gib", "2")


def env(*argv: str) -> dict:  # type: ignore[type-arg]
    args = build_parser().parse_args(["calc", "env", *argv, "--json"])
    return json.loads(run(args.calc_name, args))


def test_three_rounds_at_ten_tasks_a_second_need_more_memory_than_the_cluster_has() -> None:
    load = env("load", *TASK, "--model-s", "9", *CLUSTER)
    assert load["calc"] == "env load" and load["task_s"] == 30
    assert (load["model_calls_per_s"], load["calls_in_flight"], load["cores_busy"]) == (30, 270, 30)
    assert (load["environments"], load["memory_gib"], load["gib_s_per_task"], load["cpu_s_per_task"]) == (
        300, 600, 60, 3,
    )  # fmt: skip
    u = load["utilisation"]
    assert u["cpu"] == 0.625 and round(u["slots"], 3) == 0.844 and round(u["memory"], 2) == 1.68
    assert load["binding"] == "memory" and load["max_environments"] == 178
    assert round(load["max_rate"], 1) == 5.9


def test_slower_model_calls_hold_environments_longer() -> None:
    slow = env("load", *TASK, "--model-s", "12", *CLUSTER)
    assert (slow["task_s"], slow["memory_gib"], slow["calls_in_flight"]) == (39, 780, 360)


def test_released_after_each_tool_call_on_demand_waits_and_just_in_time_does_not() -> None:
    base = (*TASK, "--model-s", "9", "--prepare-s", "2", "--prepare-cpu-s", "0.1")
    demand, jit = env("release", *base), env("release", *base, "--just-in-time")
    assert demand["task_s"] == 36 and jit["task_s"] == 30
    assert jit["gib_s_per_task"] == 18 and jit["memory_gib"] == 180 and jit["creations_per_s"] == 30
    assert jit["cores_busy"] == pytest.approx(33)


def test_pausing_two_gib_in_a_nine_second_gap_saves_nothing_and_half_a_gib_frees_six_seconds() -> None:
    big = env("pause", "--env-gib", "2", "--gap-s", "9", "--save-s-per-gib", "4", "--resume-s", "1")
    assert big["freed_s"] == 0 and big["gib_s_kept"] == big["gib_s_paused"] == 18
    small = env("pause", "--env-gib", "0.5", "--gap-s", "9", "--save-s-per-gib", "4", "--resume-s", "1")
    assert small["save_s"] == 2 and small["freed_s"] == 6
    priced = ("--price", "1", "--transition-cost", "2.5")
    assert env("pause", "--env-gib", "0.5", "--gap-s", "9", "--save-s-per-gib", "4", "--resume-s", "1",
               *priced)["pays"] is True  # fmt: skip
    assert big["pays"] is None


def test_prewarm_waits_and_what_a_right_prediction_holds_early() -> None:
    pre = env("prewarm", "--prepare-s", "2", "--hit-rate", "0.75", "--lead-s", "1,2,3", "--env-gib", "2")
    assert pre["expected_wait_s"] == [1.25, 0.5, 0.5] and pre["early_gib_s"] == [0, 0, 1.5]


def test_a_hundred_environments_from_one_template_by_how_pages_are_shared() -> None:
    t = env("template", "--environments", "100", "--template-mib", "2048", "--accessed-mib", "512",
            "--dirtied-mib", "128", "--overhead-mib", "4", "--hot-mib", "256", "--link-gbit", "25",
            "--install-gib", "0.5")  # fmt: skip
    got = [round(t[k]) for k in ("full_copy_gib", "on_demand_gib", "shared_gib", "shared_hot_gib")]
    assert got == [200, 50, 13, 38] and t["template_gib"] == 2
    assert round(t["install_s"], 2) == 0.86 and round(t["install_cached_s"], 2) == 0.17


def test_cost_per_success_counts_the_failed_attempts() -> None:
    c = env("cost", "--total", "1", "--attempts", "10", "--successes", "5", "--success-cost", "0.5")
    assert c["per_success"] == 0.2 and c["successes_only"] == 0.1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("pause", "--env-gib", "2", "--gap-s", "0", "--save-s-per-gib", "4", "--resume-s", "1"), "gap_s"),
        (("prewarm", "--prepare-s", "2", "--hit-rate", "1.5", "--lead-s", "1"), "hit_rate must be in"),
        (
            ("cost", "--total", "1", "--attempts", "2", "--successes", "3", "--success-cost", "1"),
            "cannot exceed",
        ),
    ],
)
def test_bad_input_is_refused_naming_it(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError, match=message):
        env(*argv)
