"""The one typed config tree: defaults in code, YAML overrides, `--set a.b.c=value` on top.

A job file is validated once, when it is loaded: every problem is reported together, each by its
dotted path with how to fix it, and then the tree is frozen. Nothing downstream re-checks or
mutates it. Depth stays at most three (`section.key` today). How a tree is read, overridden and
validated is `rlsched.config_load`, shared with the simulator's scenarios and the admin's file.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from rlsched.config_agent import AgentConfig
from rlsched.config_load import Section, load_tree
from rlsched.policy.bandwidth import RelayParams
from rlsched.policy.lifecycle import Leave
from rlsched.policy.timeouts import TimeoutParams
from rlsched.policy.verify import DispatchPolicy
from rlsched.policy.versions import InflightUpdate, PipelineMode, SwapKV, pipeline_problem
from rlsched.transfer.plane import Plane
from verifiers.protocol import RewardRange
from verifiers.sandbox import Isolation, SandboxPolicy
from verifiers.sandbox_types import Opening

UNSHAPED_GBPS = 10.0  # what the relay plan assumes of a link left unshaped


class EngineKind(StrEnum):
    TORCH = "torch"
    VLLM = "vllm"  # rlsched/engine/vllm.py: vLLM's AsyncLLM in each rollout instance


class ModelConfig(Section):
    checkpoint: Path | None = Field(
        None,
        description="a Hugging Face causal LM directory; unset = the shipped base model",
    )
    template: str | None = Field(
        None,
        description="an MLC template (configs/templates/); unset = the checkpoint's chat template",
    )


class EngineDType(StrEnum):
    AUTO = "auto"  # bfloat16 where computed natively (a GPU, a CPU with AVX-512 BF16/AMX), else float32
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class EngineConfig(Section):
    kind: EngineKind = Field(
        EngineKind.TORCH,
        description="the rollout engine: torch (in-process, any HF causal LM) or vllm (needs the vllm extra)",
    )
    max_batch: int = Field(256, ge=1, le=4096, description="requests decoded at once by one engine")
    dtype: EngineDType = Field(EngineDType.AUTO, description="the torch engine's compute dtype")
    use_cache: bool = Field(
        True, description="false: recompute every sequence whole at each step (a slow baseline)"
    )
    batch_invariant: bool = Field(
        False,
        description="the torch engine gives a request the same tokens and log-probs in any batch, so a "
        "recovered run's curve equals the uninterrupted one's (a step of 1-3 rows costs 4 rows' time)",
    )


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="softmax temperature; 0 decodes greedily")
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="nucleus sampling: keep the smallest set of tokens with this much probability",
    )
    top_k: int = Field(0, ge=0, description="keep only the k likeliest tokens (0: all)")
    max_tokens: int = Field(8, ge=1, description="tokens generated per sample at most")
    ignore_eos: bool = Field(
        False, description="generate max_tokens every time (vLLM's ignore_eos: fixed lengths for benchmarks)"
    )


class TaskKind(StrEnum):
    ADDITION = "addition"  # the shipped toy task (rlsched/rl/task.py)
    JSONL = "jsonl"  # your own prompts and references, one JSON object per line (task.path)
    DATASET = "dataset"  # rows of JSONL, Parquet or a saved Hugging Face dataset (rlsched/rl/datasets.py)
    ARITHMETIC = "arithmetic"  # generated word problems for the `math` verifier (rlsched/rl/word_problems.py)


class TaskFormat(StrEnum):
    AUTO = "auto"  # from the path: *.jsonl, *.parquet, a save_to_disk directory, a directory of shards
    JSONL = "jsonl"
    PARQUET = "parquet"  # one file, or a directory of shards
    HF_DISK = "hf_disk"  # a directory written by Dataset.save_to_disk or DatasetDict.save_to_disk


class ArithmeticLevel(StrEnum):
    STARTER = "starter"  # addition and subtraction of numbers up to 20, one step, the number only
    EASY = "easy"  # two-digit addition and subtraction, one step
    MEDIUM = "medium"  # up to three digits, and a one-digit times a two-digit number; one step
    HARD = "hard"  # medium's problems and two-step ones


class TaskColumns(Section):
    """Which column of a dataset plays which part. Unset optional columns are used when the data has
    a column of their own name (`id`, `verifier`); a column named here must exist."""

    prompt: str | None = Field(None, description="the user message; unset: 'prompt' (unless messages is set)")
    messages: str | None = Field(None, description="a conversation to continue: [{role, content}, ...]")
    reference: str = Field("reference", description="the reference answer the verifier judges against")
    verifier: str | None = Field(None, description="each row's verifier kind; unset: 'verifier' if present")
    id: str | None = Field(None, description="each row's id; unset: 'id' if present, else its position")
    split: str | None = Field(None, description="a column naming each row's split (with task.eval_split)")

    @model_validator(mode="after")
    def _one_prompt(self) -> TaskColumns:
        if self.prompt is not None and self.messages is not None:
            raise ValueError("give one of prompt and messages, not both")
        return self

    @property
    def prompt_column(self) -> str | None:
        """The prompt column in use: None when the prompt is a messages column."""
        return None if self.messages is not None else (self.prompt or "prompt")


# which TaskConfig keys each kind reads; a key set for another kind is refused, not ignored
_TASK_KEYS: dict[TaskKind, frozenset[str]] = {
    TaskKind.ADDITION: frozenset({"digits"}),
    TaskKind.JSONL: frozenset({"path"}),
    TaskKind.DATASET: frozenset({"path", "format", "columns", "train_split", "eval_split"}),
    TaskKind.ARITHMETIC: frozenset({"level", "train_size"}),
}


def _keys_for_other_kinds(name: TaskKind, given: dict[str, Any]) -> str | None:
    """What is wrong when a task key meant for another kind is given a value (it would be ignored).
    A key at its default is let through, so that a dumped config loads again."""
    foreign = sorted(
        k
        for k, value in given.items()
        if k not in _TASK_KEYS[name]
        and any(k in keys for keys in _TASK_KEYS.values())
        and value != TaskConfig.model_fields[k].default
    )
    if not foreign:
        return None
    owners = {k: " or ".join(f"'{kind}'" for kind, keys in _TASK_KEYS.items() if k in keys) for k in foreign}
    shown = "; ".join(f"task.{k} is only for task.name {owners[k]}" for k in foreign)
    return f"{shown}; remove it or change task.name (now '{name}')"


class TaskConfig(Section):
    name: TaskKind = Field(
        TaskKind.ADDITION,
        description="the task: addition, word_problems, arithmetic, jsonl (task.path) or dataset "
        "(a local HF dataset at task.path)",
    )
    path: Path | None = Field(None, description="a jsonl task's file; a dataset task's file or directory")
    format: TaskFormat = Field(TaskFormat.AUTO, description="dataset only: how to read task.path")
    columns: TaskColumns = Field(TaskColumns(), description="dataset only: the column of each part")
    train_split: str = Field("train", description="dataset only: the split trained on, where it has splits")
    eval_split: str | None = Field(
        None, description="dataset only: the split held out; unset: eval_size rows drawn with task.seed"
    )
    digits: int = Field(3, ge=1, le=6, description="addition: digits per operand")
    level: ArithmeticLevel = Field(ArithmeticLevel.EASY, description="arithmetic only: how hard")
    train_size: int = Field(2048, ge=1, description="arithmetic only: distinct training problems")
    eval_size: int = Field(1024, ge=1, description="held-out problems in each evaluation")
    seed: int = Field(1234, description="seed of the task's problem draws (train and held-out sets)")
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="the rewards its verifier may give, [low, high]: any other (or a non-finite one) "
        "never reaches training (a verifier's is a fault, an endpoint client's a 4xx)",
    )

    def rewards(self) -> RewardRange:
        return RewardRange(*self.reward_range)

    @field_validator("reward_range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        RewardRange(*value)  # raises ValueError naming the rule
        return value

    @model_validator(mode="after")
    def _keys_match_kind(self) -> TaskConfig:
        if self.name in (TaskKind.JSONL, TaskKind.DATASET) and self.path is None:
            raise ValueError(f"task.path is required when task.name is '{self.name}'")
        given = {k: getattr(self, k) for k in self.model_fields_set}
        if (misplaced := _keys_for_other_kinds(self.name, given)) is not None:
            raise ValueError(misplaced)
        if self.eval_split == self.train_split:
            raise ValueError(
                f"task.eval_split and task.train_split are both {self.train_split!r}: the held-out rows "
                "would be trained on; name another split"
            )
        if self.columns.split is not None and self.eval_split is None:
            raise ValueError(
                f"task.columns.split ({self.columns.split!r}) needs task.eval_split: the value that "
                "marks held-out rows (rows marked task.train_split are trained on)"
            )
        return self


class Correction(StrEnum):
    """How the GRPO loss accounts for samples generated by an older policy (`rlsched.rl.grpo`)."""

    BEHAVIOUR = "behaviour"  # PPO's clipped ratio against the behaviour log-probs the engine reported
    NONE = "none"  # PPO's clipped ratio against the proximal policy; staleness ignored (the ablation)
    TRUNCATED_IS = "truncated_is"  # policy gradient weighted by min(pi / pi_behaviour, cap), no clip
    DECOUPLED = "decoupled"  # AReaL: clip pi / pi_proximal, weight by min(pi_proximal / pi_behaviour, cap)


class GRPOConfig(Section):
    steps: int = Field(200, ge=1, description="update steps at most")
    time_budget_s: float = Field(180.0, gt=0, description="stop updating after this many seconds")
    prompts_per_step: int = Field(
        32, ge=1, description="training prompts per iteration (each sampled group_size times)"
    )
    group_size: int = Field(8, ge=2, description="samples per prompt; advantages are relative within it")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate")
    warmup_steps: int = Field(10, ge=0, description="steps of linear learning-rate warm-up")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1 (1 - clip_low)")
    clip_high: float = Field(
        0.28, ge=0, description="PPO ratio clip above 1 (1 + clip_high; DAPO's clip-higher)"
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL penalty to the starting policy (0: none)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients are clipped to this global norm")
    verify_retries: int = Field(2, ge=0, description="retries of a verifier execution fault")
    minibatches: int = Field(
        1, ge=1, description="optimizer steps per batch (PPO-style): the batch split into this many parts"
    )
    correction: Correction = Field(
        Correction.BEHAVIOUR,
        description="off-policy correction: behaviour (PPO against the engine's log-probs; at one "
        "minibatch it keeps async's pass rate with sync's), none (against the proximal policy, the "
        "ablation), truncated_is, or decoupled (binds from the second minibatch; docs/async.md)",
    )
    importance_cap: float = Field(
        5.0,
        gt=1.0,
        description="truncated_is and decoupled: importance weights are capped here (docs/async.md: "
        "2 held the quickstart's async pass rate 10-20 points below sync's)",
    )

    @model_validator(mode="after")
    def _minibatches_fit(self) -> GRPOConfig:
        samples = self.prompts_per_step * self.group_size
        if self.minibatches > samples:
            raise ValueError(
                f"minibatches ({self.minibatches}) is more than the {samples} samples of a batch "
                "(prompts_per_step x group_size); lower it"
            )
        return self


class EvalConfig(Section):
    every_steps: int = Field(25, ge=1, description="held-out eval every N steps (the learning curve)")
    curve_size: int = Field(256, ge=16, description="eval problems per curve point (before/after use all)")
    retries: int = Field(
        2, ge=0, description="reruns of an evaluation that lost an instance (on its replacement)"
    )


class PlacementStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class ClusterConfig(Section):
    """The embedded local Ray cluster started when no `--address` is given (logical resources)."""

    num_cpus: int = Field(8, ge=1, description="logical CPUs; they need not exist physically")
    num_gpus: int = Field(0, ge=0, description="GPUs the embedded cluster declares")
    object_store_mb: int = Field(256, ge=64, description="the embedded cluster's object store")


class Precision(StrEnum):
    """`trainer.precision`, resolved per device by `rlsched.model.precision.train_precision`."""

    AUTO = "auto"  # bf16 where the device computes BF16 natively (a GPU, AVX-512 BF16 or AMX), else fp32
    FP32 = "fp32"
    BF16 = "bf16"  # BF16 autocast over fp32 master weights, even where BF16 is emulated (with a warning)


class TrainStrategy(StrEnum):
    """How the ranks hold the policy (`rlsched.rl.sharding`)."""

    REPLICATE = "replicate"  # a full replica per rank, gradients all-reduced
    FSDP = "fsdp"  # FSDP2: parameters, gradients and optimizer state sharded across the ranks


class TrainerConfig(Section):
    ranks: int = Field(2, ge=1, description="training ranks, reserved together in one placement group")
    strategy: TrainStrategy = Field(
        TrainStrategy.REPLICATE,
        description="replicate (a full copy per rank) or fsdp (FSDP2 shards per decoder layer)",
    )
    offload: bool = Field(
        False, description="fsdp only: keep the shards and optimizer state in host memory (GPU ranks)"
    )
    collective_timeout_s: float = Field(
        300.0,
        gt=0,
        description="a collective that waits longer than this for a peer fails the step, naming the rank",
    )
    precision: Precision = Field(
        Precision.AUTO,
        description="auto (bf16 where the device computes BF16 natively, else fp32), fp32, or bf16 "
        "autocast with fp32 masters",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass")
    micro_batch_tokens: int = Field(
        16384, ge=64, description="padded tokens per forward/backward; gradients accumulate over them"
    )
    cpus_per_rank: float = Field(1.0, gt=0, description="CPUs each training rank holds")
    gpus_per_rank: float = Field(0.0, ge=0, description="GPUs each training rank holds")
    placement_strategy: PlacementStrategy = Field(
        PlacementStrategy.STRICT_PACK,
        description="Ray placement of the ranks' bundles: STRICT_PACK (one node), PACK, SPREAD "
        "or STRICT_SPREAD",
    )
    placement_timeout_s: float = Field(30.0, gt=0, description="wait this long for the gang, then fail")
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="more resources each rank's bundle reserves, e.g. a device type {H100: 1}",
    )

    @property
    def sharded(self) -> bool:
        return self.strategy is TrainStrategy.FSDP

    @model_validator(mode="after")
    def _offload_needs_shards(self) -> TrainerConfig:
        if self.offload and self.strategy is not TrainStrategy.FSDP:
            raise ValueError(
                "offload moves FSDP shards to host memory; set trainer.strategy=fsdp, or drop trainer.offload"
            )
        if self.offload and self.gpus_per_rank == 0:
            raise ValueError(
                "offload moves a GPU rank's shards to host memory, and these ranks have no GPU "
                "(trainer.gpus_per_rank=0): their shards are in host memory already; drop trainer.offload"
            )
        return self


class TransientInstance(Section):
    """A rollout instance available for a window, like spot capacity. Times count from the start of
    generation in iteration `join_iteration`; it is reclaimed `available_s` after it was granted
    (preparation included), or `reclaim_at_s` into iteration `reclaim_iteration`'s generation."""

    join_iteration: int = Field(1, ge=1, description="the iteration whose generation it joins in")
    join_at_s: float = Field(0.0, ge=0, description="seconds into that iteration's generation")
    available_s: float | None = Field(None, gt=0, description="the window's length; unset: it stays")
    reclaim_iteration: int | None = Field(
        None, ge=1, description="the iteration in which it is reclaimed (instead of available_s)"
    )
    reclaim_at_s: float = Field(0.0, ge=0, description="seconds into that iteration's generation")
    leave: Leave = Field(
        Leave.PREEMPTED,
        description="how it goes: preempted (killed; its requests resume elsewhere) or draining "
        "(finishes first)",
    )
    receiver_gbps: float | None = Field(
        None, gt=0, description="its ingress link; unset: weights.receiver_gbps"
    )

    @model_validator(mode="after")
    def _one_end(self) -> TransientInstance:
        if self.available_s is not None and self.reclaim_iteration is not None:
            raise ValueError("give available_s or reclaim_iteration, not both")
        if self.reclaim_iteration is not None and self.reclaim_iteration < self.join_iteration:
            raise ValueError(
                f"reclaim_iteration {self.reclaim_iteration} comes before "
                f"join_iteration {self.join_iteration}"
            )
        return self


