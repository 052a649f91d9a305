"""Where a job's metrics rows go besides `metrics.jsonl`: TensorBoard event files (by default),
Weights & Biases and MLflow (when installed and asked for), and a Prometheus endpoint on the driver.

Every sink is fed the same row, the one the commit log holds, flattened to scalars: `reward_mean`,
`loss`, `t_generate`, ... at the top level, nested counts as `fleet/joined`, `verifier_pool/retries`,
`endpoint/episodes`. The step is the iteration. A sink's failure to start is bad input (a missing
package, a port taken) and stops the job before it starts; rows already committed are never lost
to a sink, since `metrics.jsonl` and the commit log are written first.

The Prometheus endpoint serves the newest row as gauges (`rlsched_iteration`, `rlsched_reward_mean`,
`rlsched_phase_seconds{phase="t_generate"}`, ...) and durability figures (`rlsched_commit_seconds`,
`rlsched_checkpoint_seconds`, `rlsched_recoveries_total`) from a registry of its own, so two jobs
in one process never share a metric. The endpoint's own `/metrics` (`rlsched serve`) is separate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlsched.config import TrackingConfig
from rlsched.errors import UserError

PHASES = ("t_generate", "t_verify_exposed", "t_update", "t_publish", "t_load", "t_iter")


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The row's numbers as `name -> value`, nested dicts joined with `/`; lists and text left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, int | float) and math.isfinite(value):  # bools too: 0 or 1
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(flatten(value, f"{name}/"))
    return out


class Sink(Protocol):
    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, directory: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        # a resumed run hides the events an earlier run wrote from `purge_step` on (redone iterations)
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=purge_step)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: TrackingConfig, out_dir: Path, config: Mapping[str, Any]) -> None:
        try:
            import wandb  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise UserError("tracking.wandb is on but wandb is not installed: pip install wandb") from None
        self.run = wandb.init(
            project=cfg.project, name=out_dir.name, dir=str(out_dir), config=dict(config), resume="allow"
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    def __init__(self, cfg: TrackingConfig, out_dir: Path, config: Mapping[str, Any]) -> None:
        try:
            import mlflow  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise UserError("tracking.mlflow is on but mlflow is not installed: pip install mlflow") from None
        self.mlflow = mlflow
        mlflow.set_experiment(cfg.project)
        self.run = mlflow.start_run(run_name=out_dir.name)
        mlflow.log_params({k: str(v)[:250] for k, v in flatten_params(config).items()})

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        clean = {k.replace("/", "."): v for k, v in scalars.items()}  # mlflow names: no slashes needed
        self.mlflow.log_metrics(clean, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class PrometheusSink:
    """The newest row as gauges on `http://HOST:PORT/metrics` (port 0: any free one)."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.gauges = {
            name: Gauge(f"rlsched_{name}", text, registry=self.registry)
            for name, text in (
                ("iteration", "the newest committed iteration"),
                ("version", "the weight version its samples came from"),
                ("reward_mean", "the iteration's mean reward"),
                ("pass_rate", "the iteration's share of correct samples"),
                ("loss", "the update's loss"),
                ("tokens_per_s", "generated tokens per second of generation"),
                ("overlap_fraction", "verification hidden under generation"),
                ("eval_pass_rate", "the newest held-out pass rate"),
                ("commit_seconds", "the newest commit's duration"),
                ("checkpoint_seconds", "the newest checkpoint's save time"),
                ("recoveries_total", "training-group recoveries in this run"),
            )
        }
        self.phase = Gauge("rlsched_phase_seconds", "the newest iteration's phase times", ["phase"],
                           registry=self.registry)  # fmt: skip
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise UserError(
                f"tracking.prometheus_port {port} on {host} cannot be served ({err.strerror or err}); "
                "choose another port, or 0 for any free one"
            ) from None
        self.address = f"http://{host}:{self.server.server_port}/metrics"

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for name, gauge in self.gauges.items():
            if name in scalars:
                gauge.set(scalars[name])
        for phase in PHASES:
            if phase in scalars:
                self.phase.labels(phase=phase).set(scalars[phase])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Tracking:
    """The job's sinks, opened from `tracking` in the config; `log(row)` feeds them all."""

    def __init__(
        self, cfg: TrackingConfig, out_dir: Path, config: Mapping[str, Any], first_step: int = 1
    ) -> None:
        self.sinks: list[Sink] = []
        self.prometheus: PrometheusSink | None = None
        try:
            if cfg.tensorboard:
                purge = first_step if first_step > 1 else None
                self.sinks.append(TensorBoardSink(out_dir / "tensorboard", purge))
            if cfg.wandb:
                self.sinks.append(WandbSink(cfg, out_dir, config))
            if cfg.mlflow:
                self.sinks.append(MlflowSink(cfg, out_dir, config))
            if cfg.prometheus_port is not None:
                self.prometheus = PrometheusSink(cfg.prometheus_host, cfg.prometheus_port)
                self.sinks.append(self.prometheus)
        except BaseException:
            self.close()
            raise

    def log(self, row: Mapping[str, Any], step: int, extra: Mapping[str, float] | None = None) -> None:
        scalars = flatten(row) | dict(extra or {})
        for sink in self.sinks:
            sink.log(scalars, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
