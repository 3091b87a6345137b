"""OpenAI-compatible routes driven by the real `openai` client (sync, async, streaming)."""

from __future__ import annotations

import asyncio
import json
import os
import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow
pytest_plugins = ["server_harness"]  # fixtures: engine, server, http

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _chat_ids(engine, messages) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_models(client, engine):
    models = client.models.list().data
    assert len(models) == 1 and models[0].max_model_len == engine.context_length


def test_completion_matches_engine(client, engine):
    ref = engine.generate("1, 2, 3,", {"max_new_tokens": 8, "temperature": 0})
    r = client.completions.create(model="m", prompt="1, 2, 3,", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == ref["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_completion_batch_tokens_n_stop_seed(client, engine):
    ids = engine.tokenizer.encode("1, 2, 3,")
    hello = engine.tokenizer.encode("Hello")
    r = client.completions.create(model="m", prompt=[ids, hello], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text
    texts = client.completions.create(
        model="m", prompt=["1, 2, 3,", "Hello"], max_tokens=3, temperature=0
    )
    assert [c.text for c in texts.choices] == [r.choices[0].text, r.choices[2].text]
    assert texts.usage.prompt_tokens == len(ids) + len(hello)
    stop = client.completions.create(
        model="m", prompt="1, 2, 3,", max_tokens=20, temperature=0, stop=["5"]
    )
    assert stop.choices[0].finish_reason == "stop" and "5" not in stop.choices[0].text
    sampled = [
        client.completions.create(
            model="m", prompt="Once upon", max_tokens=8, temperature=1.0, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_completion_logprobs_and_echo(client, engine):
    ref = engine.generate(
        "1, 2, 3,", {"max_new_tokens": 4, "temperature": 0}, return_logprob=True, top_logprobs_num=2
    )["meta_info"]
    r = client.completions.create(
        model="m", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(
        [x[0] for x in ref["output_token_logprobs"]], abs=1e-4
    )
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs)
    prompt = "1, 2, 3,"  # cached by now: prompt logprobs must still cover every position
    echo = client.completions.create(
        model="m", prompt=prompt, max_tokens=0, echo=True, logprobs=0
    ).choices[0]
    assert echo.text == prompt and echo.logprobs.token_logprobs[0] is None
    assert "".join(echo.logprobs.tokens) == prompt
    assert len(echo.logprobs.token_logprobs) == len(engine.tokenizer.encode(prompt))


def test_chat_matches_engine_and_reports_cache(client, engine):
    ref = engine.generate(
        input_ids=_chat_ids(engine, MESSAGES),
        sampling_params={"max_new_tokens": 10, "temperature": 0},
    )
    first = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=10, temperature=0
    )
    assert first.object == "chat.completion"
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].message.content == ref["text"]
    assert first.choices[0].finish_reason == ref["meta_info"]["finish_reason"]["type"]
    again = client.chat.completions.create(
        model="m", messages=MESSAGES, max_completion_tokens=3, temperature=0
    )
    assert again.choices[0].finish_reason == "length" and again.usage.completion_tokens == 3
    assert ref["text"].startswith(again.choices[0].message.content)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.usage.prompt_tokens == len(_chat_ids(engine, MESSAGES))


def test_chat_logprobs(client, engine):
    ref = engine.generate(
        input_ids=_chat_ids(engine, MESSAGES),
        sampling_params={"max_new_tokens": 4, "temperature": 0},
        return_logprob=True,
        top_logprobs_num=3,
    )["meta_info"]
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(
        [x[0] for x in ref["output_token_logprobs"]], abs=1e-4
    )
    assert all(len(c.top_logprobs) == 3 for c in content)
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert bytes(content[0].bytes).decode() == content[0].token


def test_chat_stream_equals_non_stream(client):
    whole = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=12, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_with_n(client):
    chunks = list(
        client.completions.create(
            model="m", prompt="Hello", max_tokens=5, n=2, temperature=0, stream=True
        )
    )
    texts = {0: "", 1: ""}
    for c in chunks:
        texts[c.choices[0].index] += c.choices[0].text
    whole = client.completions.create(model="m", prompt="Hello", max_tokens=5, temperature=0)
    assert texts == {0: whole.choices[0].text, 1: whole.choices[0].text}


async def test_async_client_concurrent(server):
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        prompts = ["Water boils at", "The sky is", "1, 2, 3,"]
        results = await asyncio.gather(
            *(
                c.completions.create(model="m", prompt=p, max_tokens=5, temperature=0)
                for p in prompts
            )
        )
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=5, temperature=0, stream=True
        )
        streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream])
        whole = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=5, temperature=0
        )
    sync = [
        httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "m", "prompt": p, "max_tokens": 5, "temperature": 0},
            timeout=60,
        ).json()
        for p in prompts
    ]
    assert [r.choices[0].text for r in results] == [s["choices"][0]["text"] for s in sync]
    assert streamed == whole.choices[0].message.content


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
        ({"extra_body": {"top_k": 0}}, "top_k"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, "messages"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ],
)
def test_chat_bad_input_in_openai_format(client, kwargs, param):
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    assert err.value.status_code == 400
    error = err.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_completion_bad_prompt(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="", max_tokens=2)
    assert err.value.body["param"] == "prompt"


