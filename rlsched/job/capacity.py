"""What a job's start can refuse without its model, torch or Ray: a cluster address nothing answers
at, and a cluster too small for the job. `rlsched run` asks these first, so that such a refusal comes
in about a second (importing torch and transformers for the rest of the preflight takes five on two
cores), and the job's preflight and connection ask them again where they are called on their own."""

from __future__ import annotations

import socket

from rlsched.config import JobConfig
from rlsched.config_params import embedded_resources, shortfall
from rlsched.errors import UserError


def check_capacity(cfg: JobConfig, have: dict[str, float]) -> None:
    """Refuse at once a job the cluster (`have`: its resources) can never host, naming each resource
    that falls short."""
    short = shortfall(cfg, have)
    if short:
        raise UserError(
            "the cluster cannot host this job (" + "; ".join(short) + "). Lower trainer.ranks, "
            "rollout.instances or verifier.workers (or their per-actor resources), raise "
            "cluster.num_cpus / cluster.num_gpus for the embedded cluster, or add nodes"
        )


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address nothing answers at: ray.init would retry for minutes."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address {address!r} is not host:port (or 'auto', or ray://host:port)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise UserError(
            f"cannot reach the Ray cluster at {address!r} ({err.strerror or err}); check the "
            "head node's address and port and that the cluster is running"
        ) from None


def refuse_early(cfg: JobConfig, address: str | None) -> None:
    """The refusals that need nothing heavy: the cluster at `address` answers, or, with no address,
    the embedded cluster (sized by the config) can host the job."""
    if address is not None:
        probe_address(address)
    else:
        check_capacity(cfg, embedded_resources(cfg))
