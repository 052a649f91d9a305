"""Tools that run in the episode's own sandbox (`verifiers.sandbox.Sandbox`, persistent): one uid and
one `/work` for the whole episode, so a tool call sees the files earlier calls left, and nothing of
another episode. Each tool is a Python program; its call's arguments reach it as a dict, `args`, and
what it prints is the observation. Each call runs under the tool's timeout: a hang is killed and
returned to the model as an error observation, as is a crash, a call to an unknown tool, and
arguments that are not JSON or do not match the tool's schema (`jsonschema`).
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

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        return self._tools

    def reset(self, prompt: str) -> str:
        try:
            self._box = Sandbox.create(self._policy, persistent=True, work_mb=self._work_mb)
        except OSError as err:
            raise EnvironmentFault(f"the environment could not be prepared: {err}") from err
        if self._setup is not None:
            result = self._box.exec(
                _program(self._setup, json.dumps({"prompt": prompt})), limits=SandboxLimits(timeout_s=30)
            )
            if result.outcome is not Outcome.OK:
                self.close()
                raise EnvironmentFault(
                    f"the environment's setup failed ({result.outcome}): {result.stderr[-300:]}"
                )
        return prompt

    def step(self, call: ParsedCall) -> Observation:
        if self._box is None:
            raise EnvironmentFault("step before reset: the environment is not prepared")
        tool = self._by_name.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._by_name))
            return Observation(
                call.id, f"error: there is no tool {call.name!r}; the tools are: {known}", True
            )
        problem = _bad_arguments(call.arguments, tool.parameters)
        if problem is not None:
            return Observation(call.id, f"error: {call.name} was called with bad arguments: {problem}", True)
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
        box, self._box = self._box, None
        return box.destroy() if box is not None else {}


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
