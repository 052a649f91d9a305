"""The environment protocol: an episode's tools, and what a tool call returns to the model.

An environment is made for one episode and closed with it:
- `reset(prompt)` prepares it for the task and returns what the model is told first;
- `step(call)` runs one tool call and returns an `Observation`. A tool that fails, hangs past its
  timeout or is called wrongly (an unknown name, arguments that are not JSON or do not match the
  tool's schema) returns an observation marked `error`: the model sees what went wrong, as a tool
  user would, and the episode goes on. Only the environment itself failing (it could not be
  prepared, its sandbox refused to run) raises `EnvironmentFault`, which the caller turns into an
  execution fault: retried, never a zero reward;
- `close()` destroys it and returns what it used; nothing of it outlives the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlsched.serve.tools import ParsedCall


class EnvironmentFault(RuntimeError):
    """The environment itself failed (preparation, its sandbox): an execution fault, retryable."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is told of it (OpenAI's function schema) and what runs it."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_s: float = 10.0

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class Observation:
    call_id: str
    text: str  # what the model reads next
    error: bool = False  # the call failed; `text` says how
    seconds: float = 0.0


class Environment(Protocol):
    @property
    def tools(self) -> tuple[ToolSpec, ...]: ...

    def reset(self, prompt: str) -> str:
        """Prepare for the task; what the model is told first (raises `EnvironmentFault`)."""
        ...

    def step(self, call: ParsedCall) -> Observation:
        """Run one tool call; its observation (an error observation when the call failed)."""
        ...

    def close(self) -> dict[str, Any]:
        """Destroy the environment; what it used."""
        ...
