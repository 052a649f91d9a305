"""The cluster admin's file (`configs/admin/*.yaml`): priority classes, queues with quotas, cohorts
to borrow within, preemption rules, fairness, reservations and a reserve for latency-sensitive
classes; typed and validated once like every config, and described in plain words by
`rlsched admin check FILE`.

Problems (`problems`: the file is refused, every problem at once, each naming its field and the
fix): a queue's cohort, a cohort's parent or a class named by a queue or the reserve that is not
defined; borrowing without a cohort; a cycle of cohorts; with a node inventory, a quota or reserve
larger than the cluster, and nominal quotas that together promise more than it has (a queue must
always be able to get its nominal back); a class that may wait less than the longest grace period
of preemptible work unless the reserve serves it (SPEC section 5: an online class that may wait 2 s
cannot rely on capacity lent to a job that needs 30 s to save).

Warnings (`warnings`: the file is valid, but the scheduler does less than it seems to promise):
capacity in no queue's nominal quota nor the reserve (nobody can ever use it: a queue borrows only
what others leave idle of their nominal); a borrowing limit larger than the queue's cohort can ever
lend; a reserve resource that no queue of the reserve's classes can ever get.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from rlsched.config_load import Section, format_validation_error, load_tree, read_yaml
from rlsched.errors import UserError
from rlsched.policy.cluster_model import AdmissionParams, ClassParams, QueueParams, RequeueParams
from rlsched.policy.placement import add


class PriorityClass(Section):
    value: int = Field(description="higher runs first and may preempt lower")
    preemptible: bool = Field(True, description="whether jobs of this class may be preempted at all")
    grace_s: float = Field(30.0, ge=0, description="seconds a preempted job gets to save or drain")
    min_run_s: float = Field(
        0.0, ge=0, description="runs at least this long before it may be preempted again"
    )
    max_wait_s: float | None = Field(
        None,
        gt=0,
        description="the starvation bound: past it, a job reserves what it needs from when the running "
        "jobs' walltimes free it, and the others start around the reservation (backfill)",
    )
    walltime_s: float = Field(
        86400.0, gt=0, description="a job's expected run time when it declares none (run.walltime_s)"
    )


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
        description="drf (within a priority, the queue with the smallest weighted dominant share first) "
        "or fifo (priority, then arrival order)",
    )
    usage_half_life_s: float | None = Field(
        None, gt=0, description="weigh decayed past usage too (unset: current allocation only)"
    )


class Reservations(Section):
    """How reservations treat a job that runs past its walltime (`rlsched.policy.reservation`)."""

    overrun_grace_s: float = Field(
        600.0,
        gt=0,
        description="a job past its walltime is expected to end within this; each time it runs past "
        "that, the reservations waiting for it move this much later",
    )
    max_jobs: int = Field(
        8,
        ge=1,
        description="jobs past their maximum wait that hold a reservation at once (the longest-waiting "
        "first; the others wait their turn, as Slurm's bf_max_job_test bounds its backfill pass)",
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
    reservations: Reservations = Reservations()
    reserve: Reserve | None = None

    def capacity(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for g in self.nodes:
            for k, v in g.resources.items():
                total[k] = total.get(k, 0.0) + v * g.count
        return total

    @model_validator(mode="after")
    def _consistent(self) -> AdminConfig:
        found = problems(self)
        if found:
            raise ValueError("\n".join(found))  # one a line: the error lists each as a problem
        return self


# -- checks: `problems` make a file invalid, `warnings` are what a valid one cannot do ---------------


def problems(cfg: AdminConfig) -> list[str]:
    """Everything that makes the file invalid (see the module docstring)."""
    return [*_references(cfg), *_fits_the_cluster(cfg), *_reserve_covers_the_impatient(cfg)]


def _references(cfg: AdminConfig) -> list[str]:
    out = []
    for name, q in cfg.queues.items():
        if q.cohort is not None and q.cohort not in cfg.cohorts:
            out.append(
                f"queues.{name}.cohort {q.cohort!r} is not defined in cohorts ({_listed(cfg.cohorts)})"
            )
        if q.default_priority is not None and q.default_priority not in cfg.priority_classes:
            out.append(
                f"queues.{name}.default_priority {q.default_priority!r} is not a defined priority class "
                f"({_listed(cfg.priority_classes)})"
            )
        if q.borrowing_limit and q.cohort is None:
            out.append(f"queues.{name}.borrowing_limit needs a cohort to borrow within")
    for name, c in cfg.cohorts.items():
        if c.parent is not None and c.parent not in cfg.cohorts:
            out.append(f"cohorts.{name}.parent {c.parent!r} is not defined ({_listed(cfg.cohorts)})")
    cycle = cohort_cycle(cfg.cohorts)
    if cycle:
        out.append(f"cohorts form a cycle: {' -> '.join(cycle)}; a cohort's parents must end at a root")
    if cfg.reserve is not None:
        for cls in cfg.reserve.classes:
            if cls not in cfg.priority_classes:
                out.append(
                    f"reserve.classes names {cls!r}, which is not a defined priority class "
                    f"({_listed(cfg.priority_classes)})"
                )
    return out


def _fits_the_cluster(cfg: AdminConfig) -> list[str]:
    if not cfg.nodes:
        return []
    out = []
    have = cfg.capacity()
    for name, q in cfg.queues.items():
        for k, v in q.nominal.items():
            if v > have.get(k, 0.0):
                out.append(
                    f"queues.{name}.nominal.{k} is {v:g} but the cluster has {have.get(k, 0.0):g} {k}; "
                    "lower the quota or add nodes"
                )
    promised = add(*(q.nominal for q in cfg.queues.values()))
    reserved = cfg.reserve.resources if cfg.reserve else {}
    for k, v in promised.items():
        if v + reserved.get(k, 0.0) > have.get(k, 0.0) + 1e-6:
            out.append(
                f"the nominal quotas promise {v:g} {k} (plus {reserved.get(k, 0.0):g} reserved) but the "
                f"cluster has {have.get(k, 0.0):g}; nominal quota must always be reclaimable"
            )
    for k, v in reserved.items():
        if v > have.get(k, 0.0):
            out.append(f"reserve.resources.{k} is {v:g} but the cluster has {have.get(k, 0.0):g}")
    return out


def _reserve_covers_the_impatient(cfg: AdminConfig) -> list[str]:
    classes = cfg.priority_classes
    grace = max((c.grace_s for c in classes.values() if c.preemptible), default=0.0)
    slowest = next((n for n, c in classes.items() if c.preemptible and c.grace_s == grace), None)
    served = set(cfg.reserve.classes) if cfg.reserve else set()
    return [
        f"priority_classes.{name} may wait at most {c.max_wait_s:g} s, but preemptible work needs up to "
        f"{grace:g} s to save (class {slowest}): preemption cannot free capacity in time. List {name} in "
        "reserve.classes with a reserve sized for its jobs"
        for name, c in classes.items()
        if c.max_wait_s is not None and c.max_wait_s < grace and name not in served
    ]


def warnings(cfg: AdminConfig) -> list[str]:
    """Settings a valid file accepts that cannot do what they say (see the module docstring)."""
    return [*_unassigned(cfg), *_unlendable(cfg), *_unusable_reserve(cfg)]


def _unassigned(cfg: AdminConfig) -> list[str]:
    if not cfg.nodes:
        return []
    promised = add(*(q.nominal for q in cfg.queues.values()))
    reserved = cfg.reserve.resources if cfg.reserve else {}
    idle = {
        k: v - promised.get(k, 0.0) - reserved.get(k, 0.0)
        for k, v in cfg.capacity().items()
        if v - promised.get(k, 0.0) - reserved.get(k, 0.0) > 1e-6
    }
    if not idle:
        return []
    return [
        f"{_amounts(idle)} of the cluster {'is' if len(idle) == 1 else 'are'} in no queue's nominal quota "
        "nor the reserve: no job can ever use them (a queue borrows only what others leave idle of their "
        "nominal quota); give them to a queue's nominal"
    ]


def lendable_pool(cfg: AdminConfig, queue: str) -> dict[str, float]:
    """The most the other queues of `queue`'s cohort could ever lend it: their nominal quotas, capped
    by their lending limits."""
    cohort = cfg.queues[queue].cohort
    pool: dict[str, float] = {}
    for name, q in cfg.queues.items():
        if name == queue or cohort is None or q.cohort != cohort:
            continue
        for k, v in q.nominal.items():
            pool[k] = pool.get(k, 0.0) + min(v, q.lending_limit.get(k, v))
    return pool


def _unlendable(cfg: AdminConfig) -> list[str]:
    out = []
    for name, q in cfg.queues.items():
        pool = lendable_pool(cfg, name)
        for k, v in q.borrowing_limit.items():
            if v > pool.get(k, 0.0) + 1e-6:
                can = pool.get(k, 0.0)
                out.append(
                    f"queues.{name}.borrowing_limit.{k} is {v:g}, but the other queues of cohort {q.cohort} "
                    f"can lend at most {can:g} {k}: {name} can never use more than "
                    f"{q.nominal.get(k, 0.0) + can:g} {k}; give {k} quota to a queue of its cohort, or "
                    "lower the limit"
                )
    return out


def _unusable_reserve(cfg: AdminConfig) -> list[str]:
    if cfg.reserve is None:
        return []
    classes = set(cfg.reserve.classes)
    users = [n for n, q in cfg.queues.items() if q.default_priority in classes]
    who = f"none of the queues whose jobs default to them ({', '.join(users)})" if users else "no queue"
    out = []
    for k, v in cfg.reserve.resources.items():
        if any(
            cfg.queues[n].nominal.get(k, 0.0) + lendable_pool(cfg, n).get(k, 0.0) > 0
            for n in users or cfg.queues
        ):
            continue
        out.append(
            f"reserve.resources.{k} holds {v:g} {k} for {', '.join(sorted(classes))}, but {who} can ever "
            f"get {k} (no nominal quota of it, nothing to borrow); give such a queue {k} quota, or take "
            f"{k} out of the reserve"
        )
    return out


def cohort_cycle(cohorts: Mapping[str, Cohort]) -> list[str]:
    for start in cohorts:
        path, node = [start], cohorts[start].parent
        while node is not None:
            if node in path:
                return [*path[path.index(node) :], node]
            path.append(node)
            node = cohorts[node].parent if node in cohorts else None
    return []


def _listed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def load_admin(path: Path | str, overlay: Mapping[str, Any] | None = None) -> AdminConfig:
    """The admin file, with `overlay` (a partial tree, e.g. a what-if variant's) merged over it:
    a section merges key by key, any other value replaces the file's."""
    if not overlay:
        return load_tree(AdminConfig, path, None)
    tree = merged(read_yaml(Path(path)), overlay)
    try:
        return AdminConfig.model_validate(tree)
    except ValidationError as err:
        where = f"{path} with the variant's overlay"
        raise UserError(format_validation_error(where, err, AdminConfig)) from None


def merged(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in overlay.items():
        old = out.get(k)
        out[k] = merged(old, v) if isinstance(old, Mapping) and isinstance(v, Mapping) else v
    return out


def admission_params(cfg: AdminConfig) -> AdmissionParams:
    """The admission policy's parameters for this file (the runtime and the simulator use these)."""
    return AdmissionParams(
        classes={
            n: ClassParams(c.value, c.preemptible, c.grace_s, c.min_run_s, c.max_wait_s, c.walltime_s)
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
        overrun_grace_s=cfg.reservations.overrun_grace_s,
        max_reservations=cfg.reservations.max_jobs,
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
        lines.append(
            f"  {name} ({c.value}): {stop}; {wait}; walltime {c.walltime_s:g} s unless the job says."
        )
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
        "Victims: elastic rollout instances first, then the lowest priority, "
        "the least work lost since the last save; never one within its minimum run time."
    )
    if any(c.max_wait_s is not None for c in cfg.priority_classes.values()):
        lines.append(
            "Past its maximum wait, a job that nothing can be preempted for reserves the nodes it needs "
            "from when the running jobs' walltimes end; other jobs start if they end before that or fit "
            f"beside it (backfill). A job past its walltime gets {cfg.reservations.overrun_grace_s:g} s "
            "more, then the reservation moves as much later, each time."
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


def _amounts(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in res.items())
