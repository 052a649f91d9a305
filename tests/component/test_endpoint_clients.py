"""Agent frameworks' clients against the in-process endpoint (`tests/client_scenarios.py`): LangChain's
`ChatOpenAI` (streaming with usage, `bind_tools` with `tool_choice: required`, `with_structured_output`
on a JSON schema) and the OpenAI Agents SDK (a tool run, a streamed run and structured output, over
chat completions and over the Responses API)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_checkpoint
from rlsched.serve.server import Running, served_from, start
from tests.client_scenarios import SCENARIOS
from tests.helpers import CHAT_TOOLS_TEMPLATE

pytestmark = pytest.mark.slow

MODEL = "random-tools"


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from tests.agent_model import tiny

    tiny(smollm2_dir, made := tmp_path_factory.mktemp("clients") / "tiny")
    ck = load_checkpoint(made, dtype=torch.float32)
    served = served_from(ck, chat_template=CHAT_TOOLS_TEMPLATE, model_name=MODEL)
    running = start(served, EndpointConfig(port=0))
    yield running
    running.stop()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_framework_gets_what_it_relies_on(server: Running, scenario: str) -> None:
    SCENARIOS[scenario](server.base_url, MODEL)
