"""What a chat request constrains its reply to, as a grammar both engines decode under
(`rlsched.engine.protocol.Constraint`): structured outputs and forced tool calls.

- `response_format: {"type": "json_object"}`: any JSON object; `{"type": "json_schema", ...}`: JSON
  that validates against the schema (xgrammar's strict mode, as vLLM's: properties the schema does
  not list are not allowed unless it says so).
- `tool_choice: "required"`: one or more Hermes calls to the request's tools, each a call that fits
  its tool's parameter schema (one only with `parallel_tool_calls: false`); a named function: one
  call to it. The prompt already opens the first call (`rlsched.serve.prompts.forced_prefix`); the
  grammar covers the rest, in the layout the chat template writes calls in:
  `{"name": "f", "arguments": {...}}\\n</tool_call>`, then `\\n<tool_call>\\n` before each further call.

JSON is compact (`", "` and `": "` between items, no other whitespace): a small model given free
whitespace can spend its whole budget on newlines. A schema xgrammar cannot turn into a grammar is a
400 naming the reason (`ConstraintError`).
"""

from __future__ import annotations

import json
from typing import Any

from rlsched.engine.protocol import Constraint
from rlsched.serve.schema import ChatCompletionRequest, NamedToolChoice, Tool
from rlsched.serve.tools import CLOSE, OPEN


class ConstraintError(ValueError):
    """A schema that cannot be turned into a grammar (a 400 naming why)."""


_CALL_RULE = "rlsched_call"  # the one-call rule of a grammar of several calls


def _xgr() -> Any:
    import xgrammar

    return xgrammar


def json_grammar(schema: dict[str, Any], what: str) -> Any:
    """xgrammar's grammar of compact JSON that validates against `schema`."""
    try:
        return _xgr().Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    except Exception as err:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError for what it cannot convert
        raise ConstraintError(f"{what} cannot be decoded under: {err}") from None


def _literal(text: str) -> Any:
    return _xgr().Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def _call(tool: Tool, named: bool) -> Any:
    """One call's grammar after the prompt's opening: `{"name": ..., "arguments": ` (unless the prompt
    wrote it already, for a named function), the arguments, then the call's close."""
    args = json_grammar(
        tool.function.parameters or {"type": "object"}, f"tool {tool.function.name!r}'s parameters"
    )
    close = _literal("}\n" + CLOSE)
    if named:
        return _xgr().Grammar.concat(args, close)
    head = _literal('{"name": ' + json.dumps(tool.function.name) + ', "arguments": ')
    return _xgr().Grammar.concat(head, args, close)


def tool_call_constraint(req: ChatCompletionRequest) -> Constraint | None:
    """The grammar of a forced tool call's reply, or None where the choice forces none."""
    choice = req.tool_choice
    if not req.tools or choice in (None, "none", "auto"):
        return None
    xgr = _xgr()
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in req.tools if t.function.name == choice.function.name)
        return Constraint(str(_call(tool, named=True)), f"a call to {tool.function.name!r}")
    calls = [_call(t, named=False) for t in req.tools]
    one = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
    what = "a call to one of the request's tools"
    if req.parallel_tool_calls is False:
        return Constraint(str(one), what)
    rules = str(one).replace("root ::=", f"{_CALL_RULE} ::=", 1)
    more = json.dumps("\n" + OPEN + "\n")
    text = f"root ::= {_CALL_RULE} ({more} {_CALL_RULE})*\n{rules}"
    return Constraint(text, "calls to the request's tools")


def response_constraint(req: ChatCompletionRequest) -> Constraint | None:
    """The grammar `response_format` asks for, or None (`text`, or none given)."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(str(json_grammar({"type": "object"}, "a JSON object")), "a JSON object")
    assert fmt.json_schema is not None
    what = f"the JSON schema {fmt.json_schema.name!r}"
    return Constraint(str(json_grammar(fmt.json_schema.schema_, what)), what)


_MADE: dict[str, Constraint | None] = {}  # by the fields that decide it, the oldest first
_KEEP = 256
_DECIDING = {"tools", "tool_choice", "parallel_tool_calls", "response_format"}


def chat_constraint(req: ChatCompletionRequest) -> Constraint | None:
    """A chat request's constraint: its forced tool call's (the reply is a call, never the text a
    `response_format` shapes), else its response format's. Agents send the same tools and schema
    request after request: the last `_KEEP` are kept by the fields that decide them."""
    key = req.model_dump_json(include=_DECIDING)
    if key in _MADE:
        return _MADE[key]
    forced = tool_call_constraint(req)
    made = forced if forced is not None else response_constraint(req)
    _MADE[key] = made
    if len(_MADE) > _KEEP:
        del _MADE[next(iter(_MADE))]
    return made
