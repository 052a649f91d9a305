"""Multi-turn episodes with a real model and real sandboxed tools (`rlsched.rl.agent`).

A tiny Llama with SmolLM2-135M-Instruct's tokenizer, shown the shipped tools template, that has learned
four teacher episodes by heart: three calculator episodes (`rlsched.rl.tool_warmup`) and one whose
reply is a call that does not parse (the `tool_model` of tests/agent_model.py, built once per checkout
and shared with the job test). Greedy episodes then call the real calculator in a sandbox and answer;
a calculator that hangs is stopped at its timeout and the model reads an error; the broken call is
answered with an error observation; limits end episodes with typed reasons; an environment that cannot
be prepared is retried and then a fault, never a zero reward; and nothing of any environment is left
afterwards.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import queue
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from environments.sandboxed import SandboxedTools
from rlsched.config_agent import AgentConfig
from rlsched.engine.protocol import SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint
from rlsched.policy.retry import RetryPolicy
from rlsched.rl import agent as ag
from rlsched.rl import episode_runs as er
from rlsched.rl.episode_server import EpisodeServer
from rlsched.rl.episodes import episode_batch
from rlsched.rl.task import JsonlProblem
from rlsched.serve.episodes import EndReason, Episode, training_sequence
from rlsched.serve.tools import ParsedCall
from rlsched.store.round_journal import RoundJournal
from tests.agent_model import CALCULATOR, TEMPLATE, agent_cfg, broken_problem, teacher_problems

pytestmark = pytest.mark.slow

BROKEN = broken_problem()


class Model:
    def __init__(self, tokenizer: Any, model: Any, problems: list[JsonlProblem]) -> None:
        self.tokenizer, self.model, self.problems = tokenizer, model, problems

    def rollout(
        self, cfg: AgentConfig, max_tokens: int = 48, retries: int = 2, journal: RoundJournal | None = None
    ) -> ag.AgentRollout:
        engine = TorchRolloutEngine(copy.deepcopy(self.model), self.tokenizer, prefix_cache_blocks=64)
        end = self.tokenizer.id_of("<|im_end|>")
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=(end,))
        make = ag.environment_factory(cfg)
        limits = ag.AgentLimits.of(cfg)
        return ag.AgentRollout(
            engine,
            self.tokenizer,
            make,
            params,
            limits,
            RetryPolicy(retries),
            policy=cfg.policy,
            journal=journal,
        )


@pytest.fixture(scope="module")
def trained(tool_model: Path) -> Model:
    ckpt = load_checkpoint(tool_model, dtype=torch.float32)
    ckpt.tokenizer.hf.chat_template = TEMPLATE.read_text()
    return Model(ckpt.tokenizer, ckpt.model.eval(), teacher_problems())


@pytest.fixture(autouse=True)
def nothing_outlives() -> Iterator[None]:
    """Every test leaves no sandbox directory behind (its environments were all destroyed)."""
    before = set(Path(tempfile.gettempdir()).glob("rlsched-sandbox-*"))
    yield
    assert set(Path(tempfile.gettempdir()).glob("rlsched-sandbox-*")) <= before


def test_an_episode_calls_the_tool_reads_its_result_and_answers(trained: Model) -> None:
    rollout = trained.rollout(agent_cfg())
    runs = rollout.run(trained.problems, 1, "t")
    for run, problem in zip(runs, trained.problems, strict=True):
        assert run.episode.ended is EndReason.FINAL_ANSWER and run.fault is None
        assert (run.turns, run.tool_calls, run.tool_errors) == (2, 1, 0)
        assert f"\\boxed{{{problem.answer}}}" in run.answer
        first, second = run.episode.turns
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.token_ids)] == (
            *first.prompt_ids,
            *first.token_ids,
        )  # the reply's tokens are the engine's, not a re-tokenization
        observation = trained.tokenizer.decode(
            second.prompt_ids[len(first.prompt_ids) + len(first.token_ids) :]
        )
        assert problem.answer in observation and "tool_response" in observation
        seq = training_sequence(run.episode)
        assert sum(seq.mask) == len(first.token_ids) + len(second.token_ids)  # observations masked
        run.episode.reward = 1.0
    assert Episode.from_json(runs[0].episode.as_json()).turns == runs[0].episode.turns
    assert len(episode_batch([r.episode for r in runs]).items) == 3
    assert sum(r.cached_tokens for r in runs) > 0  # the second turns' prompts came from the prefix cache


def test_routes_that_arrive_apart_join_one_loop_of_rounds_and_each_gets_its_episodes_back(
    trained: Model,
) -> None:
    """An instance's episode loop (`rlsched.rl.episode_server`): a route that arrives while another's
    episodes are in their first round joins the next round, so one batch holds both routes' turns; each
    route gets back its own episodes, ended as they would be alone."""
    rollout = trained.rollout(agent_cfg())
    rounds: list[list[str]] = []
    first_round = threading.Event()
    one_round = rollout.round

    def watched(live: Sequence[er.EpisodeRun]) -> None:  # the loop's rounds, as they start
        rounds.append([r.episode.id for r in live])
        first_round.set()
        one_round(live)

    rollout.round = watched  # type: ignore[method-assign]
    server = EpisodeServer(rollout)
    ended: dict[str, queue.SimpleQueue[Any]] = {"a": queue.SimpleQueue(), "b": queue.SimpleQueue()}
    try:
        server.submit(er.group_tasks(trained.problems[:1], 2, "a"), ended["a"].put)
        assert first_round.wait(60)
        server.submit(er.group_tasks(trained.problems[1:2], 2, "b"), ended["b"].put)
        got = {k: [q.get(timeout=120) for _ in range(2)] for k, q in ended.items()}
    finally:
        server.stop()
        rollout.close()
    assert rounds[0] == ["a-0-0", "a-0-1"]
    assert ["a-0-0", "a-0-1", "b-0-0", "b-0-1"] in rounds  # a's second turns beside b's first
    for route, runs in got.items():
        assert sorted(r.episode.id for r in runs) == [f"{route}-0-0", f"{route}-0-1"]
        for run in runs:
            assert run.episode.ended is EndReason.FINAL_ANSWER and (run.turns, run.tool_calls) == (2, 1)


@pytest.mark.parametrize(("policy", "prepared"), [("resident", (1, 1)), ("rebuild", (1, 0))])
def test_the_environment_core_says_when_each_environment_is_prepared_and_released(
    trained: Model, policy: str, prepared: tuple[int, int]
) -> None:
    """Resident: prepared when the episode starts, whether or not it calls a tool; rebuild: only for
    a call (the broken episode never makes one)."""
    rollout = trained.rollout(agent_cfg(policy=policy, max_turns=2))
    calls, broken = rollout.run([trained.problems[0], BROKEN], 1, policy)
    assert (calls.tool_calls, broken.tool_calls) == (1, 0)
    assert (calls.env.preparations, broken.env.preparations) == prepared
    counts = rollout.core.counts
    assert (counts.admitted, counts.ended, counts.tool_calls) == (2, 2, 1)
    assert rollout.core.envs == {} and rollout.core.episodes == {}  # released with the episode


def test_prewarm_prepares_the_predicted_environment_while_the_model_turn_runs(trained: Model) -> None:
    """`agent.policy: prewarm` in a job's episodes: when a model turn begins, the kind its episode is
    expected to call (here its only kind) starts preparing on a thread of its own, due at the turn's
    expected end less the lead, so the call finds it prepared or preparing (a hit), where `rebuild`
    prepares it only once the call has come. A preparation no call uses (the broken episode's) is
    released with its episode: nothing is left behind."""
    counts = {}
    for policy in ("rebuild", "prewarm"):
        rollout = trained.rollout(agent_cfg(policy=policy, max_turns=2))
        try:
            calls, broken = rollout.run([trained.problems[0], BROKEN], 1, policy)
        finally:
            rollout.close()
        assert (calls.tool_calls, broken.tool_calls) == (1, 0) and calls.fault is None
        assert calls.episode.ended is EndReason.FINAL_ANSWER
        assert rollout.core.envs == {} and rollout.core.episodes == {}
        counts[policy] = (rollout.core.counts, calls.env.preparations, broken.env.preparations)
    (rebuild, _, unused), (prewarm, prepared, ahead) = counts["rebuild"], counts["prewarm"]
    assert (rebuild.hits, prewarm.hits, prewarm.misses) == (0, 1, 0)
    assert unused == 0 and ahead >= 1 and prepared >= 1  # prewarm prepared the broken one's too
    waits = f"rebuild {rebuild.waited_s * 1e3:.0f} ms, prewarm {prewarm.waited_s * 1e3:.0f} ms"
    print(f"the call's exposed preparation: {waits}")


def test_a_hanging_tool_is_stopped_and_the_model_reads_an_error(trained: Model) -> None:
    rollout = trained.rollout(agent_cfg("import time\ntime.sleep(60)", timeout_s=1.0, max_turns=2))
    (run,) = rollout.run(trained.problems[:1], 1, "hang")
    assert run.tool_errors == 1 and run.fault is None and run.tool_s < 5
    second = run.episode.turns[1]
    told = trained.tokenizer.decode(second.prompt_ids)
    assert "did not finish within 1 s and was stopped" in told


def test_a_malformed_call_becomes_an_error_observation(trained: Model) -> None:
    rollout = trained.rollout(agent_cfg(max_turns=2))
    (run,) = rollout.run([BROKEN], 1, "broken")
    assert run.malformed == 1 and run.tool_calls == 0 and run.turns == 2
    told = trained.tokenizer.decode(run.episode.turns[1].prompt_ids)
    assert "your tool call could not be read" in told


def test_limits_end_episodes_with_typed_reasons(trained: Model) -> None:
    one = trained.problems[:1]
    (run,) = trained.rollout(agent_cfg(max_turns=1)).run(one, 1, "turns")
    assert run.episode.ended is EndReason.MAX_TURNS and run.tool_calls == 0 and run.truncated
    (run,) = trained.rollout(agent_cfg(max_tokens=6)).run(one, 1, "tokens")
    assert run.episode.ended is EndReason.MAX_TOKENS and len(run.episode.turns[0].token_ids) == 6
    (run,) = trained.rollout(agent_cfg(), max_tokens=4).run(one, 1, "length")
    assert run.episode.ended is EndReason.LENGTH
    (run,) = trained.rollout(agent_cfg(max_wall_s=0.01)).run(one, 1, "wall")
    # 10 ms can run out before the first reply is sampled (a loaded machine): at most one turn
    assert run.episode.ended is EndReason.WALL_TIME and run.turns <= 1
    run.episode.reward = 0.0
    assert er.train_items([run], train_truncated=False) == []
    # trained on only where it took a turn: one whose wall time ran out before its first reply has
    # nothing to train (on a loaded machine this one may be it; CI found it so)
    assert len(er.train_items([run], train_truncated=True)) == min(run.turns, 1)
    run.episode.turns.clear()
    assert er.train_items([run], train_truncated=True) == []


def test_an_environment_that_cannot_be_prepared_is_retried_then_a_fault(
    trained: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = AgentConfig.model_validate(
        agent_cfg().model_dump() | {"environments": {"default": {"setup": "raise SystemExit('no disk')"}}}
    )
    attempts = []
    prepare = SandboxedTools.prepare

    def counted(self: SandboxedTools) -> None:
        attempts.append(1)
        prepare(self)

    monkeypatch.setattr(SandboxedTools, "prepare", counted)
    (run,) = trained.rollout(cfg, retries=2).run(trained.problems[:1], 1, "fault")
    assert run.episode.ended is EndReason.ENV_FAULT and "setup failed" in (run.fault or "")
    assert len(attempts) == 3 and run.turns == 0
    assert er.train_items([run], train_truncated=True) == []  # not a zero reward: not trained at all
    assert dataclasses.asdict(er.stats([run]))["faults"] == 1


# a calculator that keeps a line per run in its work directory: the files say how often it ran
COUNTING = CALCULATOR + "\nwith open('runs.txt', 'a') as f:\n    f.write('ran\\n')\n"


class Crash(RuntimeError):
    pass


class CrashAfterCall(RoundJournal):
    """The journal of a process that dies just after its first tool call is committed."""

    def call(self, *args: Any, **kwargs: Any) -> None:
        super().call(*args, **kwargs)
        raise Crash("the process died here")


def runs_in(archive: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("runs.txt")
        assert member is not None
        return member.read().decode().count("ran")


@pytest.mark.parametrize("policy", ["resident", "rebuild"])
def test_a_crashed_episode_resumes_from_its_journal_without_running_a_call_twice(
    trained: Model, tmp_path: Path, policy: str
) -> None:
    cfg = agent_cfg(COUNTING, policy=policy)
    crashing = CrashAfterCall(tmp_path / "rounds.sqlite")
    with pytest.raises(Crash):
        trained.rollout(cfg, journal=crashing).run(trained.problems[:1], 1, "7")
    crashing.close()
    journal = RoundJournal(tmp_path / "rounds.sqlite")
    saved = journal.load("7-0-0")
    assert saved is not None and saved.state["open_calls"] is not None  # the round was under way
    assert list(saved.calls) == ["7-0-0.t0.c0"] and runs_in(saved.files["default"]) == 1

    (run,) = trained.rollout(cfg, journal=journal).run(trained.problems[:1], 1, "7")
    assert run.episode.ended is EndReason.FINAL_ANSWER and run.tool_calls == 1 and run.turns == 2
    assert f"\\boxed{{{trained.problems[0].answer}}}" in run.answer
    assert list(run.episode.turns[0].token_ids) == list(saved.state["episode"]["turns"][0]["token_ids"])
    after = journal.load("7-0-0")
    assert after is not None and after.state["episode"]["ended"] == str(EndReason.FINAL_ANSWER)
    assert runs_in(after.files["default"]) == 1  # the call ran once, before the crash

    (again,) = trained.rollout(cfg, journal=journal).run(trained.problems[:1], 1, "7")
    assert again.episode.as_json() == run.episode.as_json()  # an ended episode is given back, not rerun
    journal.forget_before(7)
    assert journal.episodes() == ["7-0-0"]
    journal.forget_before(8)
    assert journal.load("7-0-0") is None and journal.episodes() == []


def test_a_turn_s_calls_to_two_environments_run_at_once_and_come_back_in_order(trained: Model) -> None:
    """Three calls in one reply, two to kind `a` and one to kind `b`, each a 1 s sleep: `a`'s run in
    order in its one environment while `b`'s runs beside them, observations in the reply's order.
    Each call reports when its sleep began and ended (the wall clock, the host's inside the
    sandbox), so that the overlap is read from the calls themselves, whatever the machine's load.
    (The warmed-up model writes one call a turn, so the reply's calls are given.)"""
    sleep = "import time\nt = time.time()\ntime.sleep(1)\nprint(args['x'], t, time.time())"
    tool = {"description": "sleep, then say x", "program": sleep, "timeout_s": 5}
    schema = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    cfg = AgentConfig.model_validate(
        {
            "tools": [
                tool | {"name": "slow_a", "environment": "a", "parameters": schema},
                tool | {"name": "slow_b", "environment": "b", "parameters": schema},
            ],
            "environments": {"a": {}, "b": {}},
        }
    )
    rollout = trained.rollout(cfg)
    run = rollout._start("par-0-0", "par-0", trained.problems[0])
    calls = [
        ParsedCall(f"c{k}", name, json.dumps({"x": str(k)}))
        for k, name in enumerate(["slow_a", "slow_b", "slow_a"])
    ]
    try:
        observations = rollout._execute(run, calls)
        assert observations is not None
        said = [o.text.split() for o in observations]
        assert [x for x, _, _ in said] == ["0", "1", "2"]
        (a0, b1, a2) = [(float(t0), float(t1)) for _, t0, t1 in said]
        assert a0[1] <= a2[0]  # kind a's two calls in order, in its one environment
        beside = [a for a in (a0, a2) if b1[0] < a[1] and a[0] < b1[1]]
        assert beside, (a0, b1, a2)  # kind b's sleep overlaps one of kind a's: it ran beside them
        assert run.tool_calls == 3 and run.tool_errors == 0
    finally:
        rollout._end(run, EndReason.FINAL_ANSWER)
        rollout.close()


@pytest.mark.parametrize("endpoint", [False, True], ids=["endpoint_off", "endpoint_on"])
def test_local_runs_a_multi_turn_step_through_the_one_driver(
    tool_model: Path, tmp_path: Path, endpoint: bool
) -> None:
    """`rlsched run --local` on a multi-turn job (the modes matrix's sync multi-turn torch cells): its
    one `step` runs the wave's episodes through the episode producer
    (`rlsched.rl.local_arrivals.Episodes`), each episode one of the core's samples, judged on its
    final answer, trained whole, and the new version published to the engine. With the endpoint on,
    a client's rewarded group of two episodes, served by the same engine, joins the batch."""
    from rlsched.config import JobConfig
    from rlsched.rl.loop import GRPOLoop
    from tests.helpers import JobEndpoint

    taught = teacher_problems()
    rows = [
        {"id": f"{split}-{k}", "prompt": p.messages()[0].content, "reference": p.answer, "split": split}
        for split in ("train", "eval")
        for k, p in enumerate(taught + taught[:1])
    ]
    problems = tmp_path / "taught.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = JobConfig.model_validate(
        {
            "model": {"checkpoint": str(tool_model)},
            "task": {"name": "jsonl", "path": str(problems)},
            "verifier": {"kind": "math"},
            "sampling": {"temperature": 0.0, "max_tokens": 48},
            "agent": agent_cfg().model_dump() | {"chat_template": str(TEMPLATE)},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2},
            "rollout": {"endpoint": {"enabled": endpoint, "port": 0}},
        }
    )
    lines: list[str] = []
    loop = GRPOLoop(cfg, log=lines.append)
    try:
        if endpoint:
            client = JobEndpoint(lines)
            client.episode("c-0", "c", 1.0)
            client.episode("c-1", "c", 0.0)
        rec = loop.step(0)
    finally:
        loop.close()
    if endpoint:
        assert rec.endpoint is not None and rec.endpoint["episodes_trained"] == 2, rec.endpoint
    assert rec.episodes is not None and rec.episodes["episodes"] == 4 and rec.episodes["faults"] == 0
    assert rec.episodes["tool_calls"] > 0 and rec.reward > 0  # it calls the calculator, as it learned
    assert set(rec.phase_s) == {"episodes", "update", "publish"} and rec.version == 1
