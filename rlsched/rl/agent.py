"""Multi-turn episodes in the job: the model calls tools in its environments, reads what they return
and goes on, until it answers without a call or a limit ends the episode.

An episode is a loop of turns:
1. generate - the engine samples a reply to the conversation so far, up to the template's end of
   turn (or `sampling.max_tokens`);
2. parse    - Hermes-style `<tool_call>` blocks (`rlsched.serve.tools`). A reply that opens a call
   but does not parse is answered with an error observation saying why; a reply with no call is the
   final answer;
3. execute  - each call runs in the episode's environments (`environments`): calls to different kinds
   at once, each kind's in order, the observations in the reply's order. A hang, a
   crash, an unknown tool or bad arguments come back as error observations, and the episode goes on.
   When each environment is prepared and released is the environment core's to say
   (`rlsched.core.envs`, the rules the simulator and the Ray driver follow): under `resident` at the
   episode's start and end, under `rebuild` around each call, its files kept between; under
   `prewarm` as under `rebuild`, but the kind the episode is expected to call next starts preparing,
   on a thread of its own, `agent.prewarm_lead_s` before its model turn is expected to end (the
   model-turn estimate and the prediction: `rlsched.rl.prewarm`);
4. append   - the chat template renders the observations as tool messages after the reply, and only
   the new text is tokenized: the reply's tokens stay the ones the engine sampled, so the episode is
   one token sequence.

The record is the OpenAI endpoint's (`rlsched.serve.episodes.Episode`: per turn the prompt ids, the
sampled ids with their log-probs and version, and timings), so `rlsched.rl.episodes.episode_batch`
trains both alike: the loss on sampled tokens only (observations and template tokens masked), and
group-relative advantages over whole episodes.

Limits end an episode with a typed reason (`EndReason`): `max_turns`, `max_tokens` (the episode's
tokens after its first prompt), `wall_time`, and `length` (a reply cut off). Such an episode is
scored as it stands and trained on only where `agent.train_truncated` says so. An environment that
fails (it could not be prepared, its sandbox refused) is retried `agent.env_retries` times; then the
episode is an execution fault: left out, never a zero reward.

Rounds are batched: every live episode's next turn goes to the engine in one `generate`, and a
reply's tool calls start (in a thread pool) the moment it arrives, while the rest of the batch
decodes. A turn's prompt extends the one before, so the torch engine's prefix cache serves it.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from environments.protocol import EnvironmentFault, Observation, ToolSpec
from environments.sandboxed import SandboxedTools, ToolEnvironments
from rlsched.config import JobConfig
from rlsched.config_agent import AgentConfig, ToolConfig
from rlsched.core import envs as ec
from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    RequestId,
    Sample,
    SamplingParams,
)
from rlsched.errors import UserError
from rlsched.model.content import Rendered, render_shielded
from rlsched.model.tokenizer import Tokenizer
from rlsched.policy.environments import Capacity, EnvPolicy
from rlsched.policy.retry import RetryPolicy
from rlsched.rl.episode_runs import EpisodeRun, EpisodeTask, group_tasks
from rlsched.rl.prewarm import TURN_WEIGHT, TurnEstimate, Wakeups, predict
from rlsched.rl.requests import request_seed, run_seed_for_requests
from rlsched.rl.task import TaskProblem
from rlsched.serve.episodes import EndReason, Episode, Turn, continue_prompt
from rlsched.serve.tools import OPEN, ParsedCall, malformed, parse_hermes
from rlsched.store.round_journal import RoundJournal
from verifiers.sandbox import sweep_orphans
from verifiers.sandbox_types import SandboxPolicy

ENV_RETRY = RetryPolicy(2)  # `agent.env_retries`' default
UNLIMITED = Capacity(cores=1e9, slots=1e9, memory_gib=1e9)


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 4
    max_tokens: int = 512  # the episode's tokens after its first prompt
    max_wall_s: float = 120.0

    @classmethod
    def of(cls, cfg: AgentConfig) -> AgentLimits:
        return cls(cfg.max_turns, cfg.max_tokens, cfg.max_wall_s)


EnvFactory = Callable[[], ToolEnvironments]


def _prepared(env: ToolEnvironments, kind: str) -> bool:
    env.prepare(kind)
    return True


def environment_factory(cfg: AgentConfig, sandbox: SandboxPolicy | None = None) -> EnvFactory:
    """A new episode's environments, as the job's `agent` section declares them."""
    specs = {t.name: ToolSpec(t.name, t.description, dict(t.parameters), t.timeout_s) for t in cfg.tools}
    sources = {t.name: _program_source(t) for t in cfg.tools}

    def make() -> ToolEnvironments:
        kinds = {}
        for name, env in cfg.environments.items():
            tools = tuple(specs[t.name] for t in cfg.tools if t.environment == name)
            if tools:
                programs = {t.name: sources[t.name] for t in tools}
                kinds[name] = SandboxedTools(tools, programs, sandbox, env.work_mb, env.setup)
        return ToolEnvironments(kinds)

    return make


def _program_source(tool: ToolConfig) -> str:
    """A tool's program, read and compiled now: a missing file or a syntax error is the job's bad
    input, said before any episode runs."""
    where = f"tool {tool.name}'s program" + (f" ({tool.program_file})" if tool.program_file else "")
    try:
        source = tool.source()
    except OSError as err:
        raise UserError(f"{where} cannot be read: {err.strerror}; fix agent.tools[].program_file") from None
    try:
        compile(source, where, "exec")
    except SyntaxError as err:
        raise UserError(f"{where} is not valid Python: {err.msg} (line {err.lineno})") from None
    return source


def check_renders_tools(tokenizer: Tokenizer, tools: Sequence[ToolSpec]) -> None:
    """Refuse a chat template that does not tell the model of its tools (it would never call one)."""
    template = tokenizer.chat_template or ""
    if OPEN not in template or "tools" not in template:
        raise UserError(
            "agent.tools needs a chat template that describes the tools and <tool_call> blocks; this "
            "checkpoint's does not. Set agent.chat_template (configs/chat_templates/smollm2_tools.jinja "
            "for SmolLM2)"
        )
    if not tools:
        raise UserError("agent.tools is empty: declare at least one tool")


def render(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> Rendered:
    """The episode's prompt; a special token's string in a message (a tool's output, a problem) stays
    text (`rlsched.model.content`)."""
    schemas = [t.as_openai() for t in tools]

    def template(shown: list[dict[str, Any]]) -> str:
        text = tokenizer.hf.apply_chat_template(
            shown, tools=schemas, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    return render_shielded(tokenizer, template, messages)


class TurnEngine(Protocol):
    """What the episodes ask of an engine: a round's turns generated, each sample as it finishes (a
    `RolloutEngine`, or a torch rollout instance's continuous batch, `Instance.rows_engine`)."""

    @property
    def context_length(self) -> int: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Sample]: ...