class ContentTokens(StrEnum):
    """How a special token's string inside a message's content is encoded (rlsched.model.content)."""

    TEXT = "text"  # as plain text: a message cannot close its turn or open another role's
    CONTROL = "control"  # as the special token itself, as vLLM's server and transformers do


class EndpointConfig(Section):
    """The OpenAI-compatible HTTP endpoint over the rollout fleet (`rlsched serve`, docs/endpoint.md)."""

    enabled: bool = Field(
        False,
        description="start the endpoint with the job, over its rollout fleet; its rewarded episodes join "
        "each iteration's training batch",
    )
    host: str = Field("127.0.0.1", description="the address it binds; 0.0.0.0 serves other machines too")
    port: int = Field(8000, ge=0, le=65535, description="its port (0: any free one, printed at start)")
    api_key: str | None = Field(
        None, description="when set, requests must carry `Authorization: Bearer <api_key>` (else 401)"
    )
    model_name: str | None = Field(None, description="the model name it serves; unset: the checkpoint's")
    timeout_s: float = Field(600.0, gt=0, description="a request still running after this is aborted (504)")
    max_waiting: int = Field(
        256, ge=1, description="requests waiting for a busy engine row beyond which new ones get 429"
    )
    max_per_client: int = Field(
        0, ge=0, description="requests one client (`user`, else its key) may have running (0: no limit)"
    )
    max_body_mb: float = Field(
        8.0, gt=0, description="a request body larger than this is refused with 413 before it is read"
    )
    special_tokens_in_content: ContentTokens = Field(
        ContentTokens.TEXT,
        description="text: a special token's string in a message (`<|im_end|>`) is encoded as text, so a "
        "client cannot forge a turn; control: as the token itself (vLLM's behaviour)",
    )
    reward_timeout_s: float = Field(
        600.0, gt=0, description="an ended episode whose reward has not come by then is dropped (counted)"
    )
    train_mixed: bool = Field(
        False,
        description="train episodes sampled by more than one weight version (with each token's behaviour "
        "log-prob); false: leave them out, counted",
    )


