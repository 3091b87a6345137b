"""POST /v1/responses over a tiny model: shapes valid against OpenAI's `Response` schema and
stream events, constrained structured output and function calls, and tool round trips, through
raw HTTP and the real `openai` client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_harness import start_server, wait_idle
from test_openai_harness import PERSON, TINY_NAME, assert_valid
from test_openai_harness import WEATHER as WEATHER_FUNCTION

import radixflow as rf

pytest_plugins = ["server_harness", "test_openai_harness"]  # fixtures: tiny_engine, tiny_server
WEATHER = {"type": "function", **WEATHER_FUNCTION, "strict": True}
FUNCTION = {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")}


EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
}


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(tiny_server):
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


def _respond(http, **body) -> dict:
    r = http.post("/v1/responses", json={"model": TINY_NAME, **body})
    assert r.status_code == 200, r.text
    assert_valid(r.json(), "Response")
    return r.json()


def _stream_events(http, **body) -> list[dict]:
    r = http.post("/v1/responses", json={"model": TINY_NAME, "stream": True, **body})
    assert r.status_code == 200, r.text
    events = []
    for block in r.text.strip().split("\n\n"):
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_plain_input_string_and_instructions(http, tiny_engine):
    body = _respond(
        http, input="Hello", instructions="Be brief.", max_output_tokens=4, temperature=0
    )
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert body["usage"]["output_tokens"] == 4 and body["instructions"] == "Be brief."
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": TINY_NAME,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello"},
            ],
            "max_tokens": 4,
            "temperature": 0,
        },
    ).json()
    assert item["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert body["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]


def test_json_schema_format_is_enforced(http):
    body = _respond(
        http,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "A person"}]}],
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
        max_output_tokens=60,
    )
    assert body["status"] == "completed"
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), PERSON)


def test_function_call_and_round_trip(http):
    first = _respond(
        http, input="Weather in Paris?", tools=[WEATHER], tool_choice="required", temperature=0
    )
    calls = first["output"]
    for call in calls:
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        *calls,  # sent back whole, as the agents SDK does
        *(
            {"type": "function_call_output", "call_id": c["call_id"], "output": "21 C"}
            for c in calls
        ),
    ]
    second = _respond(
        http,
        input=history,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=3,
        temperature=0,
    )
    assert second["output"][0]["type"] == "message"
    tool_calls = [
        {
            "id": c["call_id"],
            "type": "function",
            "function": {k: c[k] for k in ("name", "arguments")},
        }
        for c in calls
    ]
    chat = http.post(  # the same conversation through chat completions
        "/v1/chat/completions",
        json={
            "model": TINY_NAME,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": tool_calls},
                *({"role": "tool", "tool_call_id": c["call_id"], "content": "21 C"} for c in calls),
            ],
            "tools": [{"type": "function", "function": FUNCTION}],
            "tool_choice": "none",
            "max_tokens": 3,
            "temperature": 0,
        },
    ).json()
    assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert second["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]


def test_stream_event_sequence(http):
    events = _stream_events(http, input="Hello", max_output_tokens=5, temperature=0)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    whole = _respond(http, input="Hello", max_output_tokens=5, temperature=0)
    assert (
        deltas
        == whole["output"][0]["content"][0]["text"]
        == events[-1]["response"]["output"][0]["content"][0]["text"]
    )


def test_stream_function_call_events(http):
    events = _stream_events(http, input="Weather?", tools=[WEATHER], tool_choice="required")
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    jsonschema.validate(json.loads(done["arguments"]), WEATHER["parameters"])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input.0.message.content",
        ),
        ({"max_output_token": 5}, "max_output_token"),
    ],
)
def test_refused_fields_are_named(http, extra, param):
    r = http.post("/v1/responses", json={"model": TINY_NAME, "input": "Hi", **extra})
    assert r.status_code == 400, r.text
    assert_valid(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param


def test_openai_client_create_and_stream(client, tiny_engine):
    r = client.responses.create(
        model=TINY_NAME, input="Hello", max_output_tokens=4, temperature=0, store=False
    )
    assert r.output_text and r.usage.output_tokens == 4
    events = list(
        client.responses.create(model=TINY_NAME, input="Hello", max_output_tokens=4, stream=True)
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.incomplete"
    assert text == events[-1].response.output_text
    tool = client.responses.create(
        model=TINY_NAME, input="Weather?", tools=[WEATHER], tool_choice="required"
    )
    assert tool.output[0].type == "function_call"
    wait_idle(tiny_engine)


@pytest.fixture(scope="module")
def thinking_http(tiny_engine):
    """A server whose reasoning parser reads everything before `</think>` as reasoning (the
    tiny model never writes it, so its whole reply is reasoning)."""
    eng = rf.Engine(
        tiny_engine.config.model_path,
        dtype="float32",
        max_total_tokens=1024,
        reasoning_parser="deepseek-r1",
    )
    running = start_server(eng, served_model_name=TINY_NAME)
    with httpx.Client(base_url=running.url, timeout=60) as c:
        yield c
    running.stop()
    eng.shutdown()


def test_reasoning_becomes_a_reasoning_item(thinking_http):
    body = _respond(thinking_http, input="Hello", max_output_tokens=5, temperature=0)
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "message"]
    chat = thinking_http.post(
        "/v1/chat/completions",
        json={
            "model": TINY_NAME,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 5,
            "temperature": 0,
        },
    ).json()["choices"][0]["message"]
    assert body["output"][0]["content"][0]["text"] == chat["reasoning_content"]
    events = _stream_events(thinking_http, input="Hello", max_output_tokens=5, temperature=0)
    assert events[-1]["response"]["output"][0]["type"] == "reasoning"
    again = _respond(  # the reasoning item sent back is accepted
        thinking_http,
        input=[
            {"role": "user", "content": "Hello"},
            *body["output"],
            {"role": "user", "content": "More"},
        ],
        max_output_tokens=2,
    )
    assert again["output"]
