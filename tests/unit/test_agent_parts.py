"""The pieces of a multi-turn job that need no model: why a tool call does not parse, the teacher's
arithmetic, and the `agent` section's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rlsched.config import JobConfig
from rlsched.errors import UserError
from rlsched.rl.word_problems import LEVELS, draw_problem, expression_of
from rlsched.serve.tools import malformed, parse_hermes

CALC = {
    "name": "calculator",
    "program": "print(eval(args['expression']))",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>{"name": "calculator", "arguments": ', "not closed"),
        ('<tool_call>{"name": "calculator", "arguments": }</tool_call>', "not JSON"),
        ('<tool_call>["calculator"]</tool_call>', '"name" string'),
        ('<tool_call>{"name": "c", "arguments": {}}</tool_call> and then', "nothing after them"),
    ],
)
def test_a_call_that_does_not_parse_says_why(text: str, why: str) -> None:
    assert parse_hermes(text) is None
    problem = malformed(text)
    assert problem is not None and why in problem


def test_well_formed_calls_and_plain_answers_are_not_malformed() -> None:
    good = 'Let me add.<tool_call>\n{"name": "c", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    assert malformed(good) is None and parse_hermes(good) is not None
    assert malformed("The answer is \\boxed{3}.") is None


def test_the_teachers_expression_is_the_problems_arithmetic() -> None:
    import random

    rng = random.Random(3)
    for level in LEVELS.values():
        for _ in range(50):
            p = draw_problem(rng, level)
            value = eval(expression_of(p.id))
            assert str(value) == p.answer, p.id
    with pytest.raises(ValueError, match="not the id"):
        expression_of("row-17")


def test_the_agent_section_is_checked_when_the_job_is_loaded() -> None:
    ok = JobConfig.model_validate({"agent": {"tools": [CALC]}})
    assert ok.agent.enabled and not JobConfig().agent.enabled
    cases = [
        ({"tools": [CALC, CALC]}, "tools named twice: calculator"),
        ({"tools": [CALC | {"environment": "gpu"}]}, "not declared under agent.environments: gpu"),
        ({"tools": [CALC | {"parameters": {"type": "nope"}}]}, "not a valid JSON schema"),
        ({"tools": [CALC | {"program_file": "x.py"}]}, "its program or its program_file, one of them"),
        ({"tools": [CALC | {"name": "two words"}]}, "use letters, digits"),
        ({"tools": [CALC], "policy": "prewarm", "prewarm_lead_s": -1}, "greater than or equal to 0"),
    ]
    for agent, why in cases:
        with pytest.raises(ValidationError, match=why):
            JobConfig.model_validate({"agent": agent})


def test_the_ray_runtime_refuses_what_a_multi_turn_job_cannot_run_with_the_fix(tmp_path: Path) -> None:
    from rlsched.job.preflight import preflight

    cases = [
        ({}, "needs a chat template that describes the tools"),  # the toy base's template has none
        ({"agent": {"tools": [CALC], "chat_template": "nope.jinja"}}, "nope.jinja does not exist"),
    ]
    for extra, why in cases:
        cfg = JobConfig.model_validate({"agent": {"tools": [CALC]}} | extra)
        with pytest.raises(UserError, match=why):
            preflight(cfg, tmp_path)


def test_a_tools_program_that_is_missing_or_not_python_is_refused_before_any_episode(tmp_path: Path) -> None:
    from rlsched.rl.agent import environment_factory

    missing = JobConfig.model_validate(
        {"agent": {"tools": [CALC | {"program": None, "program_file": "nope.py"}]}}
    )
    with pytest.raises(UserError, match="cannot be read"):
        environment_factory(missing.agent)
    broken = JobConfig.model_validate({"agent": {"tools": [CALC | {"program": "print(("}]}})
    with pytest.raises(UserError, match="is not valid Python"):
        environment_factory(broken.agent)
