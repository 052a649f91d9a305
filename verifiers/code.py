"""Judge a Python solution against test cases: the solution runs in the sandbox, the tests on the host.

The sample's text is the solution (a fenced ```python block is taken from it if there is one); the
reference is JSON: `{"tests": ["assert add(1, 2) == 3", ...], "key": "problem-17"}` (`key`, optional,
names the test set whose history sets the timeout; the sample id's problem otherwise). A test is any
Python statement block: an `assert`, or a HumanEval-style `def check(candidate): ...` followed by
`check(add)`. Reward = the fraction of tests passed; correct = all passed.

A verdict the solution cannot forge. The tests and their expected values never enter the sandbox.
The sandboxed program is a small server (`_SERVER` below): it runs the solution, reports the names
of the functions it defined, then answers calls, one JSON line each, over a channel of its own
(fds 3 and 4, not stdout). On the host every such name is a proxy: the test code runs in the
verifier's process, and each call of `add(1, 2)` travels to the sandbox as plain data and comes back
as plain data (`verifiers/plain_data.py`: exact built-in types only, rebuilt fresh on the host).
So exiting early, emptying a list of tests, an object whose comparisons are always true, patching
modules or builtins, printing a verdict line: none of these changes what the host computes, and the
number of tests comes from the reference, never from the program. One limit of this shape: a
solution's mutations of its arguments do not reach the host (the arguments are copies).

The contract decides what a timeout means. A solution must finish within its time limit (the cap of
`verifier.timeout`), so a solution that runs past it, hangs, exhausts memory or crashes is a wrong
answer (reward 0), as code benchmarks score a time limit exceeded. Runs are stopped earlier by an
adaptive timeout per key (`rlsched.policy.timeouts`, RollPacker's rule: correct runs raise the key's
anchor, and a run is stopped at `min(max(floor, 1.5 x anchor), cap)`); a run stopped there, below the
limit, is an execution fault, since a correct but slow run must not score 0: the pool retries it with
the whole limit. The pool sets both on the request (`timeout_s`, `limit_s`) and kills the worker only
a grace period later, so the sandbox's own stop is what ends a run. The verifier also faults when it
cannot judge: the sandbox itself failed (or refused to run with the isolation it was asked for), or
the reference is malformed.
"""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlsched.policy.timeouts import TimeoutParams, TimeoutTable
from verifiers import plain_data
from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Verdict, VerifyRequest, fenced_code
from verifiers.sandbox import Outcome as Run
from verifiers.sandbox import Running, Sandbox, SandboxLimits, SandboxPolicy, SandboxResult

# after plain_data's source: run the solution, say what it defined, answer calls until told to stop
_SERVER = """
import os as _os
_rin, _rout = open(3, "rb"), open(4, "wb", buffering=0)
_say = lambda message: _rout.write((json.dumps(message, separators=(",", ":")) + "\\n").encode())
_ns = {"__name__": "__solution__"}
try:
    exec(compile(_SOLUTION, "solution.py", "exec"), _ns)
except BaseException as _err:
    _say({"error": repr(_err)[:300]})
    _os._exit(0)
_say({"ready": sorted(k for k, v in _ns.items() if callable(v) and not k.startswith("__"))})
for _line in _rin:
    _req = json.loads(_line)
    if _req.get("op") == "exit":
        break
    try:
        _value = _ns[_req["fn"]](*decode(_req["args"]), **decode(_req["kwargs"]))
        _say({"id": _req["id"], "value": encode(_value)})
    except BaseException as _err:
        _say({"id": _req["id"], "raised": type(_err).__name__, "detail": repr(_err)[:300]})
_os._exit(0)
"""
_PLAIN_DATA_SOURCE = Path(plain_data.__file__).read_text()


def solution_of(text: str) -> str:
    """The code in a sample: its first fenced Python block, else the whole text."""
    return fenced_code(text, ("python", "py"))


def server_program(solution: str) -> str:
    return f"{_PLAIN_DATA_SOURCE}\n_SOLUTION = {solution!r}\n{_SERVER}"


class SolutionGone(Exception):
    """The solution's process is no longer answering: it exited, was killed, or ran out of time."""


class RemoteError(Exception):
    """The solution raised an exception that is not a built-in one."""


