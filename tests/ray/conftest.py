"""One real local Ray session per test module (ray.init costs about 5-10 s on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    # two logical GPUs (this machine has none): GPU-stage verifier workers can be placed, and their
    # runs then find no device and say so
    ray.init(
        num_cpus=8, num_gpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False
    )
    yield
    ray.shutdown()
