"""What agent frameworks do against the endpoint, as their users write it: LangChain's `ChatOpenAI`
and the OpenAI Agents SDK (chat completions and the Responses API), each a function of the endpoint's
base URL and model name that asserts what the framework hands its user. The in-process endpoint
(`tests/component/test_endpoint_clients.py`) and the fleet's (`tests/ray/test_endpoint_fleet_clients.py`)
run the same ones, on a random-weight model with SmolLM2's tokenizer and tools template: a model
that never calls a tool by itself, so every call here is one the grammar forced."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, Field

from tests.helpers import WEATHER_SCHEMA

ASK = "What is the weather in Paris this week?"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_SCHEMA},
}


class Forecast(BaseModel):
    """A structured answer whose every field is bounded (a random model finishes it)."""

    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)
    rain: bool


# -- LangChain ------------------------------------------------------------------------------------


def _chat(base_url: str, model: str, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0, timeout=120, **kw)


def langchain_stream_with_usage(base_url: str, model: str) -> None:
    llm = _chat(base_url, model, max_tokens=12, stream_usage=True)
    whole = llm.invoke(ASK)
    assert isinstance(whole.content, str) and whole.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream(ASK))
    joined = chunks[0]
    for c in chunks[1:]:
        joined = joined + c
    assert joined.usage_metadata is not None and joined.usage_metadata["input_tokens"] > 10
    assert 0 < joined.usage_metadata["output_tokens"] <= 12  # the usage chunk, counted


def langchain_tools_required(base_url: str, model: str) -> None:
    llm = _chat(base_url, model, max_tokens=200).bind_tools(
        [WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False
    )  # a real model may call on and on where parallel calls are allowed, until max_tokens cuts it
    msg = llm.invoke(ASK)
    [call] = msg.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER_SCHEMA)


def langchain_structured_output(base_url: str, model: str) -> None:
    llm = _chat(base_url, model, max_tokens=200).with_structured_output(
        Forecast, method="json_schema", strict=True
    )
    answer = llm.invoke(ASK)
    assert isinstance(answer, Forecast)


# -- the OpenAI Agents SDK ------------------------------------------------------------------------


def _agents_model(base_url: str, model: str, api: Literal["chat", "responses"]) -> Any:
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    if api == "chat":
        return OpenAIChatCompletionsModel(model=model, openai_client=client)
    return OpenAIResponsesModel(model=model, openai_client=client)


def _weather_agent(
    base_url: str, model: str, api: Literal["chat", "responses"], calls: list[dict[str, Any]]
) -> Any:
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def get_weather(
        city: Annotated[str, Field(pattern=WEATHER_SCHEMA["properties"]["city"]["pattern"])],
        unit: Literal["celsius", "fahrenheit"],
        days: Annotated[int, Field(ge=1, le=7)],
    ) -> str:
        """The weather in a city.

        Args:
            city: the city.
            unit: the temperature's unit.
            days: how many days ahead.
        """
        calls.append({"city": city, "unit": unit, "days": days})
        return "18 C and sunny"

    settings = ModelSettings(tool_choice="required", max_tokens=200, parallel_tool_calls=False)
    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=_agents_model(base_url, model, api),
        tools=[get_weather],
        model_settings=settings,
        # the tool's result is the answer: a random model's free text after it would run to the
        # budget, which the SDK takes as a failed response on the Responses API
        tool_use_behavior="stop_on_first_tool",
    )


def agents_tool_run(base_url: str, model: str, api: Literal["chat", "responses"] = "chat") -> None:
    """A run whose forced call the SDK parses and runs, its arguments validated by the tool's schema."""
    from agents import Runner

    calls: list[dict[str, Any]] = []
    agent = _weather_agent(base_url, model, api, calls)
    result = asyncio.run(Runner.run(agent, ASK, max_turns=2))
    assert result.final_output == "18 C and sunny"
    [args] = calls
    jsonschema.validate(args, WEATHER_SCHEMA)


def agents_streamed_run(base_url: str, model: str, api: Literal["chat", "responses"] = "chat") -> None:
    from agents import Runner

    calls: list[dict[str, Any]] = []
    agent = _weather_agent(base_url, model, api, calls)

    async def run() -> list[str]:
        streamed = Runner.run_streamed(agent, ASK, max_turns=2)
        kinds = [event.type async for event in streamed.stream_events()]
        assert streamed.final_output is not None
        return kinds

    kinds = asyncio.run(run())
    assert calls and "raw_response_event" in kinds and "run_item_stream_event" in kinds


def agents_structured_output(base_url: str, model: str, api: Literal["chat", "responses"] = "chat") -> None:
    from agents import Agent, ModelSettings, Runner

    agent = Agent(
        name="forecast",
        instructions="Answer as a forecast.",
        model=_agents_model(base_url, model, api),
        output_type=Forecast,
        model_settings=ModelSettings(max_tokens=200),
    )
    result = asyncio.run(Runner.run(agent, ASK, max_turns=1))
    assert isinstance(result.final_output, Forecast)


SCENARIOS: dict[str, Callable[[str, str], None]] = {
    "langchain-stream-usage": langchain_stream_with_usage,
    "langchain-tools-required": langchain_tools_required,
    "langchain-structured-output": langchain_structured_output,
    "agents-chat-tool-run": agents_tool_run,
    "agents-chat-streamed-run": agents_streamed_run,
    "agents-chat-structured-output": agents_structured_output,
    "agents-responses-tool-run": lambda url, model: agents_tool_run(url, model, "responses"),
    "agents-responses-streamed-run": lambda url, model: agents_streamed_run(url, model, "responses"),
    "agents-responses-structured-output": lambda url, model: agents_structured_output(
        url, model, "responses"
    ),
}
