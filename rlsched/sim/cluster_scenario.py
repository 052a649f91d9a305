"""Multi-job cluster scenarios for `rlsched simulate` (`kind: cluster`): an admin file's nodes, classes
and queues, a job arrival trace (synthetic streams and/or a CSV job log), and variants to compare
(fairness order, borrowing within the cohort, which streams take part), run through the cluster
simulator (`rlsched.sim.cluster`, the admission policy the runtime uses) over several seeds.

Reported per variant, as means over seeds: the share of devices allocated (overall and per
`bucket_s` of virtual time), each class's queueing delay (mean, maximum, and the class's maximum
wait it is held against) and completion time, preemptions, elastic parts given back, Jain's index
over the queues' weighted dominant shares, and jobs left unfinished.

The CSV job log has one row per job with the columns `submit_s,duration_s,devices,queue,priority`
and optionally `elastic` (elastic parts of one device each): the shape public GPU cluster traces
(Philly, Helios, Alibaba PAI) reduce to once their jobs are mapped to queues and classes. No public
trace ships with the project; the synthetic generator stands in, and says so.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlsched.admin import AdminConfig, FairnessPolicy, admission_params, load_admin
from rlsched.config_load import Section, load_tree
from rlsched.errors import UserError
from rlsched.policy.cluster_model import PendingJob
from rlsched.policy.placement import Gang, Node
from rlsched.sim.cluster import ClusterRun, ClusterSim, TraceClass, TraceJob, summarise, synthetic_trace


class StreamConfig(Section):
    """Jobs of one class from one queue: Poisson arrivals, gang sizes, lognormal run times."""

    name: str = Field(min_length=1, description="a priority class of the admin file")
    priority: str = Field(description="a priority class of the admin file")
    queue: str = Field(description="the admin file's queue its jobs go to")
    rate_per_h: float = Field(gt=0, description="Poisson arrivals per hour")
    devices: list[int] = Field(min_length=1, description="a job's gang size in devices, drawn uniformly")
    mean_work_s: float = Field(gt=0, description="mean run time when never interrupted (lognormal)")
    sigma: float = Field(1.0, ge=0, description="the run time's lognormal sigma")
    device: str = Field("GPU", description="the device a gang asks for")
    cpus_per_device: float = Field(4.0, ge=0, description="CPUs asked with each device")
    per_node: int = Field(8, ge=1, description="devices per bundle (one node's worth)")
    elastic: int = Field(0, ge=0, description="elastic parts per job, one device each")
    save_every_s: float = Field(
        600.0,
        gt=0,
        description="a job saves its work this often (what an eviction loses is since the last save)",
    )
    requeue: bool = Field(
        False, description="a preempted job waits again and resumes from its last save (rlsched submit's way)"
    )
    walltime_s: float | None = Field(
        None, gt=0, description="the walltime each job declares (unset: walltime_factor, else its class's)"
    )
    walltime_factor: float | None = Field(
        None,
        gt=0,
        description="each job declares this times its own run time (1.5: users who overestimate; below 1: "
        "jobs that overrun their walltime)",
    )

    @model_validator(mode="after")
    def _one_walltime(self) -> StreamConfig:
        if self.walltime_s is not None and self.walltime_factor is not None:
            raise ValueError("give walltime_s or walltime_factor, not both")
        return self

    @field_validator("devices")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(d < 1 for d in v):
            raise ValueError("every gang size must be at least 1 device")
        return v


class VariantConfig(Section):
    name: str = Field(min_length=1, description="the variant's name in the report")
    fairness: FairnessPolicy | None = Field(None, description="unset: the admin file's")
    borrow_within_cohort: bool | None = Field(None, description="unset: the admin file's")
    streams: list[str] | None = Field(None, description="streams that take part (unset: all)")
    requeue: bool | None = Field(None, description="evicted jobs requeue and resume (unset: each stream's)")
    admin: dict[str, Any] = Field(
        default_factory=dict,
        description="an overlay on the admin file: any of its fields, e.g. {queues: {team-a: {nominal: "
        "{GPU: 32}}}} (a section merges key by key; any other value replaces the file's)",
    )


class ClusterScenarioConfig(Section):
    kind: Literal["cluster"] = Field(description="cluster: this file is a cluster scenario")
    admin: Path = Field(description="the admin file (nodes, classes, queues); relative to this file")
    hours: float = Field(24.0, gt=0, description="hours of synthetic arrivals")
    seeds: int = Field(3, ge=1, description="seeds per variant (figures are means)")
    devices: list[str] = Field(default_factory=lambda: ["GPU"], description="resources counted as devices")
    bucket_s: float = Field(3600.0, gt=0, description="the allocation-over-time resolution")
    streams: list[StreamConfig] = Field(default_factory=list)
    trace: Path | None = Field(None, description="a CSV job log (see the module docstring)")
    trace_device: str = Field("GPU", description="the device counted for allocation")
    variants: list[VariantConfig] = Field(default_factory=lambda: [VariantConfig(name="as configured")])

    @field_validator("admin", "trace")
    @classmethod
    def _relative(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        base = (info.context or {}).get("base_dir")
        return v if v is None or v.is_absolute() or base is None else Path(base) / v

    @model_validator(mode="after")
    def _consistent(self) -> ClusterScenarioConfig:
        if not self.streams and self.trace is None:
            raise ValueError("give streams (a synthetic trace), a trace file, or both")
        names = {s.name for s in self.streams}
        for v in self.variants:
            unknown = [s for s in v.streams or [] if s not in names]
            if unknown:
                raise ValueError(
                    f"variants.{v.name}.streams names {unknown[0]!r}, not a stream ({sorted(names)})"
                )
        return self


def load_cluster_scenario(path: Path | str, overrides: list[str] | None = None) -> ClusterScenarioConfig:
    """The scenario, checked whole before anything runs: every variant's admin file (its overlay
    merged) has nodes and the classes and queues the streams and the job log name."""
    cfg = load_tree(ClusterScenarioConfig, path, overrides)
    for v in cfg.variants:
        admin = load_admin(cfg.admin, v.admin)
        where = f"{cfg.admin}" + (f" with variant {v.name!r}'s overlay" if v.admin else "")
        if not admin.nodes:
            raise UserError(f"{where}: a cluster scenario needs the admin file's `nodes` inventory")
        for s in cfg.streams:
            if s.priority not in admin.priority_classes:
                raise UserError(f"streams.{s.name}.priority {s.priority!r} is not a class of {where}")
            if s.queue not in admin.queues:
                raise UserError(f"streams.{s.name}.queue {s.queue!r} is not a queue of {where}")
        if cfg.trace is not None:
            load_trace_csv(cfg.trace, cfg.trace_device, admin=admin)
    return cfg


def nodes_of(admin: AdminConfig) -> list[Node]:
    return [
        Node(f"{g.name}-{i}" if g.count > 1 else g.name, dict(g.resources), dict(g.labels))
        for g in admin.nodes
        for i in range(g.count)
    ]


_COLUMNS = ("submit_s", "duration_s", "devices", "queue", "priority")  # required in a job log


def load_trace_csv(
    path: Path, device: str, cpus_per_device: float = 4.0, per_node: int = 8, admin: AdminConfig | None = None
) -> list[TraceJob]:
    """Jobs of a CSV job log (`submit_s,duration_s,devices,queue,priority[,elastic][,walltime_s]`);
    with `admin`, a row whose queue or class the admin file lacks is refused by its line number."""
    out = []
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise KeyError(missing[0])
            for k, row in enumerate(reader):
                if admin is not None:
                    _check_row(path, k + 2, row, admin)  # line 1 is the header
                n = int(row["devices"])
                bundles = [min(per_node, n - i) for i in range(0, n, per_node)] or [0]
                gang = Gang(tuple({device: float(b), "CPU": cpus_per_device * max(b, 1)} for b in bundles))
                elastic = tuple(
                    {device: 1.0, "CPU": cpus_per_device} for _ in range(int(row.get("elastic") or 0))
                )
                job = PendingJob(
                    f"{row['queue']}/trace-{k}",
                    row["queue"],
                    row["priority"],
                    float(row["submit_s"]),
                    (gang,),
                    elastic,
                    walltime_s=float(row["walltime_s"]) if row.get("walltime_s") else None,
                )
                out.append(TraceJob(job, float(row["duration_s"])))
    except (OSError, KeyError, ValueError) as err:
        raise UserError(
            f"cannot read the job log {path}: {err!r}; it needs a header row with "
            "submit_s,duration_s,devices,queue,priority (and optionally elastic and walltime_s)"
        ) from None
    return out


def _check_row(path: Path, line: int, row: dict[str, str], admin: AdminConfig) -> None:
    for column, known in (("queue", admin.queues), ("priority", admin.priority_classes)):
        value = row.get(column)
        if value not in known:
            raise UserError(
                f"{path}, line {line}: {column} {value!r} is not one of the admin file's "
                f"({', '.join(sorted(known))}); fix the row or add it to the admin file"
            )


def _trace(cfg: ClusterScenarioConfig, streams: list[StreamConfig], seed: int) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    for k, s in enumerate(streams):
        cls = TraceClass(
            s.priority, s.queue, s.rate_per_h, tuple(s.devices), s.mean_work_s, s.sigma, s.device,
            s.cpus_per_device, s.per_node,
        )  # fmt: skip
        for t in synthetic_trace([cls], cfg.hours, seed * 1000 + k):
            name = f"{s.name}/{t.job.name.rsplit('-', 1)[1]}"
            parts = tuple({s.device: 1.0, "CPU": s.cpus_per_device} for _ in range(s.elastic))
            wall = s.walltime_s if s.walltime_factor is None else s.walltime_factor * t.work_s
            job = replace(t.job, name=name, elastic=parts, walltime_s=wall)
            jobs.append(TraceJob(job, t.work_s, s.save_every_s, s.requeue))
    if cfg.trace is not None:
        jobs += load_trace_csv(cfg.trace, cfg.trace_device)
    return sorted(jobs, key=lambda j: j.job.submitted)


def run_cluster_scenario(
    cfg: ClusterScenarioConfig, seeds: int | None = None, out: Path | None = None
) -> dict[str, Any]:
    """Every variant over the seeds: each figure's mean, and its spread (the standard deviation over
    seeds, `sd`). With `out`, `cluster.json` and one PNG per variant, of its seed 0
    (`rlsched.metrics.plots.cluster_png`)."""
    admin = load_admin(cfg.admin)
    seeds = seeds or cfg.seeds
    results: dict[str, Any] = {}
    pictures: list[Path] = []
    for v in cfg.variants:
        mine = load_admin(cfg.admin, v.admin)
        runs = [_run_variant(cfg, v, mine, seed) for seed in range(seeds)]
        per_seed = [summarise(run) | {"grown": float(run.grown)} for run in runs]
        keys = sorted(set().union(*per_seed))
        bounds = {n: c.max_wait_s for n, c in mine.priority_classes.items()}  # its overlay's
        results[v.name] = {k: statistics.fmean([s.get(k, math.nan) for s in per_seed]) for k in keys} | {
            "sd": {k: _sd([s.get(k, math.nan) for s in per_seed]) for k in keys},
            "allocation_series": _mean_series([run.allocation_series for run in runs]),
            "bounds": bounds,
        }
        if out is not None:
            from rlsched.metrics.plots import cluster_png

            out.mkdir(parents=True, exist_ok=True)
            path = out / f"cluster-{_slug(v.name)}.png"
            pictures.append(cluster_png(runs[0], bounds, cfg.bucket_s, v.name, path))
    bounds = {n: c.max_wait_s for n, c in admin.priority_classes.items()}
    summary = {
        "scenario": cfg.model_dump(mode="json"),
        "seeds": seeds,
        "max_wait_s": bounds,
        "results": results,
    }
    if out is not None:
        (out / "cluster.json").write_text(json.dumps(summary, indent=1))
        summary["pictures"] = [str(p) for p in pictures]
    return summary


def _run_variant(cfg: ClusterScenarioConfig, v: VariantConfig, admin: AdminConfig, seed: int) -> ClusterRun:
    params = admission_params(admin)
    if v.fairness is not None:
        params = replace(params, drf=v.fairness is FairnessPolicy.DRF)
    if v.borrow_within_cohort is not None:
        params = replace(params, borrow_within_cohort=v.borrow_within_cohort)
    streams = [s for s in cfg.streams if v.streams is None or s.name in v.streams]
    if v.requeue is not None:
        streams = [s.model_copy(update={"requeue": v.requeue}) for s in streams]
    sim = ClusterSim(nodes_of(admin), params, _trace(cfg, streams, seed), cfg.devices, cfg.bucket_s)
    return sim.simulate()


def _sd(xs: list[float]) -> float:
    """The sample standard deviation over seeds (0 for one seed)."""
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _mean_series(series: list[list[float]]) -> list[float]:
    length = max(len(s) for s in series)
    return [statistics.fmean([s[i] for s in series if i < len(s)]) for i in range(length)]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "variant"


def render_cluster(summary: dict[str, Any]) -> str:
    """One table, a row per variant: each figure as its mean over seeds ± its standard deviation."""
    classes = sorted(summary["max_wait_s"])
    header = ["variant", "allocated", "preemptions", "regrown", "Jain", "unfinished"]
    header += [f"{c} wait mean / max (bound)" for c in classes] + [f"{c} completion" for c in classes]
    rows = [header]
    for name, r in summary["results"].items():

        def cell(key: str, fmt: str, scale: float = 1.0, r: dict[str, Any] = r) -> str:
            m, sd = r.get(key, math.nan), r.get("sd", {}).get(key, 0.0)
            if math.isnan(m):
                return "-"
            spread = f"±{scale * sd:{fmt}}" if summary["seeds"] > 1 else ""
            return f"{scale * m:{fmt}}{spread}"

        cells = [name, cell("allocation", ".1f", 100) + "%", cell("preemptions", ".1f"), cell("grown", ".1f")]
        cells += [cell("jain", ".3f"), cell("unfinished", ".1f")]
        for c in classes:
            bound = r.get("bounds", summary["max_wait_s"]).get(c)
            if f"{c}_wait_mean_s" in r and not math.isnan(r[f"{c}_wait_mean_s"]):
                b = f"{bound:,.0f}" if bound else "none"
                cells.append(f"{cell(f'{c}_wait_mean_s', ',.0f')} / {cell(f'{c}_wait_max_s', ',.0f')} ({b})")
            else:
                cells.append("-")
        cells += [cell(f"{c}_completion_mean_s", ",.0f") for c in classes]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    spread = " ± the standard deviation over them" if summary["seeds"] > 1 else ""
    lines.append(
        f"seconds; means over {summary['seeds']} seeds{spread}; allocated = share of devices until the "
        "last arrival"
    )
    for name, r in summary["results"].items():
        series = r["allocation_series"]
        if series:
            spark = " ".join(f"{100 * x:.0f}" for x in series[:: max(1, len(series) // 24)])
            lines.append(f"{name}: allocated % over time: {spark}")
    for path in summary.get("pictures", []):
        lines.append(f"wrote {path}")
    return "\n".join(lines)
