"""The environment core under each placement policy, by hand and through the simulator, against
SPEC section 9's worked numbers (three rounds of a 9 s model call and a 1 s tool call, 2 GiB
environments prepared in 2 s)."""

from __future__ import annotations

import pytest

from rlsched.core import envs as ec
from rlsched.core.envs import EnvParams, EnvType
from rlsched.policy.environments import Capacity, EnvPolicy
from rlsched.policy.lifecycle import EnvState
from rlsched.sim.envs import EpisodeSpec, simulate_envs

ONE = {"tool": EnvType(memory_gib=2, prepare_s=2)}
TWO = {"calc": EnvType(2, 2), "lookup": EnvType(2, 2)}
UNBOUNDED = Capacity(cores=1e9, slots=1e9, memory_gib=1e9)
CLUSTER = Capacity(cores=48, slots=320, memory_gib=358, template_gib=2)


@pytest.mark.parametrize(
    ("policy", "task_s", "gib_s", "wait_s"),
    [(EnvPolicy.RESIDENT, 30, 60, 0), (EnvPolicy.REBUILD, 36, 18, 2), (EnvPolicy.PREWARM, 30, 18, 0)],
)
def test_one_episode_takes_the_chapters_time_and_memory(
    policy: EnvPolicy, task_s: float, gib_s: float, wait_s: float
) -> None:
    run = simulate_envs(EnvParams(policy, ONE, UNBOUNDED, lead_s=2), EpisodeSpec(), episodes=1, rate=0)
    assert (run.task_s, run.gib_s_per_task, run.wait_per_call_s) == (task_s, gib_s, wait_s)


@pytest.mark.parametrize(("lead", "wait"), [(1, 1.25), (2, 0.5), (3, 0.5)])
def test_prewarm_with_a_three_in_four_prediction_waits_as_the_formula_says(lead: float, wait: float) -> None:
    spec = EpisodeSpec(mix={"calc": 0.5, "lookup": 0.5})
    params = EnvParams(EnvPolicy.PREWARM, TWO, UNBOUNDED, lead_s=lead)
    run = simulate_envs(params, spec, episodes=2000, rate=0, hit_rate=0.75, seed=1)
    assert run.hit_rate == pytest.approx(0.75, abs=0.02)
    assert run.wait_per_call_s == pytest.approx(wait, abs=0.05)  # E[W] = P - h min(P, L)


def test_at_ten_tasks_a_second_memory_binds_resident_and_releasing_admits_them_all() -> None:
    runs = {
        p: simulate_envs(EnvParams(p, ONE, CLUSTER, lead_s=2, slots_per_episode=0.9), EpisodeSpec(), 3000, 10)
        for p in EnvPolicy
    }
    resident, rebuild, prewarm = runs[EnvPolicy.RESIDENT], runs[EnvPolicy.REBUILD], runs[EnvPolicy.PREWARM]
    assert resident.binding == "memory" and resident.peak_gib == 356
    assert resident.throughput == pytest.approx(178 / 30, rel=0.05)  # 5.9 tasks/s
    assert rebuild.binding == "slots" and rebuild.throughput == pytest.approx(320 / 0.9 / 36, rel=0.02)
    assert prewarm.binding is None and prewarm.throughput == pytest.approx(10)
    assert prewarm.mean_gib == pytest.approx(180, rel=0.01) and prewarm.run_s == 30


def test_a_wrong_prediction_is_cancelled_at_once_and_the_right_type_prepared_on_demand() -> None:
    core = ec.EnvCore(EnvParams(EnvPolicy.PREWARM, TWO, UNBOUNDED, lead_s=2))
    assert core.handle(ec.Arrived(0.0, "e", ("calc", "lookup"))) == [ec.Admit("e")]
    assert core.handle(ec.ModelCallStarted(0.0, "e", 9.0, "calc")) == []
    assert core.next_wakeup() == 7.0
    assert core.handle(ec.Tick(7.0)) == [ec.Prepare("env-1", "calc")]
    out = core.handle(ec.ToolCalled(9.0, "e", "lookup"))
    assert out == [ec.Cancel("env-1"), ec.Prepare("env-2", "lookup")]
    assert core.handle(ec.Prepared(9.0, "env-1")) == []  # the cancelled one's late report changes nothing
    assert core.handle(ec.Prepared(11.0, "env-2")) == [ec.RunTool("e", "env-2", 2.0)]
    assert core.handle(ec.ToolDone(12.0, "e")) == [ec.Release("env-2")]
    core.handle(ec.Ended(12.0, "e"))
    assert core.envs == {} and core.memory.held_gib() == 0  # nothing outlives the episode
    assert core.memory.gib_s == pytest.approx(2 * 2 + 2 * 3)  # calc held 7-9 s, lookup 9-12 s


