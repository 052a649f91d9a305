"""Every combination of a job's modes runs on Ray (issue 43's matrix): {sync, async k=1} x {single-turn,
multi-turn} x {OpenAI endpoint off, on} x {torch, vLLM}. The vLLM cells are marked `vllm`, so they run in
`make test-vllm` (in `.venv-vllm`), the torch ones in `make test`. Six cells are another test's job
already (`ELSEWHERE` names it); this module runs the other ten.

Each cell is a job on the shared Ray session (`tests/ray/conftest.py`), one process of each kind:
single-turn cells run 2 iterations of the shipped base (4 problems x 8 samples), multi-turn cells one
iteration of 2 problems x 2 episodes on the tiny model that calls the calculator (tests/agent_model.py).
With the endpoint on, a client's group of two episodes, rewarded, joins the first batch beside the
job's own samples or episodes.

The async multi-turn cell without the endpoint also checks that an episode spanning a version bump
counts from its oldest turn, as a single-turn sample counts from its oldest token: it runs 2 iterations
with versions swapped in flight, one instance taking a wave a route (4 rows, refilled once all 4 are
free), and a calculator that takes 5 s a call, so that v1 arrives while wave 2's episodes wait for
it and their answers are sampled at v1; step 2 trains them at staleness 1, inside the bound. The
async multi-turn cell with the endpoint runs its episodes under `agent.policy: prewarm`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_agent_ray import job_file
from tests.helpers import ONE_OF_EACH, JobEndpoint

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

# the cells another test runs already, each a job of its own (CI pays for each job once)
ELSEWHERE = {
    ("torch", "sync", "single", False): "tests/ray/test_job.py (every dispatch policy and refill)",
    ("torch", "sync", "single", True): "tests/ray/test_endpoint_fleet.py (pinned episodes)",
    ("torch", "async", "single", False): "tests/e2e/test_async_ray.py",
    ("torch", "async", "single", True): "tests/ray/test_endpoint_fleet.py (the bound)",
    ("torch", "sync", "multi", False): "tests/e2e/test_agent_ray.py (an instance killed under its episodes)",
    ("vllm", "sync", "single", True): "tests/vllm/test_job_vllm.py (an instance scaled and preempted)",
}  # fmt: skip
CELLS = [
    pytest.param(
        engine, mode, turns, endpoint, id=f"{engine}-{mode}-{turns}-endpoint_{'on' if endpoint else 'off'}",
        marks=[pytest.mark.vllm] if engine == "vllm" else [],
    )
    for engine in ("torch", "vllm")
    for mode in ("sync", "async")
    for turns in ("single", "multi")
    for endpoint in (False, True)
    if (engine, mode, turns, endpoint) not in ELSEWHERE
]  # fmt: skip


# the cell that also checks episodes across a version bump (vLLM cannot swap a version in flight)
SPANNING = ("torch", "async", "multi", False)
# the cell whose episodes prepare their environments ahead (`agent.policy: prewarm`)
PREWARM = ("torch", "async", "multi", True)


def cell_config(engine: str, mode: str, turns: str, endpoint: bool, tool_model: Path, tmp_path: Path) -> Any:
    from rlsched.config import JobConfig, load_config

    sets = [*ONE_OF_EACH, "task.eval_size=64", "eval.curve_size=32", f"engine.kind={engine}"]
    if mode == "async":
        sets += ["schedule.mode=async", "rollout.max_staleness=1"]
    if endpoint:
        sets += ["rollout.endpoint.enabled=true", "rollout.endpoint.port=0"]
    if turns == "single":
        return load_config(None, [*sets, "grpo.prompts_per_step=4"])
    spanning = (engine, mode, turns, endpoint) == SPANNING
    tree = yaml.safe_load(job_file(tmp_path, tool_model, sleep_s=5.0 if spanning else 0.0).read_text())
    tree["grpo"] |= {"steps": 2 if spanning else 1, "prompts_per_step": 2, "group_size": 2}
    tree["rollout"], tree["run"] = {}, {}
    if spanning:
        sets += ["rollout.request_batch=4", "rollout.inflight_update=swap"]
    if (engine, mode, turns, endpoint) == PREWARM:
        tree["agent"]["policy"] = "prewarm"
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg = load_config(path, sets)
    assert isinstance(cfg, JobConfig)
    return cfg


@pytest.mark.parametrize(("engine", "mode", "turns", "endpoint"), CELLS)
def test_every_combination_of_modes_runs(
    engine: str, mode: str, turns: str, endpoint: bool, tool_model: Path, tmp_path: Path
) -> None:
    if engine == "vllm":
        pytest.importorskip("vllm")
    from actors.controller import JobController

    cell = (engine, mode, turns, endpoint)
    cfg = cell_config(*cell, tool_model, tmp_path)
    lines: list[str] = []
    controller = JobController(cfg, log=lines.append)
    try:
        if endpoint:  # a client's group of two episodes, ended and rewarded
            client = JobEndpoint(lines)
            client.episode("c-0", "c", 1.0)
            client.episode("c-1", "c", 0.0)
        steps = 1 if turns == "multi" and cell != SPANNING else 2
        records = [controller.run_iteration(step) for step in range(1, steps + 1)]
        spans = list(controller.spans)
    finally:
        controller.shutdown()
    batch = cfg.grpo.prompts_per_step * cfg.grpo.group_size
    for record in records:
        assert record.samples == batch, lines[-20:]
    if turns == "multi":
        assert all(
            r.extra["episodes"]["episodes"] == batch and r.extra["episodes"]["faults"] == 0 for r in records
        )
    if turns == "multi" and cell != SPANNING:  # a call, its result read, an answer: on either engine
        assert records[0].extra["episodes"]["tool_calls"] > 0
    if cell == SPANNING:
        versions = {
            s.id: s.attrs["versions"] for s in spans if s.kind == "generate" and "versions" in s.attrs
        }
        spanning = [rid for rid, v in versions.items() if v == [0, 1]]
        assert spanning and all(rid.startswith("2-") for rid in spanning), versions  # wave 2's
        staleness = records[1].extra["staleness"]
        assert staleness.get("1", 0) >= len(spanning)  # trained from their oldest turn, v0
        print(f"{len(spanning)} of wave 2's episodes span v0 and v1; step 2's staleness: {staleness}")
    if endpoint:
        assert sum(r.extra["endpoint"]["episodes_trained"] for r in records) == 2, [r.extra for r in records]
