"""`strict: true` through the server, on a tiny model: chat `response_format`, function tools
and /v1/responses `text.format` compile their schemas closed (keys the schema does not declare
cannot be generated); without `strict` the schema is compiled as given.

Each test reads the grammar the engine was given for the request and walks it with a valid
instance and with the same instance plus an undeclared key.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from test_openai_harness import TINY_NAME

from radixflow.runtime.server.openai_convert import strict_schema

pytest_plugins = ["server_harness", "test_openai_harness"]  # fixtures: tiny_engine, tiny_server
OPEN = {  # no additionalProperties: other keys are allowed unless strict
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
}


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        yield client


@pytest.fixture
def grammars(tiny_engine, monkeypatch) -> list[tuple[str, Any]]:
    """The grammars, as (kind, source), of the requests the engine gets during the test."""
    seen: list[tuple[str, Any]] = []
    submit = tiny_engine.grammars.submit

    def spy(params):
        seen.append(params.grammar)
        return submit(params)

    monkeypatch.setattr(tiny_engine.grammars, "submit", spy)
    return seen


def accepts(engine, spec: tuple[str, Any], value: Any) -> bool:
    """Whether the compiled grammar takes `value` written compactly, then EOS."""
    m = engine.grammars.compiler.compile(*spec).matcher()
    text = json.dumps(value, separators=(",", ":"))
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    return all(m.accept(t) for t in ids) and m.accept(engine.tokenizer.eos_token_id)


def _chat(http, **body) -> dict:
    messages = [{"role": "user", "content": "A city"}]
    r = http.post("/v1/chat/completions", json={"model": TINY_NAME, "messages": messages, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("strict", [True, False])
def test_chat_response_format(http, tiny_engine, grammars, strict):
    spec = {"name": "place", "schema": OPEN, "strict": strict}
    reply = _chat(http, response_format={"type": "json_schema", "json_schema": spec}, max_tokens=40)
    [grammar] = grammars
    assert accepts(tiny_engine, grammar, {"city": "Paris"})
    assert accepts(tiny_engine, grammar, {"city": "Paris", "zz": 1}) is not strict
    choice = reply["choices"][0]
    if strict and choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), strict_schema(OPEN))


def test_chat_tools(http, tiny_engine, grammars):
    strict = {"type": "function", "function": {"name": "find", "parameters": OPEN, "strict": True}}
    loose = {"type": "function", "function": {"name": "look", "parameters": OPEN}}
    _chat(http, tools=[strict, loose], tool_choice="required", max_tokens=40)
    [grammar] = grammars

    def call(name: str, arguments: dict) -> list[dict]:
        return [{"name": name, "arguments": arguments}]

    assert accepts(tiny_engine, grammar, call("find", {"city": "Rome"}))
    assert not accepts(tiny_engine, grammar, call("find", {"city": "Rome", "zz": 1}))
    assert accepts(tiny_engine, grammar, call("look", {"city": "Rome", "zz": 1}))


def test_responses_text_format(http, tiny_engine, grammars):
    fmt = {"type": "json_schema", "name": "place", "schema": OPEN, "strict": True}
    body = {"model": TINY_NAME, "input": "A city", "text": {"format": fmt}}
    r = http.post("/v1/responses", json={**body, "max_output_tokens": 40})
    assert r.status_code == 200, r.text
    [grammar] = grammars
    assert accepts(tiny_engine, grammar, {"city": "Oslo"})
    assert not accepts(tiny_engine, grammar, {"city": "Oslo", "zz": 1})