def test_an_episode_that_does_not_fit_waits_with_the_binding_resource_named() -> None:
    small = Capacity(cores=8, slots=8, memory_gib=5, template_gib=1)
    core = ec.EnvCore(EnvParams(EnvPolicy.RESIDENT, ONE, small))
    core.handle(ec.Arrived(0.0, "a", ("tool",)))
    core.handle(ec.Arrived(0.0, "b", ("tool",)))
    out = core.handle(ec.Arrived(0.0, "c", ("tool",)))
    assert out == [ec.Pend("c", "memory", "GiB of environment memory: 4 of 4 reserved, the episode needs 2")]
    core.handle(ec.Prepared(2.0, "env-1"))
    out = core.handle(ec.Ended(30.0, "a"))
    assert ec.Release("env-1") in out and ec.Admit("c") in out


def test_a_preparation_whose_memory_does_not_fit_waits_for_memory() -> None:
    small = Capacity(cores=8, slots=8, memory_gib=3)
    core = ec.EnvCore(EnvParams(EnvPolicy.REBUILD, ONE, small))
    for name in ("a", "b"):
        core.handle(ec.Arrived(0.0, name, ("tool",)))
    assert core.handle(ec.ToolCalled(9.0, "a", "tool")) == [ec.Prepare("env-1", "tool")]
    assert core.handle(ec.ToolCalled(9.0, "b", "tool")) == []  # 2 + 2 GiB > 3: it waits
    core.handle(ec.Prepared(11.0, "env-1"))
    assert core.handle(ec.ToolDone(12.0, "a")) == [ec.Release("env-1"), ec.Prepare("env-2", "tool")]
    assert core.handle(ec.Prepared(14.0, "env-2")) == [ec.RunTool("b", "env-2", 5.0)]


HALF = {"tool": EnvType(memory_gib=0.5, prepare_s=2)}


@pytest.mark.parametrize(
    ("types", "pause", "gib_s", "pauses"),
    [
        (HALF, None, 15.0, 0),  # resident, kept over both 9 s turns after a call
        (HALF, ec.PauseParams(save_s_per_gib=4, resume_s=1), 9.0, 2),  # 6 s freed in each: 15 - 2 x 3
        (ONE, ec.PauseParams(save_s_per_gib=4, resume_s=1), 60.0, 0),  # 8 s + 1 s in a 9 s gap: no gain
        (ONE, ec.PauseParams(save_s_per_gib=4, resume_s=1, always=True), 60.0, 2),  # 18 GiB-s either way
    ],
)
def test_pausing_an_idle_environment_frees_what_the_chapter_says(
    types: dict[str, EnvType], pause: ec.PauseParams | None, gib_s: float, pauses: int
) -> None:
    params = EnvParams(EnvPolicy.RESIDENT, types, UNBOUNDED, pause=pause)
    run = simulate_envs(params, EpisodeSpec(), episodes=1, rate=0)
    assert (run.task_s, run.gib_s_per_task, run.pauses, run.wait_per_call_s) == (30, gib_s, pauses, 0)


@pytest.mark.parametrize(("cost", "pauses"), [(10.0, 0), (2.0, 2)])
def test_pause_is_chosen_when_price_times_memory_times_freed_time_beats_the_transition(
    cost: float, pauses: int
) -> None:
    pause = ec.PauseParams(save_s_per_gib=4, resume_s=1, price_per_gib_s=1.0, transition_cost=cost)
    run = simulate_envs(EnvParams(EnvPolicy.RESIDENT, HALF, UNBOUNDED, pause=pause), EpisodeSpec(), 1, 0)
    assert run.pauses == pauses  # 1 x 0.5 GiB x 6 s = 3 against the cost of saving and restoring


def test_a_call_that_comes_before_its_environment_is_restored_waits_for_it() -> None:
    core = ec.EnvCore(EnvParams(EnvPolicy.RESIDENT, HALF, UNBOUNDED, pause=ec.PauseParams(4, 1)))
    core.handle(ec.Arrived(0, "e", ("tool",)))  # admitted and prepared at once (resident)
    core.handle(ec.ModelCallStarted(0, "e", 9, "tool"))
    env = next(iter(core.envs))
    core.handle(ec.Prepared(2, env))
    core.handle(ec.ToolCalled(9, "e", "tool"))
    core.handle(ec.ToolDone(10, "e"))
    assert [type(x) for x in core.handle(ec.ModelCallStarted(10, "e", 19, "tool"))] == [ec.Pause]
    core.handle(ec.Paused(12, env))
    assert core.memory.held_gib() == 0
    # the model answered at 14, not 19: the resumption starts now, and the call waits for it
    assert [type(x) for x in core.handle(ec.ToolCalled(14, "e", "tool"))] == [ec.Resume]
    (run,) = core.handle(ec.Resumed(15, env))
    assert isinstance(run, ec.RunTool) and run.waited_s == 1


