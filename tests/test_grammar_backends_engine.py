"""Constrained generation through the engine with each grammar backend (tiny random model).

Outputs are checked against references (`re.fullmatch`, `jsonschema`, lark's parser); jump
forward is on; n-gram speculation with a grammar gives the plain greedy output; a tool call goes
through the server; a schema radixflow refuses is served by the fallback backend.
"""

from __future__ import annotations

import json
import logging
import re

import httpx
import jsonschema
import pytest
from kv_checks import assert_kv_released
from server_harness import start_server
from test_grammar_backends import (
    CHOICES,
    GBNF,
    GBNF_REGEX,
    LARK,
    LARK_PARSER,
    REFUSED_BY_OURS,
    backend_params,
    valid_name_record,
)
from tiny_models import make_tiny_model_dir

import radixflow as rf

REGEX = r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
# Strings by pattern: xgrammar lets raw control characters into free JSON strings (see
# test_grammar_backends), which a random model writes; the rest of the schema stays free.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,6}$"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "customer_is_premium_member": {"type": "boolean"},
    },
    "required": ["customer_full_name", "customer_is_premium_member"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("backends"), "llama", seed=1)


def _engine(model_dir, backend: str, **options) -> rf.Engine:
    options = {"dtype": "float32", "max_total_tokens": 4096, "chat_template": "chatml", **options}
    return rf.Engine(str(model_dir), grammar_backend=backend, **options)


@pytest.fixture(scope="module", params=backend_params())
def engine(request, model_dir):
    eng = _engine(model_dir, request.param)
    yield eng
    eng.shutdown()


def _finished(outs: list[dict]) -> list[str]:
    texts = [o["text"] for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert texts, "no output finished"
    return texts


def test_constrained_outputs_are_valid(engine):
    prompts = ["The quick brown fox", "Paris is the capital", "def add(a, b):"]
    base = {"max_new_tokens": 48, "temperature": 1.0, "seed": 4}
    for text in _finished(engine.generate(prompts, {**base, "regex": REGEX})):
        assert re.fullmatch(REGEX, text), text
    for text in _finished(engine.generate(prompts, {**base, "json_schema": json.dumps(SCHEMA)})):
        jsonschema.validate(json.loads(text), SCHEMA)
    for text in _finished(engine.generate(prompts, {**base, "ebnf": GBNF})):
        assert re.fullmatch(GBNF_REGEX, text), text
    choice = "root ::= " + " | ".join(json.dumps(c) for c in CHOICES)
    for text in _finished(engine.generate(prompts, {**base, "ebnf": choice})):
        assert text in CHOICES
    if engine.config.grammar_backend != "xgrammar":  # xgrammar reads Lark, not our dialect
        for text in _finished(engine.generate(prompts, {**base, "lark": LARK})):
            LARK_PARSER.parse(text)
    assert_kv_released(engine)


def test_jump_forward_appends_forced_text(engine):
    outs = engine.generate(
        ["A record:"] * 2, {"max_new_tokens": 60, "temperature": 0, "json_schema": LONG_KEYS}
    )
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(o["text"]), LONG_KEYS)
    assert engine.stats["jump_forward_tokens"] > 0, "no forced text was jumped over"


@pytest.mark.parametrize("backend", backend_params())
def test_ngram_speculation_with_a_grammar_keeps_the_greedy_output(model_dir, backend):
    prompt = 'The quick brown fox {"name":"fox","n":12} The quick brown fox {"name":"fox","n":1'
    params = {"max_new_tokens": 40, "temperature": 0, "json_schema": SCHEMA}
    outs = {}
    for algorithm in ("none", "ngram"):
        eng = _engine(model_dir, backend, speculative_algorithm=algorithm, jump_forward=False)
        try:
            outs[algorithm] = eng.generate([prompt] * 2, params)
            if algorithm == "ngram":
                assert eng.stats["spec_draft_tokens"] > 0
            assert_kv_released(eng)
        finally:
            eng.shutdown()
    assert [o["output_ids"] for o in outs["ngram"]] == [o["output_ids"] for o in outs["none"]]
    for text in _finished(outs["ngram"]):
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("backend", backend_params())
def test_a_tool_call_through_the_server(model_dir, backend):
    eng = _engine(model_dir, backend)
    server = start_server(eng)
    try:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 120,
            "temperature": 0,
        }
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(
            json.loads(call["function"]["arguments"]), TOOL["function"]["parameters"]
        )
    finally:
        server.stop()
        eng.shutdown()


@pytest.mark.parametrize("fallback", backend_params(["llguidance"]))
def test_the_fallback_serves_a_schema_ours_refuses(model_dir, fallback, caplog):
    eng = _engine(model_dir, "radixflow", grammar_backend_fallback=fallback)
    try:
        with caplog.at_level(logging.WARNING, logger="radixflow.grammars.backends"):
            params = {"max_new_tokens": 60, "temperature": 0, "json_schema": REFUSED_BY_OURS}
            outs = eng.generate(["A list:"] * 2, params)
        for text in _finished(outs):
            assert valid_name_record(text), text
        logged = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
        assert len(logged) == 1 and fallback in logged[0], logged
        with pytest.raises(ValueError, match="json_schema"):
            eng.generate("x", {"json_schema": "{not json"})
    finally:
        eng.shutdown()
