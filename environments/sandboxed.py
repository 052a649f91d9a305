"""Tools that run in the episode's own sandbox (`verifiers.sandbox.Sandbox`, persistent): one uid and
one `/work` for the whole episode, so a tool call sees the files earlier calls left, and nothing of
another episode. Each tool is a Python program; its call's arguments reach it as a dict, `args`, and
what it prints is the observation. Each call runs under the tool's timeout: a hang is killed and
returned to the model as an error observation, as is a crash, a call to an unknown tool, and
arguments that are not JSON or do not match the tool's schema (`jsonschema`).

`release` frees the environment between tool calls and keeps its files outside it (the sandbox's
work directory as a tar archive); the next call, or `prepare`, builds a new sandbox and restores them:
the `rebuild` policy. `ToolEnvironments` is an episode's whole set: one `SandboxedTools` per kind of
environment its tools name, each tool call routed to its own kind, each kind prepared and released
when the environment core says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import jsonschema

from environments.protocol import EnvironmentFault, Observation, ToolSpec
from rlsched.serve.tools import ParsedCall
from verifiers.sandbox import Sandbox
from verifiers.sandbox_types import Outcome, SandboxLimits, SandboxPolicy


def _program(source: str, arguments: str) -> str:
    """The tool's source after its arguments, bound to `args` (a dict)."""
    return f"import json\nargs = json.loads({arguments!r})\n{source}"


class SandboxedTools:
    """An `Environment` whose tools are programs (`programs`: tool name -> Python source that reads
    `args`, a dict, and prints its answer) run in one sandbox per episode."""

    def __init__(
        self,
        tools: tuple[ToolSpec, ...],
        programs: Mapping[str, str],
        policy: SandboxPolicy | None = None,
        work_mb: int = 64,
        setup: str | None = None,
    ) -> None:
        """`setup`: Python source run once by `reset` (the task's prompt in `args['prompt']`) to
        prepare the work directory."""
        missing = [t.name for t in tools if t.name not in programs]
        if missing:
            raise ValueError(f"tools without a program: {', '.join(missing)}")
        self._tools = tools
        self._by_name = {t.name: t for t in tools}
        self._programs = dict(programs)
        self._policy, self._work_mb, self._setup = policy, work_mb, setup
        self._box: Sandbox | None = None
        self._prompt = ""
        self._archive: bytes | None = None  # the files a `release` kept
        self.preparations = 0
        self.prepare_s = 0.0

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        return self._tools

    def reset(self, prompt: str, prepare: bool = True) -> str:
        """A new episode on `prompt`; prepared now, or (`prepare=False`) by its first call."""
        self.close()
        self._prompt, self._archive = prompt, None
        if prepare:
            self.prepare()
        return prompt

    @property
    def live(self) -> bool:
        """A sandbox is up (prepared, not released)."""
        return self._box is not None

    def prepare(self) -> None:
        """Build the sandbox: with the files a `release` kept, restored; the first time, the setup
        program run (raises `EnvironmentFault` when either fails)."""
        if self._box is not None:
            return
        started = time.monotonic()
        try:
            box = Sandbox.create(self._policy, persistent=True, work_mb=self._work_mb)
        except OSError as err:
            raise EnvironmentFault(f"the environment could not be prepared: {err}") from err
        self._box = box
        if self._archive is not None:
            try:
                box.restore_work(self._archive)
            except (OSError, ValueError) as err:
                self.close()
                raise EnvironmentFault(f"the environment's files could not be restored: {err}") from err
        elif self._setup is not None:
            result = box.exec(
                _program(self._setup, json.dumps({"prompt": self._prompt})),
                limits=SandboxLimits(timeout_s=30),
            )
            if result.outcome is not Outcome.OK:
                self.close()
                raise EnvironmentFault(
                    f"the environment's setup failed ({result.outcome}): {result.stderr[-300:]}"
                )
        self.preparations += 1
        self.prepare_s += time.monotonic() - started

    def release(self) -> None:
        """Free the sandbox and keep its files outside it, for the next `prepare`."""
        if self._box is None:
            return
        self._archive = self._box.save_work()
        self._box.destroy()
        self._box = None

    def files(self) -> bytes | None:
        """Its work directory's files as they stand (a tar archive), live or kept by a `release`;
        None before it was ever prepared."""
        if self._box is not None:
            return self._box.save_work()
        return self._archive

    def restore(self, archive: bytes) -> None:
        """Arm it with files saved from an earlier environment of this episode (a resumed episode):
        its next `prepare` restores them instead of running the setup program."""
        if self._box is not None:
            raise RuntimeError("restore() before the environment is prepared")
        self._archive = archive

    def step(self, call: ParsedCall) -> Observation:
        tool = self._by_name.get(call.name)
        if tool is None:
            return _unknown(call, self._by_name)
        problem = _bad_arguments(call.arguments, tool.parameters)
        if problem is not None:
            return Observation(call.id, f"error: {call.name} was called with bad arguments: {problem}", True)
        self.prepare()  # on demand, where it was released
        assert self._box is not None
        started = time.monotonic()
        result = self._box.exec(
            _program(self._programs[call.name], call.arguments),
            limits=SandboxLimits(timeout_s=tool.timeout_s),
        )
        self._box.record(result)
        seconds = time.monotonic() - started
        if result.outcome is Outcome.ERROR:
            raise EnvironmentFault(f"the sandbox could not run {call.name}: {result.error}")
        if result.outcome is Outcome.TIMEOUT:
            text = f"error: {call.name} did not finish within {tool.timeout_s:g} s and was stopped"
            return Observation(call.id, text, True, seconds)
        if result.outcome is not Outcome.OK:
            detail = (result.stderr.strip().splitlines() or [str(result.outcome)])[-1]
            return Observation(call.id, f"error: {call.name} failed: {detail}", True, seconds)
        return Observation(call.id, result.stdout.strip(), False, seconds)

    def close(self) -> dict[str, Any]:
        box, self._box, self._archive = self._box, None, None
        return box.destroy() if box is not None else {}