class RolloutConfig(Section):
    endpoint: EndpointConfig = EndpointConfig()
    instances: int = Field(2, ge=1, description="static rollout instances, started with the job")
    cpus_per_instance: float = Field(1.0, gt=0, description="CPUs each instance holds")
    max_staleness: int = Field(0, ge=0, description="versions a sample may lag the one being trained")
    inflight_update: InflightUpdate = Field(
        InflightUpdate.FINISH,
        description="async: a version that reaches a busy instance: finish (its running requests end on "
        "the version they began with, then it pulls) or swap (pulled while they run and swapped in between "
        "two decoding steps; torch engine only, vllm falls back to finish)",
    )
    swap_kv: SwapKV = Field(
        SwapKV.RECOMPUTE,
        description="after an in-flight swap: recompute the running requests' keys and values under the "
        "new weights, or keep the old ones (an approximation; scripts/bench_inflight.py measures its drift)",
    )
    request_batch: int = Field(
        16, ge=1, description="requests handed to an instance at a time; a joiner takes from what is left"
    )
    transient: list[TransientInstance] = Field(default_factory=list)
    resources: dict[str, float] = Field(
        default_factory=dict, description="more resources each instance reserves, e.g. a device type"
    )
    elastic: int = Field(
        0, ge=0, description="instances asked of the cluster scheduler where room is left, taken back first"
    )
    resume_setup_s: float = Field(0.0, ge=0, description="what resuming costs beyond the prefill")
    prefill_tokens_per_s: float = Field(2000.0, gt=0, description="for the resume-or-restart choice")
    decode_tokens_per_s: float = Field(200.0, gt=0, description="for the resume-or-restart choice")


