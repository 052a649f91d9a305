"""Agent frameworks' clients against the endpoint over a Ray rollout fleet (`actors.endpoint_serve`):
the scenarios of `tests/client_scenarios.py` (LangChain's `ChatOpenAI`; the OpenAI Agents SDK over
chat completions and the Responses API), with the grammar applied inside the fleet's instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.endpoint_serve import FleetServer, serve_fleet
from rlsched.config import EndpointConfig
from tests.client_scenarios import SCENARIOS
from tests.helpers import CHAT_TOOLS_TEMPLATE

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

MODEL = "random-tools"


@pytest.fixture(scope="module")
def fleet(
    ray_session: None, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FleetServer]:
    from tests.agent_model import tiny

    tiny(smollm2_dir, made := tmp_path_factory.mktemp("fleet-clients") / "tiny")
    cfg = EndpointConfig(port=0, model_name=MODEL, timeout_s=120)
    server = serve_fleet(
        made, cfg, instances=1, max_batch=8, dtype="float32", chat_template=CHAT_TOOLS_TEMPLATE
    )
    yield server
    server.stop()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_framework_gets_what_it_relies_on_over_the_fleet(fleet: FleetServer, scenario: str) -> None:
    SCENARIOS[scenario](fleet.base_url, MODEL)
