"""What the end-to-end job tests share: the `rlsched` command in a subprocess, as a user runs it, and
waiting on a running job's outputs (its committed iterations, its timeline)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]

# an admin file for one node of 8 CPUs and one queue, for tests that start a scheduler on it
# a job with one process of each kind (one trainer rank, rollout instance and verifier worker), for the
# tests about something else than the gang or the fleet's size: each process a job starts imports
# torch and transformers, about 6-7 s of a core on the 2-core AMD EPYC (a quickstart's start-up is
# about 40 s of CPU, most of it those imports)
# a tool's parameters that any model finishes within a few dozen tokens (a pattern, not a maxLength:
# xgrammar 0.2.8 takes an encoded surrogate, ED A0 80, as one character, which decodes to three
# U+FFFD; a random model writes them, a trained one does not)
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
CHAT_TOOLS_TEMPLATE = ROOT / "configs" / "chat_templates" / "smollm2_tools.jinja"

ONE_OF_EACH = ["trainer.ranks=1", "rollout.instances=1", "verifier.workers=1"]

ONE_NODE_ADMIN = """
device_types: []
nodes:
  - {name: head, resources: {CPU: 8}}
priority_classes:
  low: {value: 10, preemptible: true, grace_s: 10, min_run_s: 0}
queues:
  research:
    nominal: {CPU: 8}
    default_priority: low
"""


def rlsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlsched.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=180
    )


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 300.0, every_s: float = 0.5) -> Any:
    """Poll `check` every `every_s` seconds until it gives something true, and return that; fail
    after `timeout_s`."""
    give_up = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(every_s)
    return got


class Printed:
    """A running command's output, read by threads as it is printed: a test waits for a line the job
    prints, as a user watching it would, instead of polling. A poll of `rlsched scale --json` is a Ray
    driver connecting, about 2 s of a core each time, taken from the job being waited for."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
            if stream is not None
        ]
        self._open = len(self._readers)
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self._lines[name].append(line)
                self._changed.notify_all()
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def wait_for_line(self, pattern: str, what: str, timeout_s: float = 300.0) -> str:
        """The first line of stdout that `pattern` matches, once printed; fail after `timeout_s` or
        when the output ends without one."""
        regex, seen = re.compile(pattern), 0
        give_up = time.monotonic() + timeout_s
        with self._changed:
            while True:
                lines = self._lines["stdout"]
                hit = next((line for line in lines[seen:] if regex.search(line)), None)
                if hit is not None:
                    return hit
                seen = len(lines)
                left = give_up - time.monotonic()
                assert left > 0, f"timed out waiting for {what}"
                assert self._open > 0, f"the output ended before {what}:\n{''.join(lines[-40:])}"
                self._changed.wait(left)

    def finish(self, timeout_s: float) -> tuple[str, str]:
        """Wait for the command to end; all it printed, stdout and stderr."""
        self.proc.wait(timeout_s)
        for reader in self._readers:
            reader.join(timeout_s)
        return "".join(self._lines["stdout"]), "".join(self._lines["stderr"])


def committed(out: Path) -> int:
    """Iterations a job writing to `out` has committed so far."""
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def spans(out: Path) -> list[dict[str, Any]]:
    """The complete spans of a finished job's timeline.json."""
    return [e for e in json.loads((out / "timeline.json").read_text())["traceEvents"] if e["ph"] == "X"]


def dataset_task(path: Path, *sets: str) -> Any:
    """The dataset task of `task.key=value` settings (the section alone: eval sizes below eval's minimum)."""
    from rlsched.config_load import apply_override
    from rlsched.config_task import TaskConfig
    from rlsched.rl.datasets import DatasetTask
    from rlsched.rl.tasks import build_task

    tree: dict[str, Any] = {"task": {"name": "dataset", "path": str(path)}}
    for assignment in sets:
        apply_override(tree, assignment)
    task = build_task(TaskConfig.model_validate(tree["task"]))
    assert isinstance(task, DatasetTask)
    return task


def leave_stream_early(
    client: Any, backend: Any, model: str, messages: Any, max_tokens: int, timeout_s: float = 30.0
) -> tuple[int, int]:
    """Open a long `openai` stream, read a few events, close it as a departing client does, and
    wait for the endpoint's backend to idle; what it then has (running, waiting)."""
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}
    )
    for _, _chunk in zip(range(5), stream, strict=False):
        pass
    stream.close()
    deadline = time.monotonic() + timeout_s
    while (backend.running or backend.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    return backend.running, backend.waiting


def replays_in_every_driver(cfg: Any, trace: Any) -> list[str]:
    """A recorded Ray run's iteration events fed to the core each other driver builds from the same
    job config (the simulator's, from `sim_job_of(cfg)`; `--local`'s), each started in the recorded
    core's state (version, time, steps committed), and to a copy of the recorded core: where any of
    them departs from the record (empty: every driver's core made the same decisions)."""
    from rlsched.rl.loop import iteration_core as local_core
    from rlsched.sim.replay import compare, replay
    from rlsched.sim.rljob import iteration_core as sim_core
    from rlsched.sim.scenario import sim_job_of

    first = trace.initial
    state = {"version": first.version, "at": first.last_commit, "steps": first.steps}
    cores = {"sim": sim_core(sim_job_of(cfg), **state), "local": local_core(cfg, **state)}
    problems = []
    for name, core in cores.items():
        core.start()  # its first word, as the recorded core had said it before recording began
        problems += [f"{name}: {line}" for line in compare(trace, replay(trace, core))]
    return problems + [f"copy: {line}" for line in compare(trace, replay(trace))]


class JobEndpoint:
    """A job's OpenAI endpoint, found where the job printed it, as a client uses it: `episode` asks for
    one short turn of an episode, ends it and, given a reward, rewards it."""

    def __init__(self, lines: list[str]) -> None:
        from openai import OpenAI

        (line,) = [x for x in lines if x.startswith("endpoint: ")]
        self.base_url = line.split(" at ")[1].split()[0]
        self.client = OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)
        self.ask: dict[str, Any] = {
            "model": self.client.models.list().data[0].id,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 4,
            "temperature": 1.0,
        }

    def episode(
        self, episode_id: str, group_id: str, reward: float | None = None, reference: str | None = None
    ) -> None:
        """One turn, ended; rewarded with `reward`, or judged by the job's verifier against
        `reference`."""
        import httpx

        extra = {"episode_id": episode_id, "group_id": group_id}
        if reference is not None:
            extra["reference"] = reference
        self.client.chat.completions.create(**self.ask, extra_body=extra)
        assert httpx.post(f"{self.base_url}/episodes/{episode_id}/end", timeout=30).is_success
        if reward is not None:
            self.reward(episode_id, reward)

    def reward(self, episode_id: str, reward: float) -> None:
        import httpx

        url = f"{self.base_url}/episodes/{episode_id}/reward"
        assert httpx.post(url, json={"reward": reward}, timeout=30).is_success

    def get(self, episode_id: str) -> Any:
        import httpx

        return httpx.get(f"{self.base_url}/episodes/{episode_id}", timeout=30).json()
