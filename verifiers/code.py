"""Judge a Python solution against test cases, in the sandbox.

The sample's text is the solution (a fenced ```python block is taken from it if there is one); the
reference is JSON: `{"tests": ["assert add(1, 2) == 3", ...], "key": "problem-17"}` (`key`, optional,
names the test set whose history sets the timeout; the sample id's problem otherwise). A harness
runs the solution, then each test in turn, and prints one JSON line: how many passed and the first
failure. Reward = the fraction of tests passed; correct = all passed.

The contract decides what a timeout means. A solution must finish within its time limit, so a
solution that hangs, exhausts memory or crashes is a wrong answer (reward 0), not a fault. The
verifier faults only when it cannot judge: the sandbox itself failed, the reference is malformed,
or the harness produced no result. The result line carries a fresh random mark and is the last thing
the harness prints before `os._exit`; a solution could still read the mark from its own source and
race a forged line in from a thread (noted, not yet closed). Time limits are adaptive per key
(`rlsched.policy.timeouts`, RollPacker's rule): correct runs raise the key's anchor, and a run is
stopped at `min(max(floor, 1.5 x anchor), cap)`.
"""

from __future__ import annotations

import json
import secrets

from rlsched.policy.timeouts import TimeoutParams, TimeoutTable
from verifiers.protocol import ExecutionFault, FaultKind, Outcome, Verdict, VerifyRequest, fenced_code
from verifiers.sandbox import Outcome as Run
from verifiers.sandbox import SandboxLimits, run_sandboxed

_HARNESS = """
import json, os, sys
_tests = json.loads({tests!r})
_passed, _first = 0, ""
_ns = {{"__name__": "__solution__"}}
try:
    exec(compile({solution!r}, "solution.py", "exec"), _ns)
except BaseException as _err:
    _first = "the solution does not run: " + repr(_err)[:200]
else:
    for _test in _tests:
        try:
            exec(compile(_test, "test.py", "exec"), _ns)
            _passed += 1
        except BaseException as _err:
            _first = _first or (_test[:120] + ": " + repr(_err)[:160])
sys.stdout.flush()
print({mark!r} + json.dumps({{"passed": _passed, "total": len(_tests), "first_failure": _first}}), flush=True)
os._exit(0)  # nothing of the solution's (atexit hooks, threads) may print after the result
"""


def solution_of(text: str) -> str:
    """The code in a sample: its first fenced Python block, else the whole text."""
    return fenced_code(text, ("python", "py"))


class CodeVerifier:
    name = "code"

    def __init__(self, limits: SandboxLimits | None = None, timeouts: TimeoutParams | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.timeouts = TimeoutTable(timeouts)

    def verify(self, request: VerifyRequest) -> Outcome:
        try:
            spec = json.loads(request.reference)
            tests = [str(t) for t in spec["tests"]]
            key = str(spec.get("key", request.sample_id.rsplit("/", 1)[0]))
        except (ValueError, KeyError, TypeError) as err:
            return self._fault(request, FaultKind.CRASH, f"reference is not {{'tests': [...]}} JSON: {err}")
        if not tests:
            return self._fault(request, FaultKind.CRASH, "reference has no tests")
        timeout = self.timeouts.timeout(key)
        mark = f"__rlsched_{secrets.token_hex(8)}__"  # per run, so output cannot be forged ahead of time
        program = _HARNESS.format(tests=json.dumps(tests), solution=solution_of(request.text), mark=mark)
        limits = SandboxLimits(
            **(vars(self.limits) | {"timeout_s": timeout, "cpu_s": max(1, int(timeout) + 1)})
        )
        run = run_sandboxed(program, limits)
        match run.outcome:
            case Run.ERROR:
                return self._fault(request, FaultKind.RESOURCES, f"sandbox: {run.stderr.strip()[:300]}")
            case Run.TIMEOUT:
                return Verdict(
                    request.sample_id, 0.0, False, f"timeout: did not finish within {timeout:.3g} s"
                )
            case Run.MEMORY:
                return Verdict(request.sample_id, 0.0, False, f"memory limit ({limits.memory_mb} MB)")
        line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(mark)), None)
        if line is None:  # killed by a signal, or it closed stdout: the solution's doing
            return Verdict(request.sample_id, 0.0, False, f"no result ({run.outcome}, signal {run.signal})")
        result = json.loads(line.removeprefix(mark))
        passed, total = int(result["passed"]), int(result["total"])
        if passed == total:
            self.timeouts.correct_run(key, run.wall_s)
        return Verdict(request.sample_id, passed / total, passed == total, result["first_failure"])

    @staticmethod
    def _fault(request: VerifyRequest, kind: FaultKind, detail: str) -> ExecutionFault:
        return ExecutionFault(request.sample_id, kind, f"code: {detail}", request.attempt)