class _Remote:
    """The host's side of the channel: a call of a proxy is a request line and a response line."""

    def __init__(self, run: Running) -> None:
        self.run = run
        self.calls = 0

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        try:
            request = {
                "id": self.calls,
                "fn": name,
                "args": plain_data.encode(list(args)),
                "kwargs": plain_data.encode(kwargs),
            }
        except plain_data.NotPlainData as err:
            raise TypeError(f"the test passes {name} an argument that cannot cross: {err}") from None
        if not self.run.send(json.dumps(request).encode()):
            raise SolutionGone("the solution's process is gone")
        line = self.run.receive(cap=REPLY_BYTES)
        if line is None:
            raise SolutionGone("the solution's process stopped answering")
        try:
            reply = json.loads(line)
            if reply.get("id") != self.calls:
                raise ValueError("a reply out of order")
            raised = str(reply["raised"]) if "raised" in reply else None
            value = None if raised is not None else plain_data.decode(reply["value"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SolutionGone(f"a malformed reply from the solution ({err})") from None
        if time.monotonic() > self.run.deadline:  # decoding counts against the solution's time
            self.run.kill()
            raise SolutionGone("the solution ran out of time")
        if raised is not None:
            raise _exception(raised, str(reply.get("detail", "")))
        return value


def _exception(name: str, detail: str) -> Exception:
    """The solution's exception, as the built-in of that name (so a test may catch ValueError), or a
    RemoteError."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception) and kind not in _NOT_CROSSING:
        try:
            return kind(detail)
        except TypeError:
            pass
    return RemoteError(f"{name}: {detail}")


# these would steer the host's own control flow: a StopIteration raised in `map` ends it early
_NOT_CROSSING = (StopIteration, StopAsyncIteration)
REPLY_BYTES = 1 << 20  # the largest reply line the host reads


class _Proxy:
    def __init__(self, remote: _Remote, name: str) -> None:
        self._remote, self.__name__ = remote, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call(self.__name__, args, kwargs)


def run_tests(tests: list[str], names: list[str], remote: _Remote) -> tuple[int, str]:
    """Run each test on the host against the solution's functions; (passed, first failure)."""
    namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
    # a solution's `abs` or `len` must not stand in for the built-in a test uses to compare
    proxied = (n for n in names if not hasattr(builtins, n) and not n.startswith("_"))
    namespace.update({name: _Proxy(remote, name) for name in proxied})
    passed, first = 0, ""
    for test in tests:
        try:
            exec(compile(test, "test.py", "exec"), namespace)
            passed += 1
        except Exception as err:  # noqa: BLE001 (a failing test, whatever it raised)
            first = first or f"{test.strip().splitlines()[-1][:120]}: {type(err).__name__}: {str(err)[:160]}"
    return passed, first


class CodeVerifier:
    name = "code"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        timeouts: TimeoutParams | None = None,
        policy: SandboxPolicy | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.timeouts = TimeoutTable(timeouts)
        self.policy = policy or SandboxPolicy()

    def verify(self, request: VerifyRequest) -> Outcome:
        try:
            spec = json.loads(request.reference)
            tests = [str(t) for t in spec["tests"]]
            key = str(spec.get("key", request.sample_id.rsplit("/", 1)[0]))
        except (ValueError, KeyError, TypeError) as err:
            return self._fault(request, FaultKind.CRASH, f"reference is not {{'tests': [...]}} JSON: {err}")
        if not tests:
            return self._fault(request, FaultKind.CRASH, "reference has no tests")
        timeout, limit = self._times(request, key)
        limits = replace(self.limits, timeout_s=timeout, cpu_s=max(1, int(timeout) + 1))
        with Sandbox.create(self.policy, persistent=False) as box:
            run = box.start(server_program(solution_of(request.text)), limits=limits, channel=True)
            passed, first = self._judge(run, tests)
            judged_s = time.monotonic() - run.start  # what it lingers after is not its running time
            run.send(b'{"op": "exit"}')
            result = run.wait()
        if result.outcome is Run.ERROR:
            detail = (result.error or result.stderr)[:300]
            return self._fault(request, FaultKind.RESOURCES, f"sandbox: {detail}")
        if passed < len(tests) and result.outcome is Run.TIMEOUT and timeout < limit:
            detail = (
                f"stopped by the adaptive timeout at {timeout:.3g} s, below the time limit of "
                f"{limit:.3g} s: a slow but correct run must not score 0, so it is retried to the limit"
            )
            return self._fault(request, FaultKind.TIMEOUT, detail)
        if passed < len(tests) and result.outcome in (Run.TIMEOUT, Run.MEMORY):
            first = _limit_detail(result, timeout, limits) + (f"; {first}" if first else "")
        if passed == len(tests):
            self.timeouts.correct_run(key, min(judged_s, result.wall_s))
        return Verdict(request.sample_id, passed / len(tests), passed == len(tests), first)

    def _times(self, request: VerifyRequest, key: str) -> tuple[float, float]:
        """This attempt's timeout and the time limit: the pool's (it sets both on the request), else
        this verifier's own table's (a direct call: an evaluation, a test)."""
        if request.timeout_s is not None:
            limit = request.limit_s if request.limit_s is not None else request.timeout_s
            return request.timeout_s, max(limit, request.timeout_s)
        return self.timeouts.timeout(key), self.timeouts.limit

    @staticmethod
    def _judge(run: Running, tests: list[str]) -> tuple[int, str]:
        hello = run.receive()
        if hello is None:  # it never got as far as defining its functions
            return 0, "no result: the solution's process ended before it was ready"
        try:
            message = json.loads(hello)
            if "error" in message:
                return 0, f"the solution does not run: {str(message['error'])[:300]}"
            names = [str(n) for n in message["ready"] if str(n).isidentifier()]
        except Exception:  # noqa: BLE001 (anything the solution wrote first: too deep, not JSON, ...)
            return 0, "no result: a malformed first message from the solution's process"
        return run_tests(tests, names, _Remote(run))

    @staticmethod
    def _fault(request: VerifyRequest, kind: FaultKind, detail: str) -> ExecutionFault:
        return ExecutionFault(request.sample_id, kind, f"code: {detail}", request.attempt)


def _limit_detail(result: SandboxResult, timeout: float, limits: SandboxLimits) -> str:
    if result.outcome is Run.TIMEOUT:
        return f"timeout: did not finish within {timeout:.3g} s"
    return f"memory limit ({limits.memory_mb} MB)"
