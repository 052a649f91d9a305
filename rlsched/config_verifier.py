"""The `verifier` section of a job: how samples are judged, and where.

The verifier kind and its worker pool (`VerifierConfig`: workers, dispatch policy, retries), the
timeouts that stop a run (`TimeoutConfig`: adaptive per key, RollPacker's rule, under a hard cap),
and the sandbox a run is confined in (`SandboxConfig`: isolation, limits, what it may open).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from rlsched.config_load import Section
from rlsched.policy.timeouts import TimeoutParams
from rlsched.policy.verify import DispatchPolicy
from verifiers.sandbox import Isolation, SandboxPolicy
from verifiers.sandbox_types import Opening


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