class WeightsConfig(Section):
    """How each version travels from the trainer's rank 0 to the rollout instances (rlsched/transfer)."""

    plane: Plane = Field(
        Plane.TCP, description="the data plane of the weight service: tcp (raw socket) or grpc (messages)"
    )
    egress_gbps: float | None = Field(None, gt=0, description="the sender's link; unset: unshaped")
    receiver_gbps: float | None = Field(None, gt=0, description="each instance's ingress; unset: uncapped")
    chunk_kb: int = Field(4096, ge=4, description="bytes per verified chunk, in KiB")
    keep_versions: int = Field(2, ge=1, description="versions the service holds for late pullers")
    relay: bool = Field(
        False,
        description="instances relay each version to their peers as it arrives (pipelined chains at a "
        "reload, holders and pullers for a joiner), leaving the sender's egress to the others",
    )
    upload_gbps: float | None = Field(
        None,
        ge=0,
        description="each instance's upload when it relays; unset: its receiver_gbps (a symmetric link)",
    )
    staged_load: bool = Field(
        True,
        description="load each tensor as its bytes are verified and swap the version in at once "
        "(torch engine); false: load after the whole file is in",
    )
    pull_retries: int = Field(
        1, ge=0, description="pulls again of a version whose bytes or load an instance cannot confirm"
    )

    @model_validator(mode="after")
    def _relay_uploads(self) -> WeightsConfig:
        self.relay_params()  # `RelayParams` refuses an upload of 0, naming the fix
        return self

    def relay_params(self) -> RelayParams | None:
        """The fleet core's relay parameters (None: the sender alone). Unshaped links plan as if
        every link ran at 10 Gbit/s (the plan is one chain whenever uploads match the egress)."""
        if not self.relay:
            return None
        egress = (self.egress_gbps or UNSHAPED_GBPS) * 1e9
        upload = self.upload_gbps if self.upload_gbps is not None else self.receiver_gbps or egress / 1e9
        return RelayParams(upload * 1e9, egress, self.chunk_kb << 10)