def test_an_episode_that_ends_while_its_preparation_waits_for_memory_leaves_no_trace() -> None:
    core = ec.EnvCore(EnvParams(EnvPolicy.REBUILD, ONE, Capacity(cores=8, slots=8, memory_gib=2)))
    for name in ("a", "b"):
        core.handle(ec.Arrived(0, name, ("tool",)))
    assert [type(x) for x in core.handle(ec.ToolCalled(1, "a", "tool"))] == [ec.Prepare]
    assert core.handle(ec.ToolCalled(1, "b", "tool")) == []  # 2 GiB held by a's: b's waits for memory
    core.handle(ec.Ended(2, "b"))  # a limit ends b before its environment could be prepared
    env = next(iter(core.envs))
    core.handle(ec.Prepared(3, env))
    assert [type(x) for x in core.handle(ec.ToolDone(4, "a"))] == [ec.Release]  # and nothing for b
    assert core.envs == {} and core.memory.held_gib() == 0


def test_a_turn_s_calls_to_two_kinds_run_at_once_each_in_its_own_environment() -> None:
    core = ec.EnvCore(EnvParams(EnvPolicy.RESIDENT, TWO, UNBOUNDED))
    assert core.handle(ec.Arrived(0.0, "e", ("calc", "lookup"))) == [
        ec.Prepare("env-1", "calc"),
        ec.Prepare("env-2", "lookup"),
        ec.Admit("e"),
    ]
    core.handle(ec.Prepared(2.0, "env-1"))
    core.handle(ec.Prepared(2.0, "env-2"))
    assert core.handle(ec.ToolCalled(9.0, "e", "calc")) == [ec.RunTool("e", "env-1", 0.0)]
    assert core.handle(ec.ToolCalled(9.0, "e", "lookup")) == [ec.RunTool("e", "env-2", 0.0)]  # at once
    with pytest.raises(ValueError, match="runs one call at a time"):
        core.handle(ec.ToolCalled(9.0, "e", "calc"))  # its environment still runs the first
    assert core.handle(ec.ToolDone(9.5, "e", "lookup")) == []
    assert core.envs["env-1"].state is EnvState.BUSY and core.envs["env-2"].state is EnvState.IDLE
    assert core.handle(ec.ToolDone(10.0, "e", "calc")) == []
    assert core.handle(ec.ToolCalled(10.0, "e", "calc")) == [ec.RunTool("e", "env-1", 0.0)]  # then the next

    rebuild = ec.EnvCore(EnvParams(EnvPolicy.REBUILD, TWO, UNBOUNDED))
    rebuild.handle(ec.Arrived(0.0, "e", ("calc", "lookup")))
    assert rebuild.handle(ec.ToolCalled(9.0, "e", "calc")) == [ec.Prepare("env-1", "calc")]
    assert rebuild.handle(ec.ToolCalled(9.0, "e", "lookup")) == [ec.Prepare("env-2", "lookup")]
    assert rebuild.handle(ec.Prepared(11.0, "env-2")) == [ec.RunTool("e", "env-2", 2.0)]
    assert rebuild.handle(ec.Prepared(11.0, "env-1")) == [ec.RunTool("e", "env-1", 2.0)]
    assert rebuild.handle(ec.ToolDone(12.0, "e", "calc")) == [ec.Release("env-1")]  # lookup runs on
    assert rebuild.handle(ec.ToolDone(12.5, "e", "lookup")) == [ec.Release("env-2")]

    prewarm = ec.EnvCore(EnvParams(EnvPolicy.PREWARM, TWO, UNBOUNDED))
    prewarm.handle(ec.Arrived(0.0, "e", ("calc", "lookup")))
    prewarm.handle(ec.ToolCalled(9.0, "e", "calc"))
    out = prewarm.handle(ec.ToolCalled(9.0, "e", "lookup"))  # not a wrong prediction: calc stays
    assert out == [ec.Prepare("env-2", "lookup")] and prewarm.counts.misses == 0
