"""An episode's tools in its own sandbox: files kept between calls, and every way a call can go wrong
returned to the model as an error observation, not a crash; nothing of it outlives `close`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.protocol import EnvironmentFault, ToolSpec
from environments.sandboxed import SandboxedTools, ToolEnvironments
from rlsched.serve.tools import ParsedCall, parse_hermes

NOTE = ToolSpec(
    "note",
    "append a line to notes.txt and return every line so far",
    {"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]},
)
HANG = ToolSpec("hang", "never returns", timeout_s=1.0)
CRASH = ToolSpec("crash", "divides by zero")
PROGRAMS = {
    "note": "open('notes.txt', 'a').write(args['line'] + '\\n')\nprint(open('notes.txt').read().strip())",
    "hang": "import time\ntime.sleep(60)",
    "crash": "print(1 / 0)",
}


def call(name: str, arguments: object) -> ParsedCall:
    return ParsedCall(
        f"call-{name}", name, arguments if isinstance(arguments, str) else json.dumps(arguments)
    )


@pytest.fixture()
def env() -> SandboxedTools:
    tools = SandboxedTools((NOTE, HANG, CRASH), PROGRAMS, setup="open('task.txt', 'w').write(args['prompt'])")
    tools.reset("remember two things")
    return tools


def test_calls_share_the_episodes_work_directory(env: SandboxedTools) -> None:
    try:
        assert env.step(call("note", {"line": "one"})).text == "one"
        second = env.step(call("note", {"line": "two"}))
        assert second.text == "one\ntwo" and not second.error and second.call_id == "call-note"
    finally:
        usage = env.close()
    assert usage["executions"] == 3  # the setup and two calls


def test_a_model_reply_parsed_into_a_call_runs(env: SandboxedTools) -> None:
    reply = parse_hermes('<tool_call>{"name": "note", "arguments": {"line": "parsed"}}</tool_call>')
    assert reply is not None
    try:
        assert env.step(reply.calls[0]).text == "parsed"
    finally:
        env.close()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (call("hang", {}), "hang did not finish within 1 s and was stopped"),
        (call("crash", {}), "crash failed: ZeroDivisionError: division by zero"),
        (call("search", {"q": "x"}), "there is no tool 'search'; the tools are: crash, hang, note"),
        (call("note", "{line: one}"), "note was called with bad arguments: not JSON"),
        (call("note", {"text": "one"}), "note was called with bad arguments: 'line' is a required property"),
        (call("note", {"line": 3}), "note was called with bad arguments: 3 is not of type 'string'"),
    ],
)
def test_a_call_that_goes_wrong_is_an_error_observation(
    env: SandboxedTools, bad: ParsedCall, says: str
) -> None:
    try:
        got = env.step(bad)
        assert got.error and got.text.startswith(f"error: {says}"), got.text
        assert not env.step(call("note", {"line": "after"})).error  # the episode goes on
    finally:
        env.close()


def test_nothing_of_the_environment_outlives_close(env: SandboxedTools) -> None:
    box = env._box
    assert box is not None
    host = Path(box.host_dir)
    assert host.exists()
    env.close()
    assert not host.exists() and env.close() == {}


def test_a_setup_that_fails_is_an_environment_fault_not_an_observation() -> None:
    tools = SandboxedTools((NOTE,), PROGRAMS, setup="raise SystemExit('no dataset')")
    with pytest.raises(EnvironmentFault, match="setup failed"):
        tools.reset("task")
    with pytest.raises(EnvironmentFault, match="setup failed"):  # a call prepares it again, and fails
        tools.step(call("note", {"line": "x"}))


def test_released_between_calls_the_files_come_back_in_a_new_sandbox(env: SandboxedTools) -> None:
    try:
        assert env.step(call("note", {"line": "one"})).text == "one"
        env.release()
        assert not env.live
        assert env.step(call("note", {"line": "two"})).text == "one\ntwo"  # prepared on demand
        assert env.step(call("note", {"line": "three"})).text == "one\ntwo\nthree"
        assert env.preparations == 2
    finally:
        env.close()


def test_a_restored_archive_cannot_reach_outside_the_work_directory(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host file")
    tools = SandboxedTools((NOTE,), PROGRAMS)
    tools.reset("x")
    link = "import os\nos.symlink(" + repr(str(secret)) + ", 'escape')\nprint('made')"
    sneaky = SandboxedTools((ToolSpec("link", "makes a link"),), {"link": link})
    sneaky.reset("x")
    try:
        assert sneaky.step(call("link", {})).text == "made"
        with pytest.raises(EnvironmentFault, match="could not be restored"):
            sneaky.release()
            sneaky.prepare()  # tar's data filter refuses a link that leads out of the directory
    finally:
        sneaky.close()
        tools.close()
    assert secret.read_text() == "host file"


def test_tool_environments_route_each_call_to_its_kind_and_act_on_one_kind_at_a_time() -> None:
    kinds = {
        "notes": SandboxedTools((NOTE,), PROGRAMS),
        "broken": SandboxedTools((CRASH,), PROGRAMS),
    }
    envs = ToolEnvironments(kinds)
    envs.reset("task")
    try:
        assert envs.preparations == 0 and envs.kind_of("crash") == "broken"  # armed, not prepared
        envs.prepare("notes")
        assert envs.step(call("note", {"line": "a"})).text == "a"
        envs.release("notes")
        assert envs.step(call("note", {"line": "b"})).text == "a\nb"  # prepared again, files back
        assert envs.step(call("crash", {})).error
        assert envs.step(call("nope", {})).text.startswith("error: there is no tool 'nope'")
        assert envs.preparations == 3 and kinds["notes"].live and kinds["broken"].live
    finally:
        usage = envs.close()
    assert set(usage) == {"notes", "broken"} and not any(k.live for k in kinds.values())


def test_an_episode_whose_files_could_not_be_kept_is_refused_a_rebuild_without_them() -> None:
    """The Ray environment host (`rlsched/bench/envs.py`, driven here without Ray): a work directory over
    the environment's size is not archived, and the episode's next environment is refused, naming
    why, instead of being built empty as if nothing had been lost."""
    from rlsched.bench.envs import EnvHostImpl, EnvKind
    from verifiers.sandbox import capabilities

    if missing := capabilities().missing():
        pytest.skip(f"this machine lacks: {'; '.join(missing)}")
    host = EnvHostImpl({"shell": EnvKind(memory_mb=1, fetch_s=0.0, workspace_mb=1, tool_s=0.0)})
    try:
        assert host.prepare("env-1", "shell", "ep") is not None
        work = host.live["env-1"].box.work
        assert work is not None
        with (work / "holes").open("wb") as f:
            f.truncate(256 << 20)  # sparse: no disk, but 256 MB of data to archive
        host.release("env-1", keep_files=True)
        assert list(host.report()["unsaved_files"]) == ["ep/shell"]
        with pytest.raises(
            RuntimeError,
            match=r"episode ep's shell environment files were not kept: .* more than the environment's 17 MB",
        ):
            host.prepare("env-2", "shell", "ep")
        assert host.report()["live"] == [] and host.report()["kept_files"] == 0
    finally:
        host.shutdown()


def test_a_cancellation_that_reaches_the_host_early_or_late_still_ends_the_environment() -> None:
    """The core cancels what it believes is still preparing, but the host is a threaded actor: the
    cancellation may run before its preparation started, or after it finished and before the core
    heard so. Either way nothing stays live (a prewarmed environment left running was a flake in
    tests/ray/test_env_driver.py)."""
    from rlsched.bench.envs import EnvHostImpl, EnvKind
    from verifiers.sandbox import capabilities

    if missing := capabilities().missing():
        pytest.skip(f"this machine lacks: {'; '.join(missing)}")
    host = EnvHostImpl({"shell": EnvKind(memory_mb=1, fetch_s=0.0, workspace_mb=1, tool_s=0.0)})
    try:
        host.cancel("env-1")  # before its preparation ran
        assert host.prepare("env-1", "shell", "ep") is None
        assert host.report()["created"] == 0
        assert host.prepare("env-2", "shell", "ep") is not None
        host.cancel("env-2")  # after it was ready
        report = host.report()
        assert report["live"] == [] and report["sandbox_dirs"] == [] and report["created"] == 1
        host.cancel("env-2")  # once more, after it is gone: nothing happens
        assert host.prepare("env-3", "shell", "ep") is not None and host.report()["live"] == ["env-3"]
    finally:
        host.shutdown()