class StoreConfig(Section):
    """Durable partial outputs (rlsched/store): SQLite in WAL mode."""

    path: Path | None = Field(None, description="the SQLite file; unset: partial.sqlite in the run's out_dir")
    flush_s: float = Field(0.25, gt=0, description="how often running requests' new tokens are saved")
    enabled: bool = Field(
        True, description="save partial outputs, so a reclaimed instance's requests resume from their tokens"
    )


class TimeoutConfig(Section):
    """Per-key adaptive verification timeouts (RollPacker's rule, `rlsched.policy.timeouts`): a run
    is stopped at min(max(floor_s, factor x the longest recent correct run of its problem), cap_s),
    at cap_s before any correct run, and never later than hard_cap_s. cap_s is the time limit: a
    sandboxed run stopped there is a wrong answer (reward 0); one stopped earlier by the adaptive
    timeout is an execution fault, retried with the whole limit. The sandbox stops a run at its
    timeout; the worker is killed grace_s later, if it has not answered by then."""

    floor_s: float = Field(2.0, gt=0, description="no timeout shorter than this")
    factor: float = Field(1.5, ge=1.0, description="times the longest recent correct run of the problem")
    cap_s: float = Field(
        30.0, gt=0, description="no timeout longer than this (and the timeout before any correct run)"
    )
    hard_cap_s: float = Field(
        120.0, gt=0, description="the bound nothing passes, whatever the other three say"
    )
    grace_s: float = Field(
        5.0,
        ge=0,
        description="a worker is killed this long after its run's timeout: a sandboxed verifier stops "
        "the run at the timeout itself and reports (a run past the limit, cap_s, is a wrong answer)",
    )

    def params(self) -> TimeoutParams:
        return TimeoutParams(self.floor_s, self.factor, self.cap_s, self.hard_cap_s)

    @model_validator(mode="after")
    def _ordered(self) -> TimeoutConfig:
        try:
            self.params()  # one rule, kept with the policy
        except ValueError as err:
            raise ValueError(f"{err}; got {self.floor_s}, {self.cap_s}, {self.hard_cap_s}") from None
        return self


