"""The endpoint's pure parts: the Hermes tool-call parser, the engine's priority intake, and the
request schema's refusals."""

from __future__ import annotations

import json
import threading

import pytest
from pydantic import ValidationError

from rlsched.engine.intake import Intake, IntakeClosed
from rlsched.engine.protocol import GenerationRequest, RequestId
from rlsched.serve.schema import ChatCompletionRequest
from rlsched.serve.tools import parse_hermes


def test_a_well_formed_call_is_parsed_with_its_arguments_as_json_text() -> None:
    reply = parse_hermes(
        'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert reply is not None
    assert reply.content == "Let me look.\n"
    [call] = reply.calls
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")


def test_several_calls_and_no_content() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"}</tool_call>'
    reply = parse_hermes(text)
    assert reply is not None and reply.content is None
    assert [c.name for c in reply.calls] == ["a", "b"]
    assert len({c.id for c in reply.calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "just text",
        '<tool_call>{"name": "a", "arguments": {}</tool_call>',  # not JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "a"}',  # never closed
        '<tool_call>{"name": "a"}</tool_call> and then more words',  # text after the call
        "<tool_call>[1, 2]</tool_call>",  # not an object
    ],
)
def test_anything_malformed_stays_text(text: str) -> None:
    assert parse_hermes(text) is None


def req(name: str) -> GenerationRequest:
    return GenerationRequest(RequestId(name), (1, 2, 3))


def test_the_intake_serves_lower_priority_values_first_then_arrival_order() -> None:
    intake = Intake()
    for name, priority in [("a", 5), ("b", 0), ("c", 5), ("d", -1), ("e", 0)]:
        intake.put(req(name), priority)
    assert [r.request_id for r in intake.take(10)] == ["d", "b", "e", "a", "c"]


def test_a_withdrawn_request_is_never_taken() -> None:
    intake = Intake([req("a"), req("b")])
    assert intake.remove(RequestId("a")) and not intake.remove(RequestId("a"))
    assert len(intake) == 1
    assert [r.request_id for r in intake.take(5)] == ["b"]
    assert not intake.remove(RequestId("b"))  # taken already


def test_waiting_on_an_open_intake_returns_when_a_request_comes_and_false_once_closed() -> None:
    intake = Intake()
    threading.Timer(0.05, intake.put, args=(req("late"),)).start()
    assert intake.wait(timeout=5) and len(intake) == 1
    intake.take(1)
    intake.close()
    assert not intake.wait()
    with pytest.raises(IntakeClosed):
        intake.put(req("after"))


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize("field", ["prediction", "audio"])
def test_an_unimplemented_field_at_its_no_op_value_is_accepted_and_otherwise_refused(field: str) -> None:
    ChatCompletionRequest.model_validate(chat(**{field: None}))
    with pytest.raises(ValidationError, match=f"NOT_IMPLEMENTED:{field}"):
        ChatCompletionRequest.model_validate(chat(**{field: {"type": "content", "content": "x"}}))


def test_penalties_and_logit_bias_are_openais_fields_with_their_bounds() -> None:
    body = ChatCompletionRequest.model_validate(
        chat(frequency_penalty=0.5, presence_penalty=-2, logit_bias={"7": -100, "9": 2.5})
    )
    assert body.biases == ((7, -100.0), (9, 2.5))
    with pytest.raises(ValidationError, match="presence_penalty"):
        ChatCompletionRequest.model_validate(chat(presence_penalty=-2.5))


def test_fields_that_change_nothing_here_are_accepted_and_type_checked() -> None:
    """`store`, `metadata` and `service_tier`, which agent frameworks send by default, are accepted
    and ignored (`IGNORED`); a wrong type is still a 400, and an unknown field too."""
    body = chat(store=True, metadata={"run": "a"}, service_tier="auto", user="agent-1")
    assert ChatCompletionRequest.model_validate(body).store is True
    with pytest.raises(ValidationError, match="metadata"):
        ChatCompletionRequest.model_validate(chat(metadata={"run": 1}))
    with pytest.raises(ValidationError, match="storage"):
        ChatCompletionRequest.model_validate(chat(storage=True))


def test_an_agent_may_send_back_the_message_the_client_parsed() -> None:
    """What `response.choices[0].message.model_dump()` gives, appended to the history."""
    echoed = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    body = ChatCompletionRequest.model_validate(
        chat(
            messages=[
                {"role": "user", "content": "x"},
                echoed,
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ]
        )
    )
    assert body.messages[1].tool_calls is not None


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert ChatCompletionRequest.model_validate(chat(max_tokens=5, max_completion_tokens=9)).budget == 9


class _Chars:
    """A tokenizer of single characters (ids are code points), enough for `ChoiceText`."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


def stream(text: str, stops: tuple[str, ...], tag: str | None = None) -> list[str]:
    from rlsched.engine.protocol import TokenEvent
    from rlsched.serve.output import ChoiceText

    choice = ChoiceText(_Chars(), stops, tag)  # type: ignore[arg-type]
    return [choice.push([TokenEvent(RequestId("r"), ord(c), 0.0)], False) for c in text]


def test_only_what_could_begin_a_stop_string_is_held_back() -> None:
    deltas = stream("ab STx STOP", ("STOP",))
    assert deltas[:3] == ["a", "b", " "]  # nothing held: no stop string starts with these
    assert "".join(deltas) == "ab STx "  # "ST" waited until "x" showed it was not "STOP"; "STOP" never sent


def test_text_from_the_tool_tag_on_is_held_for_the_parser() -> None:
    deltas = stream("ok <tool_call>{}", (), "<tool_call>")
    assert "".join(deltas) == "ok "
    assert not any("<" in d for d in deltas)
