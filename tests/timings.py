"""Where the suite's time goes: a pytest plugin that records every test's set-up, call and teardown
and every fixture's set-up, and writes them as one JSON (`--timings-json PATH`).

`scripts/ci_profile.py` renders that JSON as the tables kept in docs/development.md (by module, the
slowest tests and fixtures, a before/after), and `.ci/run` passes the option so that each CI run
leaves its profile behind. Under pytest-xdist the workers time their own fixtures and send them to
the controller with their reports (`user_properties`), so one file holds the whole run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

FIXTURE_KEY = "timings.fixtures"
GUARDS_KEY = "timings.guards"


def first_sentence(doc: str | None) -> str:
    """What a test or fixture guards: the first sentence of its docstring, on one line."""
    text = " ".join((doc or "").split())
    return text.split(". ")[0][:160]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timings-json",
        default=None,
        metavar="PATH",
        help="write every test's set-up/call/teardown and every fixture's set-up time to PATH (JSON)",
    )


def guards(item: pytest.Item) -> str:
    """What a test guards: its docstring's first sentence, else its module's (a module's docstring
    says what all of its tests are for)."""
    own = getattr(getattr(item, "obj", None), "__doc__", None) if hasattr(item, "obj") else None
    module = getattr(getattr(item, "module", None), "__doc__", None)
    return first_sentence(own) or (f"(module) {first_sentence(module)}" if module else "")


class Recorder:
    """Collects reports (controller side) and fixture set-ups (wherever the fixtures run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.time()
        self.tests: dict[str, dict[str, Any]] = {}
        self.fixtures: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []  # fixtures set up for the test being set up

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, None, None]:
        start = time.perf_counter()
        yield
        took = time.perf_counter() - start
        if took >= 0.05:  # the rest is noise, and there are tens of thousands of them
            self._pending.append(
                {
                    "fixture": fixturedef.argname,
                    "scope": fixturedef.scope,
                    "module": getattr(request.node, "nodeid", "").split("::")[0],
                    "seconds": round(took, 3),
                    "guards": first_sentence(getattr(fixturedef.func, "__doc__", None)),
                }
            )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, None, None]:
        outcome = yield
        report = outcome.get_result()
        if call.when == "setup":
            report.user_properties.append((GUARDS_KEY, guards(item)))
            if self._pending:
                report.user_properties.append((FIXTURE_KEY, self._pending))
                self._pending = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(
            report.nodeid,
            {"module": report.nodeid.split("::")[0], "setup": 0.0, "call": 0.0, "teardown": 0.0},
        )
        entry[report.when] = round(report.duration, 3)
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            entry["outcome"] = report.outcome
        node = getattr(report, "node", None)  # xdist's controller: the worker that ran it
        entry["worker"] = getattr(getattr(node, "gateway", None), "id", None)
        for key, value in report.user_properties:
            if key == FIXTURE_KEY and report.when == "setup":
                self.fixtures.extend(dict(f, test=report.nodeid) for f in value)
            elif key == GUARDS_KEY:
                entry["guards"] = value

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller writes the file
        data = {
            "started": self.started,
            "wall_s": round(time.time() - self.started, 1),
            "tests": self.tests,
            "fixtures": self.fixtures,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=1))


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--timings-json")
    if path:
        config.pluginmanager.register(Recorder(Path(path)), "timings-recorder")