class SandboxConfig(Section):
    """Where untrusted code runs (`verifiers/sandbox.py`): a minimal root, namespaces, a cgroup and a
    uid of its own per run."""

    isolation: Isolation | None = Field(
        None,
        description="strict: refuse to run when a namespace, a cgroup controller or per-run uids are "
        "missing; best_effort: run anyway and name what is missing in every outcome; unset: strict "
        "where the machine allows it, best_effort (with the missing isolation named) elsewhere",
    )
    read_only: list[str] = Field(
        [],
        description="extra host paths the program may read (a dataset, a package directory), bound "
        "read-only at the same path inside; HOST:INSIDE to put one elsewhere",
    )

    allow: list[Opening] = Field(
        [],
        description="what the system-call filter denies (as Docker's default profile does) that these "
        "programs need: io_uring, netlink (sockets to the kernel), vsock (to the hypervisor)",
    )

    def policy(self) -> SandboxPolicy:
        return SandboxPolicy.from_specs(self.isolation, self.read_only, self.allow)

    @model_validator(mode="after")
    def _paths(self) -> SandboxConfig:
        if (problem := self.policy().check()) is not None:
            raise ValueError(problem)
        return self


class VerifierConfig(Section):
    kind: str = Field("exact_answer", description="a shipped kind, or 'module:callable' of your own")
    workers: int = Field(2, ge=1, description="CPU verifier workers (one Ray actor each)")
    cpus_per_worker: float = Field(0.5, gt=0, description="CPUs each worker holds")
    delay_s: float = Field(0.0, ge=0, description="extra seconds per verification (benchmarks)")
    dispatch: DispatchPolicy = Field(
        DispatchPolicy.FIFO, description="the dispatch policy: fifo, sjf, lrpt or distrs (batch deadlines)"
    )
    order_generation: bool = Field(
        True,
        description="distrs only: generate problems with the longest expected verification first",
    )
    gpu_workers: int = Field(
        0,
        ge=0,
        description="workers holding one GPU each for the GPU stage of two-stage verifiers (cuda): "
        "the CPU stage runs on the CPU workers, one verification per GPU at a time",
    )
    preempt: bool = Field(
        False,
        description="distrs only: urgent work may stop a running verification of a batch whose training "
        "group costs less idle; the stopped one is requeued and runs again from the start",
    )
    timeout: TimeoutConfig = TimeoutConfig()
    sandbox: SandboxConfig = SandboxConfig()
    heartbeat_s: float = Field(2.0, gt=0, description="how often a busy worker is asked how it is doing")
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, description="a busy worker silent this long is declared lost: killed, its work requeued"
    )

    @field_validator("kind")
    @classmethod
    def _loadable(cls, kind: str) -> str:
        from verifiers.loading import VerifierSpecError, load_verifier

        try:
            load_verifier(kind)
        except VerifierSpecError as err:
            raise ValueError(str(err)) from None
        return kind


