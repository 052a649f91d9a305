"""A GRPO job with vLLM in its rollout instances, on an embedded Ray cluster (`make test-vllm`).

The quickstart job with `engine.kind: vllm`, shortened and with long fixed-length samples, runs as a
user runs it. While it runs, `rlsched scale` adds an instance: it starts its own vLLM engine, pulls the
current version over the weight link, loads it in place and serves mid-job. Then it is removed
abruptly (`--preempt`): its unfinished requests resume on the other instance from their saved tokens.
An iteration later, `rlsched finish` ends the job with its final evaluation and outputs. Every
iteration uses every sample exactly once, at the version being trained.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.helpers import ROOT, Printed, committed, rlsched, spans, wait_for

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray]
STEPS, PROMPTS, GROUP = 40, 16, 4
OVERRIDES = [
    f"grpo.steps={STEPS}",
    "grpo.time_budget_s=900",
    f"grpo.prompts_per_step={PROMPTS}",
    f"grpo.group_size={GROUP}",
    "sampling.max_tokens=48",
    "sampling.ignore_eos=true",
    "eval.every_steps=1000",
    "eval.curve_size=32",
    "task.eval_size=64",
    "rollout.instances=1",
    "rollout.request_batch=8",
    "store.flush_s=0.05",
    "rollout.endpoint.enabled=true",
]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, int, list[Any]]:
    out = tmp_path_factory.mktemp("runs") / "vllm-job"
    sets = [x for o in OVERRIDES for x in ("--set", o)]
    command = [
        sys.executable,
        "-m",
        "rlsched.cli",
        "run",
        "configs/jobs/quickstart_vllm.yaml",
        "--out",
        str(out),
    ]
    job = subprocess.Popen(
        [*command, *sets], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    printed = Printed(job)
    try:
        wait_for(lambda: committed(out) >= 2, "iteration 2 to commit", timeout_s=400)
        answers = ask_the_endpoint(printed)
        assert rlsched("scale", out.name, "--add", "1").returncode == 0
        printed.wait_for_line(r"^scaled-1 joined at v", "scaled-1 to be READY", timeout_s=300)
        served_from = committed(out) + 1
        wait_for(lambda: committed(out) >= served_from + 1, "scaled-1 to serve an iteration", timeout_s=120)
        removed = rlsched("scale", out.name, "--remove", "scaled-1", "--preempt")
        assert removed.returncode == 0, removed.stderr
        printed.wait_for_line(r"^scaled-1 preempted", "scaled-1 to be preempted", timeout_s=120)
        # its requests resume on rollout-0 within the iteration in progress: once that one is
        # committed, there is nothing left to see (STEPS is room for a slow machine's join)
        preempted_in = committed(out) + 1
        wait_for(lambda: committed(out) >= preempted_in, "the preemption's iteration", timeout_s=120)
        finished = rlsched("finish", out.name)
        assert finished.returncode == 0, finished.stderr
        stdout, _ = printed.finish(timeout_s=900)
    finally:
        job.kill()
    assert job.returncode == 0, stdout[-4000:]
    print(stdout[-3000:])
    return stdout, out, served_from, answers


def ask_the_endpoint(printed: Printed) -> list[Any]:
    """The job's OpenAI endpoint, over its vLLM instances: a completion whole, then streamed."""
    line = printed.wait_for_line(r"^endpoint: .* at http://\S+/v1 over the rollout fleet", "the endpoint")
    url = re.search(r"(http://\S+/v1)", line)
    assert url is not None
    client = OpenAI(base_url=url.group(1), api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    ask = {"model": model, "prompt": "12+7=", "max_tokens": 6, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**ask)  # type: ignore[call-overload]
    chunks = list(client.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    return [whole, chunks]


def test_the_job_completes_and_learns_with_vllm_instances(vllm_run) -> None:
    stdout, out, _, _ = vllm_run
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # `rlsched finish` ended it after the iteration in progress: every iteration until then committed
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < STEPS
    assert re.search(rf"^finishing after {len(rows)} iterations, as `rlsched finish` asked", stdout, re.M)
    report = json.loads((out / "report.json").read_text())
    assert report["before"]["total"] == report["after"]["total"] == 64
    assert report["iterations"] == len(rows)
    # a new version every iteration, loaded in place by the instances (its load is timed)
    n = len(rows)
    assert [r["version"] for r in rows] == list(range(n)) and all(r["t_load"] > 0 for r in rows)
    assert re.search(r"rollout-0 joined at v0: transfer", stdout)


def test_every_sample_is_used_once_at_the_version_being_trained(vllm_run) -> None:
    _, out, _, _ = vllm_run
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    gen = [e for e in spans(out) if e["cat"] == "generate"]
    for r in rows:
        assert r["samples"] == r["used"] == PROMPTS * GROUP and r["stale_dropped"] == 0
        assert r["extra"]["sample_versions"] == [r["version"]]
        ids = Counter(e["name"] for e in gen if e["args"]["iteration"] == r["iteration"])
        assert len(ids) == PROMPTS * GROUP and set(ids.values()) == {1}


def test_a_scaled_vllm_instance_joins_serves_and_its_requests_resume_when_preempted(vllm_run) -> None:
    stdout, out, served_from, _ = vllm_run
    assert re.search(r"scaled-1 joined at v\d+: transfer .* load [0-9.]+ s", stdout)
    ev = spans(out)
    (join,) = [e for e in ev if e["cat"] == "join" and e["name"] == "join scaled-1"]
    served = [e for e in ev if e["cat"] == "generate" and e["args"]["lane"] == "scaled-1"]
    assert served and min(e["ts"] + e["dur"] for e in served) > join["ts"] + join["dur"]
    assert any(e["args"]["iteration"] >= served_from for e in served)
    assert "scaled-1 preempted" in stdout
    for r in [e for e in ev if e["cat"] == "resume"]:  # those it was running when it went
        a = r["args"]
        assert a["from"] == "scaled-1" and 0 < a["resumed_from"] <= a["saved"] < a["final_tokens"] == 48


def test_the_job_s_endpoint_streams_from_its_vllm_instances(vllm_run) -> None:
    """`rollout.endpoint` over vLLM rollout instances: each request goes to an instance's vLLM engine
    (`rlsched.engine.vllm.VllmStreams`) and streams back through the endpoint actor."""
    stdout, _, _, (whole, chunks) = vllm_run
    assert whole.usage.completion_tokens == 6 and whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed and len({c.id for c in chunks}) == 1
    assert "over the rollout fleet" in stdout
