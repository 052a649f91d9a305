"""The `agent` section of a job: multi-turn episodes with tools, declared in the job's YAML.

A job with tools (`agent.tools` not empty) generates episodes instead of single replies: the model
may call a tool, read its result, and go on, until it answers without a call or an episode limit
ends it (`rlsched.rl.agent`). Each tool is a Python program run in its environment's sandbox, told
to the model as an OpenAI function schema. Environments are named (`agent.environments`); each tool
names the one it runs in, so an episode may use several kinds (a calculator beside a lookup table),
each prepared the first time the episode calls one of its tools.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import Field, field_validator, model_validator

from rlsched.config_load import Section
from rlsched.policy.environments import EnvPolicy

# prefix-cache blocks (16 tokens each) a multi-turn job's engines keep: each turn's prompt extends the
# last turn's prompt and reply, so its keys and values are reused, not computed again
PREFIX_CACHE_BLOCKS = 512

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


class ToolConfig(Section):
    name: str = Field(description="the function's name, as the model calls it")
    description: str = Field("", description="what the model is told the tool does")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="its arguments' JSON schema (a call that breaks it gets an error observation)",
    )
    program: str | None = Field(None, description="Python source: reads `args` (a dict), prints the result")
    program_file: Path | None = Field(None, description="the program in a file instead (relative to the cwd)")
    environment: str = Field("default", description="the agent.environments entry it runs in")
    timeout_s: float = Field(10.0, gt=0, description="a call still running after this is stopped")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"tool name {name!r}: use letters, digits, '_' and '-' (64 at most)")
        return name

    @field_validator("parameters")
    @classmethod
    def _schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as err:
            raise ValueError(f"not a valid JSON schema: {err.message}") from None
        return schema

    @model_validator(mode="after")
    def _one_program(self) -> ToolConfig:
        if (self.program is None) == (self.program_file is None):
            raise ValueError(f"tool {self.name}: give its program or its program_file, one of them")
        return self

    def source(self) -> str:
        """The program's source (read from `program_file` where it is set)."""
        if self.program is not None:
            return self.program
        assert self.program_file is not None
        return self.program_file.read_text()


class EnvironmentConfig(Section):
    setup: str | None = Field(
        None, description="Python source run when it is prepared (the task's prompt in args['prompt'])"
    )
    work_mb: int = Field(64, ge=1, description="its work directory's size (a tmpfs where it can mount one)")


class AgentConfig(Section):
    """Multi-turn episodes with tools; off while `tools` is empty."""

    tools: list[ToolConfig] = Field(default_factory=list)
    environments: dict[str, EnvironmentConfig] = Field(
        default_factory=lambda: {"default": EnvironmentConfig()},
        description="the kinds of environment the tools run in, by name",
    )
    policy: EnvPolicy = Field(
        EnvPolicy.RESIDENT,
        description="resident: an environment lives the whole episode; rebuild: it is released after "
        "each tool call, its files kept outside, and rebuilt for the next; prewarm: as rebuild, but the "
        "kind the episode is expected to call next starts preparing before its model turn ends",
    )
    prewarm_lead_s: float | None = Field(
        None,
        ge=0,
        description="prewarm: start preparing this long before the model turn is expected to end "
        "(null: the kind's mean preparation time so far, the shortest lead that hides it)",
    )
    chat_template: Path | None = Field(
        None, description="a Jinja chat template that renders tools, where the checkpoint's does not"
    )
    max_turns: int = Field(4, ge=1, description="model turns per episode at most")
    max_tokens: int = Field(512, ge=1, description="tokens per episode after its first prompt, at most")
    max_wall_s: float = Field(120.0, gt=0, description="an episode still running after this is ended")
    train_truncated: bool = Field(
        False, description="train on episodes a limit ended (scored as they stand); false: left out"
    )
    env_retries: int = Field(2, ge=0, description="retries of an environment that fails (never a 0 reward)")

    @property
    def enabled(self) -> bool:
        return bool(self.tools)

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        names = [t.name for t in self.tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tools named twice: {', '.join(twice)}")
        unknown = sorted({t.environment for t in self.tools} - set(self.environments))
        if unknown:
            raise ValueError(
                f"tools run in environments not declared under agent.environments: {', '.join(unknown)}"
            )
        return self