def test_api_key_with_openai_client(server_factory):
    secured = server_factory(api_key="sesame")
    bad = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=f"{secured.url}/v1", api_key="sesame", max_retries=0)
    r = good.completions.create(model="m", prompt="Hi", max_tokens=1)
    assert r.usage.completion_tokens == 1


# -- constrained output: response_format, regex, tools ----------------------------------------
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 12}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_response_format_json_schema(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=60,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_response_format_json_object(client):
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=40,
        response_format={"type": "json_object"},
        temperature=0,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_extra_field(client):
    r = client.completions.create(
        model="m", prompt="The year is", max_tokens=8, extra_body={"regex": r" (19|20)[0-9]{2}\."}
    )
    assert re.fullmatch(r" (19|20)[0-9]{2}\.", r.choices[0].text)


def _check_calls(calls, allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    ("choice", "allowed"),
    [
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
        ("required", {"get_weather", "get_time"}),
    ],
)
def test_tool_calls_match_their_schemas(client, choice, allowed):
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        max_tokens=60,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message.tool_calls, allowed)


def test_tool_auto_answers_or_calls(client):
    r = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0
    )
    message = r.choices[0].message
    if message.tool_calls:
        _check_calls(message.tool_calls, {"get_weather"})
        assert r.choices[0].finish_reason == "tool_calls"
    else:  # a plain answer, unwrapped from {"content": ...} even when cut by max_tokens
        assert message.content and not message.content.startswith("{")
        assert r.choices[0].finish_reason in ("stop", "length")


def test_tool_calls_stream(client):
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert calls and all(json.loads(tc.function.arguments) for tc in calls)
    jsonschema.validate(json.loads(calls[0].function.arguments), TOOL_SCHEMAS["get_weather"])


def test_tool_history_is_rendered(client):
    """A conversation that already holds a tool call and its result is accepted."""
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city":"Paris","unit":"celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    r = client.chat.completions.create(
        model="m", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=3
    )
    assert r.choices[0].message.tool_calls is None and r.usage.completion_tokens <= 3


# -- the Responses API and client libraries on real text --------------------------------------
def test_responses_api_equals_chat(client):
    chat = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=12, temperature=0
    )
    r = client.responses.create(model="m", input=MESSAGES, max_output_tokens=12, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.input_tokens_details.cached_tokens > 0
    events = list(
        client.responses.create(
            model="m", input=MESSAGES, max_output_tokens=12, temperature=0, stream=True
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text and events[-1].response.output_text == r.output_text


def test_langchain_and_litellm_equal_openai(client, server):
    from langchain_openai import ChatOpenAI

    ref = (
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, temperature=0)
        .choices[0]
        .message.content
    )
    llm = ChatOpenAI(
        model="m", base_url=f"{server.url}/v1", api_key="x", max_tokens=8, temperature=0
    )
    assert llm.invoke(MESSAGES[0]["content"]).content == ref
    assert "".join(c.content for c in llm.stream(MESSAGES[0]["content"])) == ref
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    out = litellm.completion(
        model="openai/m",
        api_base=f"{server.url}/v1",
        api_key="x",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
    )
    assert out.choices[0].message.content == ref
