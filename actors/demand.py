"""The Ray actor options that ask for a bundle of a job's demand (`rlsched.config_params`): what a
placement group's bundle of the same shape reserves."""

from __future__ import annotations

from typing import Any

from rlsched.config_params import Bundle


def actor_options(bundle: Bundle) -> dict[str, Any]:
    """`.options(...)` for an actor that holds `bundle`: CPUs and GPUs by name, the rest as custom
    resources (what a placement group's bundle of the same shape reserves)."""
    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0)}
    if rest:
        options["resources"] = rest
    return options
