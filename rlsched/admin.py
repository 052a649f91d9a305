"""The cluster admin's file (`configs/admin/*.yaml`): priority classes, queues with quotas, cohorts
to borrow within, preemption rules, fairness, and a reserve for latency-sensitive classes; typed and
validated once like every config, and described in plain words by `rlsched admin check FILE`.

Checks that span the file (each names its field and the fix): a queue's cohort and a cohort's
parent must exist and cohorts must not form a cycle; every priority class named (a queue's default,
the reserve's classes) must be defined; borrowing needs a cohort; with a node inventory, no quota or
reserve may exceed what the cluster has, and the nominal quotas together may not promise more than
it has (a queue must always be able to get its nominal back). A class that may wait less than the
longest grace period of preemptible work cannot count on preemption to free capacity in time
(SPEC section 5: an online class that may wait 2 s cannot rely on capacity lent to a job that needs
30 s to save), so it must be served by the reserve.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

from pydantic import Field, model_validator

from rlsched.config_load import Section, load_tree
from rlsched.policy.cluster_model import AdmissionParams, ClassParams, QueueParams, RequeueParams


class PriorityClass(Section):
    value: int = Field(description="higher runs first and may preempt lower")
    preemptible: bool = Field(True, description="whether jobs of this class may be preempted at all")
    grace_s: float = Field(30.0, ge=0, description="seconds a preempted job gets to save or drain")
    min_run_s: float = Field(
        0.0, ge=0, description="runs at least this long before it may be preempted again"
    )
    max_wait_s: float | None = Field(None, gt=0, description="the starvation bound: admitted within this")


class Queue(Section):
    cohort: str | None = Field(None, description="the cohort whose idle quota it may borrow")
    weight: float = Field(1.0, gt=0, description="its share under weighted dominant resource fairness")
    nominal: dict[str, float] = Field(default_factory=dict, description="guaranteed quota per resource")
    borrowing_limit: dict[str, float] = Field(
        default_factory=dict, description="most it may borrow beyond nominal, per resource (absent: any)"
    )
    lending_limit: dict[str, float] = Field(
        default_factory=dict, description="most of its idle nominal others may borrow (absent: all)"
    )
    default_priority: str | None = Field(
        None, description="the class a job submitted without --priority gets"
    )

    @model_validator(mode="after")
    def _non_negative(self) -> Queue:
        for name, amounts in (
            ("nominal", self.nominal),
            ("borrowing_limit", self.borrowing_limit),
            ("lending_limit", self.lending_limit),
        ):
            bad = [k for k, v in amounts.items() if v < 0]
            if bad:
                raise ValueError(f"{name}.{bad[0]} must be non-negative")
        return self


class Cohort(Section):
    parent: str | None = Field(None, description="the cohort this one borrows from in turn (no cycles)")


class PreemptionRules(Section):
    within_queue: bool = Field(True, description="a higher-priority job may preempt lower ones of its queue")
    reclaim_borrowed: bool = Field(True, description="a queue takes back its lent nominal quota")
    borrow_within_cohort: bool = Field(
        True, description="a job that must borrow may preempt lower-priority borrowers of its cohort"
    )
    never_below_nominal: bool = Field(True, description="no job is preempted to below its queue's nominal")


class RequeueRules(Section):
    """How supervised jobs (`rlsched submit`, `rlsched run --requeue`) come back, as Kueue's requeuing
    strategy: a preempted job is requeued at once; a failed one after a backoff; too many failures
    park it."""

    backoff_base_s: float = Field(30.0, ge=0, description="wait after the first failure; doubles with each")
    backoff_max_s: float = Field(1800.0, ge=0, description="the longest wait between attempts")
    limit: int | None = Field(
        5, ge=0, description="failures requeued; the next one parks the job (null: never parked)"
    )


class FairnessPolicy(StrEnum):
    DRF = "drf"  # weighted dominant resource fairness
    FIFO = "fifo"  # priority, then arrival


class Fairness(Section):
    policy: FairnessPolicy = Field(
        FairnessPolicy.DRF,
        description="drf (dominant resource fairness over the queues' weighted shares) or "
        "priority (class order alone)",
    )
    usage_half_life_s: float | None = Field(
        None, gt=0, description="weigh decayed past usage too (unset: current allocation only)"
    )


class Reserve(Section):
    classes: list[str] = Field(min_length=1, description="the latency-sensitive classes it serves")
    resources: dict[str, float] = Field(description="capacity held back for those classes")


class NodeGroup(Section):
    name: str = Field(min_length=1, description="the group's name (its nodes are named name-0, name-1, ...)")
    count: int = Field(1, ge=1, description="nodes in the group")
    resources: dict[str, float] = Field(description="each node's resources, e.g. {GPU: 8, CPU: 64}")
    labels: dict[str, str] = Field(
        default_factory=dict, description="each node's labels (placement selectors match them)"
    )


class AdminConfig(Section):
    device_types: list[str] = Field(default_factory=list, description="resources that name accelerators")
    nodes: list[NodeGroup] = Field(
        default_factory=list, description="the inventory quotas are checked against (the runtime reads Ray's)"
    )
    priority_classes: dict[str, PriorityClass] = Field(min_length=1)
    cohorts: dict[str, Cohort] = Field(default_factory=dict)
    queues: dict[str, Queue] = Field(min_length=1)
    preemption: PreemptionRules = PreemptionRules()
    requeue: RequeueRules = RequeueRules()
    fairness: Fairness = Fairness()
    reserve: Reserve | None = None

    def capacity(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for g in self.nodes:
            for k, v in g.resources.items():
                total[k] = total.get(k, 0.0) + v * g.count
        return total

    @model_validator(mode="after")
    def _references(self) -> AdminConfig:
        for name, q in self.queues.items():
            if q.cohort is not None and q.cohort not in self.cohorts:
                raise ValueError(
                    f"queues.{name}.cohort {q.cohort!r} is not defined in cohorts ({_listed(self.cohorts)})"
                )
            if q.default_priority is not None and q.default_priority not in self.priority_classes:
                raise ValueError(
                    f"queues.{name}.default_priority {q.default_priority!r} is not a defined priority class "
                    f"({_listed(self.priority_classes)})"
                )
            if q.borrowing_limit and q.cohort is None:
                raise ValueError(f"queues.{name}.borrowing_limit needs a cohort to borrow within")
        for name, c in self.cohorts.items():
            if c.parent is not None and c.parent not in self.cohorts:
                raise ValueError(
                    f"cohorts.{name}.parent {c.parent!r} is not defined ({_listed(self.cohorts)})"
                )
        cycle = _cohort_cycle(self.cohorts)
        if cycle:
            raise ValueError(
                f"cohorts form a cycle: {' -> '.join(cycle)}; a cohort's parents must end at a root"
            )
        if self.reserve is not None:
            unknown = [c for c in self.reserve.classes if c not in self.priority_classes]
            if unknown:
                raise ValueError(
                    f"reserve.classes names {unknown[0]!r}, which is not a defined priority class "
                    f"({_listed(self.priority_classes)})"
                )
        return self

    @model_validator(mode="after")
    def _fits_the_cluster(self) -> AdminConfig:
        if not self.nodes:
            return self
        have = self.capacity()
        for name, q in self.queues.items():
            for k, v in q.nominal.items():
                if v > have.get(k, 0.0):
                    raise ValueError(
                        f"queues.{name}.nominal.{k} is {v:g} but the cluster has {have.get(k, 0.0):g} {k}; "
                        "lower the quota or add nodes"
                    )
        promised: dict[str, float] = {}
        for q in self.queues.values():
            for k, v in q.nominal.items():
                promised[k] = promised.get(k, 0.0) + v
        reserved = self.reserve.resources if self.reserve else {}
        for k, v in promised.items():
            if v + reserved.get(k, 0.0) > have.get(k, 0.0):
                raise ValueError(
                    f"the nominal quotas promise {v:g} {k} (plus {reserved.get(k, 0.0):g} reserved) but the "
                    f"cluster has {have.get(k, 0.0):g}; nominal quota must always be reclaimable"
                )
        for k, v in reserved.items():
            if v > have.get(k, 0.0):
                raise ValueError(f"reserve.resources.{k} is {v:g} but the cluster has {have.get(k, 0.0):g}")
        return self

    @model_validator(mode="after")
    def _reserve_covers_the_impatient(self) -> AdminConfig:
        grace = max((c.grace_s for c in self.priority_classes.values() if c.preemptible), default=0.0)
        slowest = next(
            (n for n, c in self.priority_classes.items() if c.preemptible and c.grace_s == grace), None
        )
        served = set(self.reserve.classes) if self.reserve else set()
        for name, c in self.priority_classes.items():
            if c.max_wait_s is not None and c.max_wait_s < grace and name not in served:
                raise ValueError(
                    f"priority_classes.{name} may wait at most {c.max_wait_s:g} s, but preemptible work "
                    f"needs up to {grace:g} s to save (class {slowest}): preemption cannot free capacity "
                    "in time. "
                    f"List {name} in reserve.classes with a reserve sized for its jobs"
                )
        return self


def _listed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _cohort_cycle(cohorts: dict[str, Cohort]) -> list[str]:
    for start in cohorts:
        path, node = [start], cohorts[start].parent
        while node is not None:
            if node in path:
                return [*path[path.index(node) :], node]
            path.append(node)
            node = cohorts[node].parent if node in cohorts else None
    return []


def load_admin(path: Path | str) -> AdminConfig:
    return load_tree(AdminConfig, path, None)


def admission_params(cfg: AdminConfig) -> AdmissionParams:
    """The admission policy's parameters for this file (the runtime and the simulator use these)."""
    return AdmissionParams(
        classes={
            n: ClassParams(c.value, c.preemptible, c.grace_s, c.min_run_s, c.max_wait_s)
            for n, c in cfg.priority_classes.items()
        },
        queues={
            n: QueueParams(
                cohort=q.cohort,
                weight=q.weight,
                nominal=dict(q.nominal),
                borrowing_limit=dict(q.borrowing_limit) or None,
                lending_limit=dict(q.lending_limit) or None,
            )
            for n, q in cfg.queues.items()
        },
        within_queue=cfg.preemption.within_queue,
        reclaim_borrowed=cfg.preemption.reclaim_borrowed,
        borrow_within_cohort=cfg.preemption.borrow_within_cohort,
        never_below_nominal=cfg.preemption.never_below_nominal,
        drf=cfg.fairness.policy is FairnessPolicy.DRF,
        device_types=frozenset(cfg.device_types),
        reserve=dict(cfg.reserve.resources) if cfg.reserve else None,
        reserve_classes=frozenset(cfg.reserve.classes) if cfg.reserve else frozenset(),
        usage_half_life_s=cfg.fairness.usage_half_life_s,
        requeue=RequeueParams(cfg.requeue.backoff_base_s, cfg.requeue.backoff_max_s, cfg.requeue.limit),
    )