class ScheduleConfig(Section):
    overlap: bool = Field(True, description="verify while generating; false = the sequential baseline")
    mode: PipelineMode = Field(
        PipelineMode.SYNC,
        description="sync: generate, update, publish one after another; async: generation runs ahead of "
        "training by up to rollout.max_staleness versions (docs/async.md)",
    )
    buffer_groups: int | None = Field(
        None, ge=1, description="async: judged groups that may wait for the trainer (unset: one batch)"
    )


class CheckpointConfig(Section):
    """Checkpoints of the training state, and the commit log beside them (docs/durability.md)."""

    every: int = Field(
        10, ge=0, description="checkpoint every N iterations (0: only at the end and when stopped)"
    )
    dir: Path | None = Field(None, description="where checkpoints go; unset: out_dir/checkpoints")
    upload_to: Path | None = Field(
        None, description="a second location each checkpoint is copied to in the background (object storage)"
    )
    keep: int = Field(2, ge=1, description="checkpoints kept; older ones go once a newer one is durable")
    hf: bool = Field(True, description="each checkpoint also holds the BF16 policy as a Hugging Face dir")
    max_recoveries: int = Field(
        3, ge=0, description="times a failed training group is rebuilt from the last checkpoint (0: stop)"
    )


class TrackingConfig(Section):
    """Where the metrics rows go besides metrics.jsonl (rlsched/metrics/tracking.py)."""

    tensorboard: bool = Field(True, description="TensorBoard event files in out_dir/tensorboard")
    wandb: bool = Field(False, description="log to Weights & Biases (pip install wandb; WANDB_* env vars)")
    mlflow: bool = Field(False, description="log to MLflow (pip install mlflow; MLFLOW_TRACKING_URI)")
    project: str = Field("rlsched", description="the W&B project, or the MLflow experiment")
    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="serve the newest row at http://HOST:PORT/metrics (0: any port)"
    )
    prometheus_host: str = Field("127.0.0.1", description="the Prometheus endpoint's address")


