"""The real client libraries against `radixflow serve` routes over a tiny model: openai (sync,
async, stream, parse, tools), langchain-openai, litellm, instructor and openai-agents.

The tiny model writes noise: tests check that each library talks to the server end to end and
that structured answers (constrained by a JSON Schema) parse into the caller's types.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from test_openai_harness import TINY_NAME, WEATHER

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

pytest_plugins = ["server_harness", "test_openai_harness"]  # fixtures: tiny_engine, tiny_server
USER = [{"role": "user", "content": "Describe a person."}]


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no extra keys for the noisy model to write

    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


WEATHER_TOOL = {"type": "function", "function": WEATHER}


@pytest.fixture(scope="module")
def base_url(tiny_server) -> str:
    return f"{tiny_server.url}/v1"


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key="x", max_retries=0) as c:
        yield c


# -- openai ---------------------------------------------------------------------------------
def test_openai_sync_stream_and_history(client):
    first = client.chat.completions.create(model=TINY_NAME, messages=USER, max_tokens=4)
    history = [*USER, first.choices[0].message.model_dump(), {"role": "user", "content": "More"}]
    second = client.chat.completions.create(
        model=TINY_NAME, messages=history, max_tokens=4, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=TINY_NAME, messages=history, max_tokens=4, temperature=0, stream=True
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == second.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == second.choices[0].finish_reason == "length"


def test_openai_async(base_url):
    async def run():
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as c:
            return await asyncio.gather(
                *(
                    c.completions.create(model=TINY_NAME, prompt=p, max_tokens=3, temperature=0)
                    for p in ("a", "b")
                )
            )

    results = asyncio.run(run())
    assert [r.usage.completion_tokens for r in results] == [3, 3]


def test_openai_parse_with_a_pydantic_model(client):
    parses = [client.chat.completions.parse]
    beta_chat = getattr(getattr(client, "beta", None), "chat", None)
    if beta_chat is not None:
        parses.append(beta_chat.completions.parse)
    for parse in parses:
        r = parse(model=TINY_NAME, messages=USER, response_format=Person, max_tokens=60)
        assert isinstance(r.choices[0].message.parsed, Person)


def test_openai_tools(client):
    r = client.chat.completions.create(
        model=TINY_NAME, messages=USER, tools=[WEATHER_TOOL], tool_choice="required"
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]


# -- other libraries ------------------------------------------------------------------------
def test_langchain_openai(base_url):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=TINY_NAME, base_url=base_url, api_key="x", max_tokens=4, temperature=0)
    whole = llm.invoke("Hello")
    assert isinstance(whole.content, str)
    streamed = "".join(chunk.content for chunk in llm.stream("Hello"))
    assert streamed == whole.content
    structured = ChatOpenAI(model=TINY_NAME, base_url=base_url, api_key="x", max_tokens=60)
    assert isinstance(structured.with_structured_output(Person).invoke("A person"), Person)


def test_litellm(base_url):
    import litellm

    r = litellm.completion(
        model=f"openai/{TINY_NAME}", api_base=base_url, api_key="x", messages=USER, max_tokens=3
    )
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_instructor(client):
    import instructor

    person = instructor.from_openai(client).chat.completions.create(
        model=TINY_NAME, messages=USER, response_model=Person, max_tokens=120, max_retries=0
    )
    assert isinstance(person, Person)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents(base_url, api):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=10)]) -> str:
        """Weather in a city."""
        calls.append(city)
        return "21 C"

    async def run():
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as c:
            kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
            model = kind(model=TINY_NAME, openai_client=c)
            typed = Agent(
                name="typed",
                instructions="Describe a person.",
                model=model,
                output_type=Person,
                model_settings=ModelSettings(max_tokens=120),
            )
            person = (await Runner.run(typed, "Anyone", max_turns=1)).final_output
            tools = Agent(
                name="tools",
                instructions="Use the tool.",
                model=model,
                tools=[get_weather],
                tool_use_behavior="stop_on_first_tool",
                model_settings=ModelSettings(tool_choice="required", max_tokens=120),
            )
            weather = (await Runner.run(tools, "Weather in Paris?", max_turns=2)).final_output
            return person, weather

    person, weather = asyncio.run(run())
    assert isinstance(person, Person)
    assert weather == "21 C" and calls
