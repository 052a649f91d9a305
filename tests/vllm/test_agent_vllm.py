"""A multi-turn job on vLLM rollout instances (`make test-vllm`): `configs/jobs/agent_calc.yaml`, small,
with `engine.kind: vllm`, on the tiny model that calls the calculator (tests/agent_model.py). A turn
of an episode is a request like any other, so vLLM runs it: token ids in, token ids and log-probs out,
each turn with its version. The episodes call the sandboxed calculator, read its result, answer and
are trained, and the iteration commits with every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_agent_ray import job_file, run_small

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray]


def test_a_multi_turn_job_runs_its_episodes_on_vllm_instances(tool_model: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load(job_file(tmp_path, tool_model, sleep_s=0.0).read_text())
    cfg["engine"] = {"kind": "vllm"}
    cfg["grpo"] |= {"steps": 1, "prompts_per_step": 2, "group_size": 2}
    cfg["rollout"] = {"instances": 1}
    out = run_small(tmp_path, cfg, timeout_s=900)
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["iteration"] == 1 and row["samples"] == 4 and row["used"] == 4
    episodes = row["extra"]["episodes"]
    assert episodes["episodes"] == 4 and episodes["faults"] == 0 and episodes["tool_calls"] > 0
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    turns = [e["args"] for e in events if e.get("cat") == "generate" and "turns" in e.get("args", {})]
    assert len(turns) == 4 and all(t["versions"] == [0] for t in turns)
    assert any(t["turns"] >= 2 and t["tool_calls"] >= 1 for t in turns)  # a call, its result read, an answer