class AgentRollout:
    """Episodes of a batch of problems, `group_size` per problem, on one engine."""

    def __init__(
        self,
        engine: TurnEngine,
        tokenizer: Tokenizer,
        make_env: EnvFactory,
        params: SamplingParams,
        limits: AgentLimits,
        env_retry: RetryPolicy = ENV_RETRY,
        run_seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy: EnvPolicy = EnvPolicy.RESIDENT,
        journal: RoundJournal | None = None,
        prewarm_lead_s: float | None = None,
    ) -> None:
        """`journal`: each round committed there, and an episode found there resumed from its last
        committed round (None: episodes start afresh and nothing is kept). `prewarm_lead_s`: under
        `prewarm`, how long before a model turn's expected end the predicted kind starts preparing
        (None: that kind's mean preparation so far)."""
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.journal = journal
        self.params, self.limits, self.env_retry = params, limits, env_retry
        self.run_seed, self.clock = run_seed, clock
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tools")
        self.lanes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tool-lanes")  # a turn's kinds
        # when each environment is prepared and released: the environment core's rules, as on Ray and
        # in the simulator (no admission limit here: the batch is what runs)
        types = {kind: ec.EnvType(memory_gib=0.0, prepare_s=0.0) for kind in make_env().kinds}
        self.core = ec.EnvCore(ec.EnvParams(policy, types, UNLIMITED, lead_s=prewarm_lead_s))
        self._core_lock = threading.Lock()
        self._kind_of_env: dict[str, str] = {}
        self._episode_of_env: dict[str, str] = {}
        self._kind_locks: dict[str, dict[str, threading.RLock]] = {}  # an episode's, by kind
        self._t0 = clock()
        self.swept = len(sweep_orphans())  # sandboxes a process killed before this one left here
        self.prewarming = policy is EnvPolicy.PREWARM
        self.turn_estimate = TurnEstimate()
        self._runs: dict[str, EpisodeRun] = {}  # live episodes, for the preparations started ahead
        self._ahead: dict[str, threading.Event] = {}  # environments preparing ahead: set when done
        self._last_kind: dict[str, str] = {}
        self._wakeups = Wakeups(self._next_wakeup, self._tick, self._now) if self.prewarming else None
        # preparations started ahead: threads of their own, never behind the calls that wait for them
        self.ahead = ThreadPoolExecutor(max_workers=4, thread_name_prefix="prewarm")

    def close(self) -> None:
        if self._wakeups is not None:
            self._wakeups.close()
        self.ahead.shutdown(wait=True)
        self.pool.shutdown(wait=True)
        self.lanes.shutdown(wait=True)

    # -- an episode's start and end ------------------------------------------------------------

    def _start(self, episode_id: str, group_id: str, problem: TaskProblem) -> EpisodeRun:
        env = self.make_env()
        messages = [m.model_dump() for m in problem.messages()]
        env.reset(messages[-1]["content"])  # armed with the task; prepared as the core says
        saved = self.journal.load(episode_id) if self.journal is not None else None
        if saved is not None:  # where its journal left it, its environments' files restored
            run = EpisodeRun.resumed(saved, problem, env, self.clock())
            for kind, archive in saved.files.items():
                env.restore(kind, archive)
            if not run.live:
                env.close()
                return run
        else:
            text = render(self.tokenizer, messages, env.tools)
            ids, _, _ = continue_prompt(None, text, self.tokenizer)
            episode = Episode(episode_id, group_id, time.time())
            run = EpisodeRun(episode, problem, env, messages, len(ids), self.clock(), next_ids=ids)
            run.episode.reference = problem.answer
        self._runs[episode_id] = run
        self._realize(run, self._feed(ec.Arrived(self._now(), episode_id, env.kinds)))
        return run

    def _commit(self, run: EpisodeRun, round_closed: bool = False) -> None:
        if self.journal is not None:
            self.journal.state(run.episode.id, run.state(self.clock()), round_closed)

    def _end(self, run: EpisodeRun, why: EndReason, commit: bool = True) -> None:
        if run.episode.ended is None:
            run.episode.ended, run.episode.ended_at = why, time.time()
            run.open_calls = None
            if commit:
                self._commit(run)
            with self._core_lock:
                admitted = run.episode.id in self.core.episodes
            if admitted:  # its environments released (all destroyed by `close` below)
                for effect in self._feed(ec.Ended(self._now(), run.episode.id)):
                    if isinstance(effect, (ec.Release, ec.Cancel)):
                        self._forget(effect.env)
            self._runs.pop(run.episode.id, None)
            self._last_kind.pop(run.episode.id, None)
            with self._core_lock:
                self._kind_locks.pop(run.episode.id, None)
        run.env.close()  # a preparation under way beside it releases what it made (`_prepare`)

    # -- the environment core ----------------------------------------------------------------------

    def _now(self) -> float:
        return self.clock() - self._t0

    def _feed(self, event: ec.Event) -> list[ec.Effect]:
        """The core's effects of `event` for the caller to carry out; the preparations a prewarm timer
        made due (any event may) are started ahead here instead (`_prepare_ahead`)."""
        ahead: list[ec.Prepare] = []
        with self._core_lock:
            effects = self.core.handle(event)
            for e in effects:
                if isinstance(e, ec.Prepare):
                    self._kind_of_env[e.env] = e.tool
                    self._episode_of_env[e.env] = self.core.envs[e.env].episode
                    if self._is_ahead(event, e):
                        self._ahead[e.env] = threading.Event()  # a call may wait for it
                        ahead.append(e)
        for e in ahead:
            run = self._runs.get(self._episode_of_env.get(e.env, ""))
            if run is None:
                self._ahead.pop(e.env).set()
            else:
                self.ahead.submit(self._prepare_ahead, run, e)
        return [e for e in effects if not any(e is a for a in ahead)]

    def _is_ahead(self, event: ec.Event, prepare: ec.Prepare) -> bool:
        """A prewarm timer's preparation: under `prewarm`, every one but that of the kind a call just
        asked for."""
        if not self.prewarming:
            return False
        if not isinstance(event, ec.ToolCalled):
            return True
        return not (event.tool == prepare.tool and self._episode_of_env[prepare.env] == event.episode)

    def _forget(self, env: str) -> None:
        self._kind_of_env.pop(env, None)
        self._episode_of_env.pop(env, None)

    @contextmanager
    def _env_lock(self, run: EpisodeRun, kind: str) -> Iterator[None]:
        """One kind's environment of one episode is prepared or released by one thread at a time (a
        preparation started ahead runs beside the episode's own calls)."""
        with self._core_lock:
            locks = self._kind_locks.setdefault(run.episode.id, {}) if run.episode.ended is None else {}
            lock = locks.setdefault(kind, threading.RLock())
        with lock:
            yield

    def _realize(self, run: EpisodeRun, effects: list[ec.Effect], kind: str | None = None) -> bool:
        """Do what the core said for this episode: prepare (faults retried), release. Whether a
        `RunTool` for its call to `kind` came (that call may run now)."""
        runs = False
        pending = list(effects)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, ec.Pend):
                raise RuntimeError(f"episode {effect.episode} was not admitted: {effect.reason}")
            if isinstance(effect, ec.Prepare):
                if self._prepare(run, effect.tool) is None:
                    return False  # the environment failed past its retries: the episode ended
                pending += self._feed(ec.Prepared(self._now(), effect.env))
            elif isinstance(effect, ec.Release):
                released = self._kind_of_env[effect.env]
                self._forget(effect.env)
                with self._env_lock(run, released):
                    run.env.release(released)
            elif isinstance(effect, ec.Cancel):
                self._forget(effect.env)
            elif isinstance(effect, ec.RunTool):
                runs = runs or self._kind_of_env.get(effect.env) == kind
        return runs

    def _with_retries(self, run: EpisodeRun, act: Callable[[], Any]) -> Any:
        """`act` with the environment's faults retried; past the retries the episode is a fault."""
        failures = 0
        while True:
            try:
                return act()
            except EnvironmentFault as err:
                failures += 1
                wait = self.env_retry.after(failures)
                if wait is None:
                    run.fault = str(err)
                    self._end(run, EndReason.ENV_FAULT)
                    return None
                time.sleep(wait)

    def _prepare(self, run: EpisodeRun, kind: str) -> bool | None:
        """Prepare the episode's `kind` (faults retried; None: it failed past its retries, and the
        episode ended). Each preparation's time feeds the kind's estimate (prewarm's default lead)."""
        with self._env_lock(run, kind):
            if run.episode.ended is not None:
                return None
            started = time.monotonic()
            done: bool | None = self._with_retries(run, partial(_prepared, run.env, kind))
            if done is not None and run.episode.ended is not None:  # it ended meanwhile (`_end`)
                run.env.release(kind)
                return None
        if done is not None and self.prewarming:
            self._learn_preparation(kind, time.monotonic() - started)
        return done

    # -- prewarm: preparations started ahead of the calls --------------------------------------------

    def _learn_preparation(self, kind: str, seconds: float) -> None:
        with self._core_lock:
            types = dict(self.core.params.types)
            old = types[kind].prepare_s
            mean = seconds if old == 0.0 else old + TURN_WEIGHT * (seconds - old)
            types[kind] = dataclasses.replace(types[kind], prepare_s=mean)
            self.core.params = dataclasses.replace(self.core.params, types=types)

    def _model_calls(self, runs: Sequence[EpisodeRun]) -> None:
        """Each episode's model turn began: when it should end, and the kind it should call next."""
        now = self._now()
        expected = now + self.turn_estimate.seconds
        for run in runs:
            predicted = predict(self._last_kind.get(run.episode.id), run.env.kinds)
            self._feed(ec.ModelCallStarted(now, run.episode.id, expected, predicted))
        assert self._wakeups is not None
        self._wakeups.poke()

    def _next_wakeup(self) -> float | None:
        with self._core_lock:
            return self.core.next_wakeup()

    def _tick(self) -> None:
        """A preparation is due: `_feed` starts it on a thread of its own, beside the model's turn."""
        self._feed(ec.Tick(self._now()))

    def _prepare_ahead(self, run: EpisodeRun, effect: ec.Prepare) -> None:
        """Under its kind's lock throughout: a call to that kind prepared on demand meanwhile (after a
        wrong prediction was cancelled) waits, and finds what this leaves."""
        try:
            with self._env_lock(run, effect.tool):
                if self._prepare(run, effect.tool) is None:
                    return
                self._feed(ec.Prepared(self._now(), effect.env))  # a call that waited for it may run
                with self._core_lock:
                    cancelled = effect.env not in self.core.envs  # a wrong prediction, or it ended
                if cancelled:
                    run.env.release(effect.tool)
        finally:
            self._ahead.pop(effect.env, threading.Event()).set()

    def _await_ahead(self, run: EpisodeRun, kind: str) -> bool:
        """A call that found its environment still preparing ahead: wait for it. Whether it may run
        (False: the preparation failed, and the episode ended)."""
        with self._core_lock:
            episode = self.core.episodes.get(run.episode.id)
            env = episode.envs.get(kind) if episode is not None else None
        done = self._ahead.get(env.name) if env is not None else None
        if done is not None:
            done.wait(self.limits.max_wall_s)
        return run.live

    # -- the loop of turns -----------------------------------------------------------------------

    def run(
        self,
        problems: Sequence[TaskProblem],
        group_size: int,
        prefix: str,
        params: SamplingParams | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[EpisodeRun]:
        """Every episode to its end: ids `PREFIX-PROBLEM-MEMBER`, grouped by `PREFIX-PROBLEM`, where
        PROBLEM is the problem's place in `problems` or its entry in `indices` (a share of a batch).
        `params`: other sampling knobs than the rollout's, e.g. greedy for an evaluation, which is not
        journaled."""
        if params is not None:
            other = copy.copy(self)  # the same engine, environments and thread pool
            other.params, other.journal = params, None
            return other.run(problems, group_size, prefix, indices=indices)
        runs: list[EpisodeRun] = []
        try:
            runs = self.begin(group_tasks(problems, group_size, prefix, indices))
            while live := [r for r in runs if r.live]:
                self.round(live)
        finally:
            self.abandon(runs)
        return runs

    def begin(self, tasks: Sequence[EpisodeTask]) -> list[EpisodeRun]:
        """Each episode started, or resumed where its journal left it (a round under way finished:
        its calls that did not run, then the append)."""
        runs = [self._start(t.episode_id, t.group_id, t.problem) for t in tasks]
        self._finish_rounds([r for r in runs if r.live and r.open_calls is not None])
        return runs

    def round(self, live: Sequence[EpisodeRun]) -> None:
        """One turn of each live episode: their replies generated in one batch, each one's tool calls
        run the moment it arrives, the observations appended."""
        self._round(list(live))

    def abandon(self, runs: Sequence[EpisodeRun]) -> None:
        """Episodes left open by an exception ended here, their journals left as they are (a resumed
        run takes them up again)."""
        for r in runs:
            self._end(r, EndReason.WALL_TIME, commit=False)

    def _limit(self, run: EpisodeRun) -> EndReason | None:
        if run.turns >= self.limits.max_turns:
            return EndReason.MAX_TURNS
        if len(run.next_ids) - run.first_prompt >= self.limits.max_tokens:
            return EndReason.MAX_TOKENS
        if self.clock() - run.started > self.limits.max_wall_s:
            return EndReason.WALL_TIME
        return None

    def _request(self, run: EpisodeRun) -> GenerationRequest | None:
        used = len(run.next_ids) - run.first_prompt
        room = min(
            self.params.max_tokens,
            self.limits.max_tokens - used,
            self.engine.context_length - len(run.next_ids) - 1,
        )
        if room < 1:
            self._end(run, EndReason.MAX_TOKENS)
            return None
        rid = RequestId(f"{run.episode.id}.t{run.turns}")
        params = dataclasses.replace(self.params, max_tokens=room)
        if self.run_seed is not None and params.seed is None:
            params = dataclasses.replace(params, seed=request_seed(self.run_seed, rid))
        return GenerationRequest(rid, tuple(run.next_ids), params)

    def _round(self, live: list[EpisodeRun]) -> None:
        requests: dict[RequestId, tuple[GenerationRequest, EpisodeRun]] = {}
        for run in live:
            if (why := self._limit(run)) is not None:
                self._end(run, why)
            elif (req := self._request(run)) is not None:
                requests[req.request_id] = (req, run)
        submitted = time.time()
        pending: list[tuple[EpisodeRun, Future[list[Observation] | None]]] = []
        batch = [req for req, _ in requests.values()]
        if self.prewarming:
            self._model_calls([run for _, run in requests.values()])
        for sample in self.engine.generate(batch):
            run = requests[sample.request_id][1]
            self.turn_estimate.add(time.time() - submitted)
            if not run.live:  # its environment, prepared ahead, failed past its retries meanwhile
                continue
            calls = self._record(run, sample, submitted)
            if calls is not None:
                pending.append((run, self.pool.submit(self._execute, run, calls)))
        self._appended(pending)

    def _finish_rounds(self, runs: list[EpisodeRun]) -> None:
        """Resumed episodes whose round was under way: its calls that did not run, then the append."""
        self._appended([(r, self.pool.submit(self._execute, r, r.open_calls or [])) for r in runs])

    def _appended(self, pending: list[tuple[EpisodeRun, Future[list[Observation] | None]]]) -> None:
        for run, future in pending:
            observations = future.result()
            if observations is not None and run.live:
                self._append(run, observations)

    def _record(self, run: EpisodeRun, sample: Sample, submitted: float) -> list[ParsedCall] | None:
        """The turn into the record; the calls to run, or None where the episode ended."""
        reply = parse_hermes(sample.text)
        broken = malformed(sample.text)
        called = reply is not None or broken is not None
        run.episode.turns.append(
            Turn(
                request_id=sample.request_id,
                prompt_ids=tuple(run.next_ids),
                token_ids=sample.token_ids,
                logprobs=sample.logprobs,
                weight_version=int(sample.weight_version),
                submitted=submitted,
                first_token=None,
                finished=time.time(),
                finish_reason=str(sample.finish_reason),
                called_tool=called,
                extends=run.extends,
                diverged_at=run.diverged_at,
                started_version=None if sample.started_version is None else int(sample.started_version),
            )
        )
        run.answer = sample.text
        run.cached_tokens += sample.cached_tokens
        if sample.finish_reason is FinishReason.LENGTH:
            spent = len(run.next_ids) + sample.num_tokens - run.first_prompt
            self._end(run, EndReason.MAX_TOKENS if spent >= self.limits.max_tokens else EndReason.LENGTH)
            return None
        if not called:
            self._end(run, EndReason.FINAL_ANSWER)
            return None
        if run.turns >= self.limits.max_turns:
            self._end(run, EndReason.MAX_TURNS)  # no turn is left to read the results
            return None
        run.messages.append({"role": "assistant", "content": sample.text})
        if reply is None:
            run.malformed += 1
            calls = [ParsedCall("malformed", "", "")]
        else:  # ids of its own, so that a resumed round knows which calls ran
            turn = f"{run.episode.id}.t{run.turns - 1}"
            calls = [dataclasses.replace(c, id=f"{turn}.c{k}") for k, c in enumerate(reply.calls)]
        run.open_calls = calls
        self._commit(run)  # the round is open: its reply is kept, its calls are named
        return calls

    def _execute(self, run: EpisodeRun, calls: list[ParsedCall]) -> list[Observation] | None:
        """The calls' observations, in the reply's order; None where the environment failed past its
        retries. Calls to different kinds of environment run at once, each kind's in order (one
        environment runs one call at a time); a call its journal says ran is not run again."""
        out: dict[int, Observation] = {}
        lanes: dict[str, list[tuple[int, ParsedCall]]] = {}
        for k, call in enumerate(calls):
            kind = run.env.kind_of(call.name)
            if call.id == "malformed":
                why = malformed(run.answer) or "it does not parse"
                out[k] = Observation(call.id, f"error: your tool call could not be read: {why}", True)
            elif call.id in run.done:
                out[k] = run.done[call.id]
            elif kind is None:
                out[k] = run.env.step(call)  # an unknown tool: an error observation, no environment
            else:
                lanes.setdefault(kind, []).append((k, call))
        if len(lanes) > 1:
            done = [f.result() for f in [self.lanes.submit(self._lane, run, c) for c in lanes.values()]]
        else:
            done = [self._lane(run, c) for c in lanes.values()]
        if any(d is None for d in done):
            return None
        out |= {k: o for d in done if d is not None for k, o in d}
        for k, call in enumerate(calls):
            if call.id != "malformed":
                run.tool_calls += 1
                run.tool_errors += out[k].error
                run.tool_s += out[k].seconds
        return [out[k] for k in range(len(calls))]

    def _lane(
        self, run: EpisodeRun, calls: list[tuple[int, ParsedCall]]
    ) -> list[tuple[int, Observation]] | None:
        """One kind's calls, in order."""
        out = []
        for k, call in calls:
            observation = self._call(run, call)
            if observation is None:
                return None
            out.append((k, observation))
        return out

    def _call(self, run: EpisodeRun, call: ParsedCall) -> Observation | None:
        """One tool call in its kind's environment, prepared and released as the core says."""
        kind = run.env.kind_of(call.name)
        assert kind is not None
        self._last_kind[run.episode.id] = kind
        runs = self._realize(run, self._feed(ec.ToolCalled(self._now(), run.episode.id, kind)), kind)
        if not runs and not (run.live and self.prewarming and self._await_ahead(run, kind)):
            return None
        observation: Observation | None = self._with_retries(run, partial(run.env.step, call))
        if observation is not None:
            if self.journal is not None:  # done: kept with its environment's files before any release
                body = dataclasses.asdict(observation)
                self.journal.call(run.episode.id, call.id, body, kind, run.env.files(kind))
            self._realize(run, self._feed(ec.ToolDone(self._now(), run.episode.id, kind)))
        return observation

    def _append(self, run: EpisodeRun, observations: list[Observation]) -> None:
        for o in observations:
            run.messages.append({"role": "tool", "content": o.text, "tool_call_id": o.call_id})
        text = render(self.tokenizer, run.messages, run.env.tools)
        run.next_ids, run.extends, run.diverged_at = continue_prompt(run.episode, text, self.tokenizer)
        run.open_calls, run.done = None, {}
        self._commit(run, round_closed=True)


@dataclass(frozen=True)
class AgentSpec:
    """What a process needs to run a job's episodes on its own engine (a Ray rollout instance): the
    `agent` section, the sampling knobs, the sandbox, where rounds are journaled, the run's seed and
    the tools' chat template's text."""

    agent: AgentConfig
    params: SamplingParams
    sandbox: SandboxPolicy | None = None
    journal: str | None = None
    run_seed: int | None = None
    chat_template: str | None = None

    def rollout(self, engine: TurnEngine, tokenizer: Tokenizer) -> AgentRollout:
        if self.chat_template is not None:
            tokenizer.hf.chat_template = self.chat_template
        make_env = environment_factory(self.agent, self.sandbox)
        check_renders_tools(tokenizer, make_env().tools)
        journal = RoundJournal(Path(self.journal)) if self.journal is not None else None
        a = self.agent
        return AgentRollout(
            engine, tokenizer, make_env, self.params, AgentLimits.of(a), RetryPolicy(a.env_retries),
            self.run_seed, policy=a.policy, journal=journal, prewarm_lead_s=a.prewarm_lead_s,
        )  # fmt: skip


def spec_of(cfg: JobConfig, params: SamplingParams, journal: Path | None = None) -> AgentSpec:
    """The job's `AgentSpec` (its tools' chat template read now: a missing file is bad input)."""
    agent, template = cfg.agent, None
    if agent.chat_template is not None:
        if not agent.chat_template.is_file():
            raise UserError(f"agent.chat_template {agent.chat_template} does not exist; fix the path")
        template = agent.chat_template.read_text()
    return AgentSpec(
        agent, params, cfg.verifier.sandbox.policy(), None if journal is None else str(journal),
        run_seed_for_requests(cfg), template,
    )  # fmt: skip