def describe(cfg: AdminConfig) -> list[str]:
    """What the file means, in plain words."""
    lines = []
    have = cfg.capacity()
    if cfg.nodes:
        inventory = ", ".join(f"{g.count} x {g.name}" for g in cfg.nodes)
        lines.append(f"Cluster: {inventory}; in all {_amounts(have)}.")
    classes = sorted(cfg.priority_classes.items(), key=lambda kv: -kv[1].value)
    lines.append("Priority classes, highest first:")
    for name, c in classes:
        wait = f"admitted within {c.max_wait_s:g} s" if c.max_wait_s is not None else "no wait bound"
        if c.preemptible:
            stop = f"preemptible, {c.grace_s:g} s to save, runs at least {c.min_run_s:g} s once started"
        else:
            stop = "never preempted"
        lines.append(f"  {name} ({c.value}): {stop}; {wait}.")
    lines.append("Queues:")
    for name, q in cfg.queues.items():
        parts = [f"weight {q.weight:g}", f"guaranteed {_amounts(q.nominal) or 'nothing'}"]
        if q.cohort:
            limit = f"up to {_amounts(q.borrowing_limit)} more" if q.borrowing_limit else "any idle quota"
            lend = (
                f"lends at most {_amounts(q.lending_limit)}"
                if q.lending_limit
                else "lends all it leaves idle"
            )
            parts.append(f"borrows {limit} within cohort {q.cohort}; {lend}")
        else:
            parts.append("borrows nothing (no cohort)")
        if q.default_priority:
            parts.append(f"jobs default to {q.default_priority}")
        lines.append(f"  {name}: " + "; ".join(parts) + ".")
    p = cfg.preemption
    rules = []
    if p.within_queue:
        rules.append("a job may preempt lower-priority jobs of its own queue")
    if p.reclaim_borrowed:
        rules.append("a queue takes back what it lent")
    if p.borrow_within_cohort:
        rules.append("a job that must borrow may preempt lower-priority borrowers of its cohort")
    if p.never_below_nominal:
        rules.append("nobody is preempted below their queue's guarantee")
    lines.append("Preemption: " + ("; ".join(rules) if rules else "off") + ".")
    r = cfg.requeue
    parked = (
        f"{r.limit} failures are requeued, the next one parks the job"
        if r.limit is not None
        else "never parked"
    )
    lines.append(
        f"Requeue (supervised jobs): preempted, back in the queue at once; failed, after "
        f"{r.backoff_base_s:g} s, doubling to at most {r.backoff_max_s:g} s; {parked}. Each resumes "
        "from its newest checkpoint."
    )
    lines.append(
        "Victims: elastic rollout instances and deferrable verification first, then the lowest priority, "
        "the least work lost since the last save; never one within its minimum run time."
    )
    if cfg.fairness.policy is FairnessPolicy.DRF:
        decay = (
            f", over usage decayed with a {cfg.fairness.usage_half_life_s:g} s half-life"
            if cfg.fairness.usage_half_life_s
            else ""
        )
        lines.append(
            f"Fairness: within a priority, the queue with the smallest weighted dominant share first{decay}."
        )
    else:
        lines.append("Fairness: priority, then arrival order.")
    if cfg.reserve:
        lines.append(
            f"Reserve: {_amounts(cfg.reserve.resources)} kept for {', '.join(cfg.reserve.classes)}, "
            "never lent, so they start without waiting for anyone to save."
        )
    return lines


def _amounts(res: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in res.items())
