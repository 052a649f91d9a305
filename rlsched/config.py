"""The one typed config tree: defaults in code, YAML overrides, `--set a.b.c=value` on top.

A job file is validated once, when it is loaded: every problem is reported together, each by its
dotted path with how to fix it, and then the tree is frozen. Nothing downstream re-checks or
mutates it. Depth stays at most three (`section.key` today).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from rlsched.errors import UserError
from rlsched.policy.verify import DispatchPolicy


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineKind(StrEnum):
    TORCH = "torch"
    VLLM = "vllm"  # the vLLM engine arrives with its own issue


class ModelConfig(_Section):
    checkpoint: Path | None = Field(None, description="checkpoint directory; unset = the shipped base model")
    template: str | None = Field(None, description="conversation template; unset = the checkpoint's own")


class EngineConfig(_Section):
    kind: EngineKind = EngineKind.TORCH
    max_batch: int = Field(256, ge=1, le=4096)
    use_cache: bool = True


class SamplingConfig(_Section):
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(8, ge=1)


class TaskKind(StrEnum):
    ADDITION = "addition"  # the shipped toy task (rlsched/rl/task.py)
    JSONL = "jsonl"  # your own prompts and references, one JSON object per line (task.path)


class TaskConfig(_Section):
    name: TaskKind = TaskKind.ADDITION
    path: Path | None = Field(None, description="the JSONL file of a jsonl task")
    digits: int = Field(3, ge=1, le=6)
    eval_size: int = Field(1024, ge=1)
    seed: int = 1234

    @model_validator(mode="after")
    def _path_matches_kind(self) -> TaskConfig:
        if self.name is TaskKind.JSONL and self.path is None:
            raise ValueError("task.path is required when task.name is 'jsonl'")
        if self.name is TaskKind.ADDITION and self.path is not None:
            raise ValueError("task.path is only for task.name 'jsonl'")
        return self


class GRPOConfig(_Section):
    steps: int = Field(200, ge=1, description="update steps at most")
    time_budget_s: float = Field(180.0, gt=0, description="stop updating after this many seconds")
    prompts_per_step: int = Field(32, ge=1)
    group_size: int = Field(8, ge=2, description="samples per prompt; advantages are relative within it")
    lr: float = Field(3e-4, gt=0)
    warmup_steps: int = Field(10, ge=0)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    kl_coef: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    verify_retries: int = Field(2, ge=0, description="retries of a verifier execution fault")


class EvalConfig(_Section):
    every_steps: int = Field(25, ge=1, description="held-out eval every N steps (the learning curve)")
    curve_size: int = Field(256, ge=16, description="eval problems per curve point (before/after use all)")


class PlacementStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class ClusterConfig(_Section):
    """The embedded local Ray cluster started when no `--address` is given (logical resources)."""

    num_cpus: int = Field(8, ge=1, description="logical CPUs; they need not exist physically")
    num_gpus: int = Field(0, ge=0)
    object_store_mb: int = Field(256, ge=64)


class TrainerConfig(_Section):
    ranks: int = Field(2, ge=1, description="training ranks, reserved together in one placement group")
    cpus_per_rank: float = Field(1.0, gt=0)
    gpus_per_rank: float = Field(0.0, ge=0)
    placement_strategy: PlacementStrategy = PlacementStrategy.STRICT_PACK
    placement_timeout_s: float = Field(30.0, gt=0, description="wait this long for the gang, then fail")


class RolloutConfig(_Section):
    instances: int = Field(2, ge=1)
    cpus_per_instance: float = Field(1.0, gt=0)
    max_staleness: int = Field(0, ge=0, description="versions a sample may lag the one being trained")


class VerifierConfig(_Section):
    kind: str = Field("exact_answer", description="a shipped kind, or 'module:callable' of your own")
    workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(0.5, gt=0)
    delay_s: float = Field(0.0, ge=0, description="extra seconds per verification (benchmarks)")
    dispatch: DispatchPolicy = DispatchPolicy.FIFO

    @field_validator("kind")
    @classmethod
    def _loadable(cls, kind: str) -> str:
        from verifiers.loading import VerifierSpecError, load_verifier

        try:
            load_verifier(kind)
        except VerifierSpecError as err:
            raise ValueError(str(err)) from None
        return kind


class ScheduleConfig(_Section):
    overlap: bool = Field(True, description="verify while generating; false = the sequential baseline")


class RunConfig(_Section):
    seed: int = 0
    threads: int = Field(2, ge=1)
    out_dir: Path = Path("runs/latest")


class JobConfig(_Section):
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    sampling: SamplingConfig = SamplingConfig()
    task: TaskConfig = TaskConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()
    cluster: ClusterConfig = ClusterConfig()
    trainer: TrainerConfig = TrainerConfig()
    rollout: RolloutConfig = RolloutConfig()
    verifier: VerifierConfig = VerifierConfig()
    schedule: ScheduleConfig = ScheduleConfig()

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        if self.engine.kind is EngineKind.VLLM:
            raise ValueError("engine.kind 'vllm' is not available yet; use 'torch'")
        if self.eval.curve_size > self.task.eval_size:
            raise ValueError("eval.curve_size cannot exceed task.eval_size")
        return self


_M = TypeVar("_M", bound=BaseModel)


# -- loading ---------------------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(
            f"config file {path} does not exist; pass a YAML file such as configs/jobs/quickstart.yaml"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        where = ""
        mark = getattr(err, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(
            f"{path} is not valid YAML{where}: {problem}. Check indentation and quoting there."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{path} must hold a mapping of sections (model:, grpo:, ...), not a {type(data).__name__}"
        )
    return data


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` (value parsed as a YAML scalar: 3, 0.5, true, text) in place."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, for example --set grpo.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {assignment!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _fix_hint(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling"
    if kind in ("missing",):
        return "required; add it"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, dict) else "a mapping"
    return f"{err['msg']} (got {shown})"


def _valid_keys(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    model: type[BaseModel] = root
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        model = ann
    return ", ".join(model.model_fields)


def format_validation_error(source: str, err: ValidationError, root: type[BaseModel] | None = None) -> str:
    lines = [f"{source} has {err.error_count()} problem(s):"]
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) for p in loc) or "(top level)"
        hint = _fix_hint(e)
        if e["type"] == "extra_forbidden":
            keys = _valid_keys(loc, root or JobConfig)
            hint += f"; valid keys here: {keys}" if keys else ""
        lines.append(f"  {path}: {hint}")
    return "\n".join(lines)


def _load(root: type[_M], path: Path | str | None, overrides: list[str] | None) -> _M:
    tree = _read_yaml(Path(path)) if path is not None else {}
    for assignment in overrides or []:
        apply_override(tree, assignment)
    try:
        return root.model_validate(tree)
    except ValidationError as err:
        raise UserError(format_validation_error(str(path or "the config"), err, root)) from None


def load_config(path: Path | str | None, overrides: list[str] | None = None) -> JobConfig:
    """Defaults, then the YAML file (if any), then each `--set`; validated once and frozen."""
    return _load(JobConfig, path, overrides)


# -- simulator scenarios ---------------------------------------------------------------------------


class DistConfig(_Section):
    """A duration distribution in seconds: constant(a), uniform(a, b), lognormal(mean a, sigma b)."""

    kind: Literal["constant", "uniform", "lognormal"] = "constant"
    a: float = Field(1.0, ge=0, description="constant value, uniform low, or lognormal mean")
    b: float = Field(0.0, ge=0, description="uniform high, or lognormal sigma")

    @model_validator(mode="after")
    def _ordered(self) -> DistConfig:
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError("uniform needs a <= b (low a, high b)")
        return self


class SimJobConfig(_Section):
    iterations: int = Field(10, ge=1)
    samples: int = Field(256, ge=1, description="samples per iteration")
    instances: int = Field(2, ge=1)
    slots: int = Field(64, ge=1, description="sequences one instance generates at once")
    workers: int = Field(4, ge=1, description="verifier workers")
    update_s: float = Field(0.5, ge=0)
    publish_s: float = Field(0.01, ge=0)
    overlap: bool = True


class ScenarioConfig(_Section):
    job: SimJobConfig = SimJobConfig()
    generate: DistConfig = DistConfig(kind="uniform", a=0.1, b=0.5)
    verify: DistConfig = DistConfig(kind="constant", a=0.01)
    policies: tuple[DispatchPolicy, ...] = (DispatchPolicy.FIFO,)
    seeds: int = Field(5, ge=1)


def load_scenario(path: Path | str | None, overrides: list[str] | None = None) -> ScenarioConfig:
    return _load(ScenarioConfig, path, overrides)