class ToolEnvironments:
    """An episode's environments: one `SandboxedTools` per kind (`kinds`: name -> environment), each
    tool call routed to the kind that holds its tool. When each kind is prepared and released is the
    environment core's to say (`rlsched.core.envs`, driven by `rlsched.rl.agent`): `reset` only arms
    them with the episode's prompt; `prepare` and `release` act on one kind, and a call to a kind that
    is not prepared prepares it first."""

    def __init__(self, kinds: Mapping[str, SandboxedTools]) -> None:
        self._kinds = dict(kinds)
        self._kind_of = {t.name: name for name, env in self._kinds.items() for t in env.tools}

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        return tuple(t for env in self._kinds.values() for t in env.tools)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def kind_of(self, tool: str) -> str | None:
        return self._kind_of.get(tool)

    @property
    def preparations(self) -> int:
        return sum(env.preparations for env in self._kinds.values())

    @property
    def prepare_s(self) -> float:
        return sum(env.prepare_s for env in self._kinds.values())

    def reset(self, prompt: str) -> str:
        for env in self._kinds.values():
            env.reset(prompt, prepare=False)
        return prompt

    def prepare(self, kind: str) -> None:
        self._kinds[kind].prepare()

    def release(self, kind: str) -> None:
        self._kinds[kind].release()

    def files(self, kind: str) -> bytes | None:
        return self._kinds[kind].files()

    def restore(self, kind: str, archive: bytes) -> None:
        self._kinds[kind].restore(archive)

    def step(self, call: ParsedCall) -> Observation:
        kind = self._kind_of.get(call.name)
        if kind is None:
            return _unknown(call, self._kind_of)
        return self._kinds[kind].step(call)

    def close(self) -> dict[str, Any]:
        return {name: env.close() for name, env in self._kinds.items()}


def _unknown(call: ParsedCall, known: Mapping[str, object]) -> Observation:
    names = ", ".join(sorted(known))
    return Observation(call.id, f"error: there is no tool {call.name!r}; the tools are: {names}", True)


def _bad_arguments(arguments: str, schema: dict[str, Any]) -> str | None:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as err:
        return f"not JSON ({err.msg})"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as err:
        return str(err.message)
    return None