class RunConfig(Section):
    seed: int = Field(0, description="seed of the whole run: prompts, sampling, initialisation")
    threads: int = Field(2, ge=1, description="torch threads in this process")
    out_dir: Path = Field(
        Path("runs/latest"), description="where the run writes its records, report and checkpoint"
    )
    record_fleet: bool = Field(
        False,
        description="keep every event the rollout fleet's core is fed and the effects it returned, in "
        "fleet_trace.pkl in the out dir: the record rlsched.sim.replay replays in virtual time",
    )
    record_iterations: bool = Field(
        False,
        description="keep every event the iteration's core is fed and the effects it returned, in "
        "iteration_trace.pkl in the out dir: the record the simulator's and --local's cores replay",
    )


class JobConfig(Section):
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
    weights: WeightsConfig = WeightsConfig()
    store: StoreConfig = StoreConfig()
    verifier: VerifierConfig = VerifierConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    tracking: TrackingConfig = TrackingConfig()
    agent: AgentConfig = AgentConfig()

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        if self.eval.curve_size > self.task.eval_size:
            raise ValueError("eval.curve_size cannot exceed task.eval_size")
        batch = self.grpo.prompts_per_step
        problem = pipeline_problem(
            self.schedule.mode,
            self.rollout.max_staleness,
            self.schedule.buffer_groups or batch,
            batch,
            ("rollout.max_staleness", "schedule.buffer_groups"),
        )
        if problem is not None:
            raise ValueError(f"schedule.mode: {problem}")
        if self.schedule.mode is PipelineMode.ASYNC and self.rollout.endpoint.enabled:
            raise ValueError(
                "schedule.mode async does not serve the OpenAI endpoint yet (its episodes stay pinned to a "
                "version); run the endpoint with mode sync"
            )
        if self.rollout.endpoint.enabled and self.engine.kind is EngineKind.VLLM:
            raise ValueError(
                "rollout.endpoint streams from torch rollout instances; with engine.kind vllm, serve "
                "beside the job with `rlsched serve CHECKPOINT --engine vllm`"
            )
        return self


def load_config(path: Path | str | None, overrides: list[str] | None = None) -> JobConfig:
    """Defaults, then the YAML file (if any), then each `--set`; validated once and frozen."""
    return load_tree(JobConfig, path, overrides)
