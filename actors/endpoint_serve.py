"""`rlsched serve` on the embedded cluster: the checkpoint published as version 0 by a weight service
in the driver, rollout actors that join it (transfer, load, confirm: a job's own path), and the
endpoint actor (`actors.endpoint`) over them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.endpoint import EndpointActor
from actors.rollout import RolloutInstance
from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_checkpoint, to_bf16_bytes
from rlsched.policy.lifecycle import InstanceState
from rlsched.rollout.instance import JoinReport
from rlsched.serve.server import PREFIX_CACHE_TOKENS
from rlsched.transfer.service import WeightService

log = logging.getLogger(__name__)


@dataclass
class FleetServer:
    """An endpoint actor over rollout instances that joined a checkpoint published as version 0."""

    endpoint: Any
    instances: dict[str, Any]
    service: WeightService
    reports: list[JoinReport]
    host: str
    port: int
    model_name: str
    context_length: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def sync(self, latest: int) -> None:
        """Tell the endpoint the fleet as it stands (after its instances took another version): this
        fleet's owner reads each instance's state and version and pushes them with `latest`."""
        rows = ray.get([h.status.remote() for h in self.instances.values()])
        members = {
            n: (h, state, version)
            for (n, h), (state, version, _) in zip(self.instances.items(), rows, strict=True)
        }
        ray.get(self.endpoint.sync.remote(members, latest))

    def stop(self) -> None:
        ray.get(self.endpoint.stop.remote())
        ray.get([h.release.remote() for h in self.instances.values()])
        for handle in (self.endpoint, *self.instances.values()):
            ray.kill(handle)
        self.service.close()


def serve_fleet(
    checkpoint: Path,
    cfg: EndpointConfig,
    *,
    instances: int = 1,
    max_batch: int = 64,
    dtype: str = "auto",
    template: str | None = None,
    chat_template: Path | None = None,
    model_name: str | None = None,
    max_staleness: int = 0,
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
    seed: int = 0,
    engine: str = "torch",
) -> FleetServer:
    """Publish `checkpoint`, start `instances` rollout actors that join it, and the endpoint over them
    (Ray must be initialised). `engine`: the instances' engine kind, torch or vllm (as a job's)."""
    t0 = time.monotonic()
    service = WeightService()
    service.publish(0, to_bf16_bytes(load_checkpoint(checkpoint, template=template).model))
    handles = {
        f"instance-{k}": RolloutInstance.options(num_cpus=1).remote(  # type: ignore[attr-defined]
            f"instance-{k}",
            str(checkpoint),
            max_batch,
            True,
            seed + k,
            engine=engine,
            dtype=dtype,
            prefix_cache_tokens=prefix_cache_tokens,
        )
        for k in range(instances)
    }
    reports: list[JoinReport] = ray.get([h.join.remote(service.address, 0) for h in handles.values()])
    ready = str(InstanceState.READY)
    members = {name: (h, ready, r.version) for (name, h), r in zip(handles.items(), reports, strict=True)}
    endpoint = EndpointActor.remote(  # type: ignore[attr-defined]
        members, str(checkpoint), cfg, max_staleness=max_staleness, latest=0, template=template,
        chat_template=str(chat_template) if chat_template else None, model_name=model_name,
    )  # fmt: skip
    host, port, name, context_length = ray.get(endpoint.address.remote())
    log.info("fleet endpoint up in %.1f s", time.monotonic() - t0)
    return FleetServer(endpoint, handles, service, reports, host, port, name, context_length)
