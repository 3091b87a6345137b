"""OpenAI wire parity over a tiny model: every request field of the spec is accepted (or refused
by name), and every response, stream chunk and error validates against OpenAI's OpenAPI schemas."""

from __future__ import annotations

import json

import httpx
import pytest
from openai.types.chat import ChatCompletionMessage
from server_harness import sse_events, start_server
from test_openai_harness import PERSON, TINY_ALIASES, TINY_NAME, WEATHER, assert_valid
from transformers.convert_slow_tokenizer import bytes_to_unicode

import radixflow as rf

pytest_plugins = ["server_harness", "test_openai_harness"]  # fixtures: tiny_engine, tiny_server
USER = {"role": "user", "content": "Hello"}


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        yield client


def _chat(http, **body):
    return http.post("/v1/chat/completions", json={"model": TINY_NAME, **body})


def _error(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert_valid(r.json(), "ErrorResponse")
    return r.json()["error"]


def _events(r) -> list[dict]:
    datas = list(sse_events(r.text.splitlines()))
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


# -- requests as real clients send them -----------------------------------------------------
def test_history_and_every_spec_field_are_accepted(http):
    sent_back = ChatCompletionMessage(role="assistant", content="Hi there").model_dump()
    r = _chat(
        http,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            USER,
            sent_back,
            {"role": "user", "content": [{"type": "text", "text": "Again"}], "name": "ann"},
        ],
        max_completion_tokens=3,
        seed=-1,
        reasoning_effort="low",
        service_tier="auto",
        modalities=["text"],
        prediction={"type": "content", "content": "Hi"},
        verbosity="low",
        web_search_options={},
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        safety_identifier="user-1",
        store=False,
        metadata={"a": "b"},
        user="u",
        logit_bias={"5": 1.5},
        stream_options=None,
        parallel_tool_calls=None,
        chat_template_kwargs={"enable_thinking": False},
        separate_reasoning=True,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert_valid(body, "CreateChatCompletionResponse")
    assert body["model"] == TINY_NAME and body["usage"]["completion_tokens"] <= 3
    assert body["choices"][0]["message"]["refusal"] is None


def test_negative_seed_is_folded_into_64_bits(http):
    def text(seed):
        r = _chat(http, messages=[USER], max_tokens=6, temperature=1.0, seed=seed)
        return r.json()["choices"][0]["message"]["content"]

    assert text(-1) == text(2**64 - 1)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"max_token": 3}, "max_token", "did you mean 'max_tokens'"),
        ({"frobnicate": 1}, "frobnicate", "unknown field"),
        (
            {"messages": [{"role": "user", "content": "x", "nmae": "a"}]},
            "messages.0.nmae",
            "did you mean 'name'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
            "'image_url' are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages.0.content",
            "'input_audio' are not supported",
        ),
        ({"modalities": ["text", "audio"]}, None, "audio output is not supported"),
        (
            {"functions": [WEATHER], "tools": [{"type": "function", "function": WEATHER}]},
            None,
            "not both",
        ),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort", "Input should be"),
    ],
)
def test_bad_requests_name_the_field(http, extra, param, words):
    err = _error(_chat(http, **{"messages": [USER], "max_tokens": 2, **extra}))
    assert err["param"] == param and words in err["message"]
    assert err["type"] == "invalid_request_error" and err["code"] is None


def test_completion_fields_of_the_spec(http):
    body = {
        "model": "tiny-alias",
        "prompt": "The fox",
        "max_tokens": 4,
        "best_of": 1,
        "echo": False,
        "frequency_penalty": 0.5,
        "logit_bias": {"7": -100},
        "logprobs": 2,
        "n": 1,
        "presence_penalty": 0.1,
        "seed": -5,
        "stop": None,
        "suffix": None,
        "temperature": 0,
        "top_p": 1,
        "user": "u",
    }
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert_valid(r.json(), "CreateCompletionResponse")
    assert r.json()["model"] == "tiny-alias"
    err = _error(http.post("/v1/completions", json={**body, "suffix": "end"}))
    assert err["param"] == "suffix"


# -- responses valid against the spec -------------------------------------------------------
def test_streams_validate_chunk_by_chunk(http):
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": TINY_NAME,
            "messages": [USER],
            "max_tokens": 5,
            "stream": True,
            "logprobs": True,
            "top_logprobs": 2,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = _events(chat)
    for chunk in chunks:
        assert_valid(chunk, "CreateChatCompletionStreamResponse")
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    completion = http.post(
        "/v1/completions",
        json={"model": TINY_NAME, "prompt": "a", "max_tokens": 4, "stream": True, "logprobs": 1},
    )
    chunks = _events(completion)
    # The spec has no completion-chunk schema: a chunk is a CreateCompletionResponse whose
    # finish_reason is null until the last one (as OpenAI sends them).
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert_valid(chunks[-1], "CreateCompletionResponse")
    for chunk in chunks[:-1]:
        assert_valid(
            {**chunk, "choices": [{**chunk["choices"][0], "finish_reason": "stop"}]},
            "CreateCompletionResponse",
        )


def test_models_and_aliases(http):
    listed = http.get("/v1/models").json()
    assert_valid(listed, "ListModelsResponse")
    assert [m["id"] for m in listed["data"]] == TINY_ALIASES
    for name in TINY_ALIASES:
        card = http.get(f"/v1/models/{name}")
        assert card.status_code == 200
        assert_valid(card.json(), "Model")
        assert card.json()["id"] == name
        r = _chat(http, messages=[USER], max_tokens=1) if name == TINY_NAME else None
        r = http.post(
            "/v1/chat/completions", json={"model": name, "messages": [USER], "max_tokens": 1}
        )
        assert r.status_code == 200 and r.json()["model"] == name
    err = _error(http.get("/v1/models/gpt-4o"), 404)
    assert err["code"] == "model_not_found"
    err = _error(
        http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [USER]}), 404
    )
    assert err["code"] == "model_not_found" and err["param"] == "model"
    err = _error(http.post("/v1/completions", json={"model": "nope", "prompt": "a"}), 404)
    assert err["code"] == "model_not_found"


def _token_bytes_reference(tokenizer, token_id: int) -> bytes:
    """A byte-level BPE token's bytes, from its vocabulary string (GPT-2's byte alphabet)."""
    decode = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(decode[c] for c in tokenizer.convert_ids_to_tokens(token_id))


def test_logprob_bytes_are_the_tokens_own(http, tiny_engine):
    tok = tiny_engine.tokenizer
    partial = next(  # a token that is the first byte of a two-byte UTF-8 character
        i for i in range(len(tok)) if _token_bytes_reference(tok, i) == b"\xc3"
    )
    whole = next(  # a multi-character ASCII token
        i
        for i in range(len(tok))
        if _token_bytes_reference(tok, i).isalpha() and len(_token_bytes_reference(tok, i)) >= 3
    )
    for forced in (partial, whole):
        r = _chat(
            http,
            messages=[USER],
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            logit_bias={str(forced): 100},
        )
        assert_valid(r.json(), "CreateChatCompletionResponse")
        entry = r.json()["choices"][0]["logprobs"]["content"][0]
        expected = _token_bytes_reference(tok, forced)
        assert bytes(entry["bytes"]) == expected
        shown = "bytes:\\xc3" if forced == partial else expected.decode()
        assert entry["token"] == shown
        for top in entry["top_logprobs"]:  # (ranked before logit_bias): each names its bytes
            data = bytes(top["bytes"])
            assert b"\xef\xbf\xbd" not in data
            assert top["token"] == data.decode(errors="replace") or top["token"].startswith(
                "bytes:"
            )


def test_completion_text_offsets_continue_across_stream_chunks(http):
    body = {"model": TINY_NAME, "prompt": "Hello", "max_tokens": 12, "temperature": 0}
    body |= {"logprobs": 1, "ignore_eos": True}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    text, lp = whole["text"], whole["logprobs"]
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"] == sorted(lp["text_offset"])
    for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
        if not token.startswith("bytes:"):  # a whole-character token stands where it starts
            assert text[offset:].startswith(token)
    streamed = []
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
        for data in sse_events(r.iter_lines()):
            if data == "[DONE]":
                break
            for choice in json.loads(data)["choices"]:
                streamed += (choice.get("logprobs") or {}).get("text_offset", [])
    assert streamed == lp["text_offset"]


def test_tool_call_cut_by_max_tokens_is_length_without_json(http):
    body = {
        "messages": [USER],
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
        "max_tokens": 4,
    }
    r = _chat(http, **body)
    assert_valid(r.json(), "CreateChatCompletionResponse")
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None and not choice["message"].get("tool_calls")
    chunks = _events(_chat(http, **body, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert not any(d.get("tool_calls") for d in deltas)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"


def test_legacy_functions_answer_with_function_call(http):
    r = _chat(http, messages=[USER], functions=[WEATHER], function_call={"name": "get_weather"})
    body = r.json()
    assert_valid(body, "CreateChatCompletionResponse")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"]["name"] == "get_weather"
    assert isinstance(json.loads(choice["message"]["function_call"]["arguments"])["city"], str)


@pytest.fixture(scope="module")
def strict_grammar_http(tiny_engine):
    """A server whose grammars may build 3 automaton states: constrained requests abort."""
    eng = rf.Engine(
        tiny_engine.config.model_path, dtype="float32", max_total_tokens=1024, grammar_max_states=3
    )
    running = start_server(eng, served_model_name=TINY_NAME)
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()
    eng.shutdown()


def test_engine_abort_is_an_error_not_a_finish_reason(strict_grammar_http):
    http = strict_grammar_http
    body = {"messages": [USER], "max_tokens": 20, "regex": "[a-z]{30}"}
    err = _error(_chat(http, **body))
    assert err["code"] == "request_failed" and "grammar_max_states" in err["message"]
    completion = {"model": TINY_NAME, "prompt": "a", "max_tokens": 20, "regex": "[a-z]{30}"}
    assert _error(http.post("/v1/completions", json=completion))["code"] == "request_failed"
    for route, payload in (
        ("/v1/chat/completions", {"model": TINY_NAME, **body}),
        ("/v1/completions", completion),
    ):
        events = _events(http.post(route, json={**payload, "stream": True}))
        assert_valid(events[-1], "ErrorResponse")
        assert events[-1]["error"]["code"] == "request_failed"
        finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c.get("choices")]
        assert all(f is None for f in finishes)


def test_continue_final_message_matches_transformers(http, tiny_engine):
    messages = [USER, {"role": "assistant", "content": "The answer is"}]
    r = _chat(http, messages=messages, continue_final_message=True, max_tokens=1)
    assert_valid(r.json(), "CreateChatCompletionResponse")
    ref = tiny_engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    ids = tiny_engine.tokenizer.encode(ref, add_special_tokens=False)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    err = _error(_chat(http, messages=[USER], continue_final_message=True))
    assert "assistant message last" in err["message"]


def test_top_p_zero_keeps_only_the_most_likely_token(http):
    def text(**kw):
        r = _chat(http, messages=[USER], max_tokens=6, **kw)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert text(temperature=1.5, top_p=0, seed=3) == text(temperature=0)


def test_engine_abort_in_responses_stream(strict_grammar_http):
    fmt = {"format": {"type": "json_schema", "name": "p", "schema": PERSON}}
    body = {"model": TINY_NAME, "input": "Hi", "text": fmt, "max_output_tokens": 20}
    err = _error(strict_grammar_http.post("/v1/responses", json=body))
    assert err["code"] == "request_failed"
    r = strict_grammar_http.post("/v1/responses", json={**body, "stream": True})
    events = [json.loads(b.split("data: ", 1)[1]) for b in r.text.strip().split("\n\n")]
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert_valid(events[-2], "ResponseErrorEvent")
    assert_valid(events[-1], "ResponseFailedEvent")


def _spec_fields(schema_name: str) -> set[str]:
    from test_openai_harness import _openapi

    schemas = _openapi()[0]["components"]["schemas"]

    def walk(schema: dict) -> set[str]:
        if "$ref" in schema:
            return walk(schemas[schema["$ref"].split("/")[-1]])
        found = set(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            found |= walk(part)
        return found

    return walk(schemas[schema_name])


@pytest.mark.parametrize(
    ("route", "schema", "required"),
    [
        ("/v1/chat/completions", "CreateChatCompletionRequest", {"messages": [USER]}),
        ("/v1/completions", "CreateCompletionRequest", {"prompt": "a"}),
        ("/v1/responses", "CreateResponse", {"input": "a"}),
    ],
)
def test_every_spec_field_may_be_null(http, route, schema, required):
    """Clients send unset fields as null: every field of the spec is known and takes null."""
    fields = _spec_fields(schema) - {"model", *required}
    body = {name: None for name in fields}
    limit = {"max_output_tokens": 3} if "responses" in route else {"max_tokens": 3}
    r = http.post(route, json={**body, "model": TINY_NAME, **required, **limit})
    assert r.status_code == 200, r.text


def test_served_model_name_flag_takes_aliases():
    from radixflow.runtime.cli import build_parser

    args = build_parser().parse_args(["serve", "--served-model-name", "smol", "org/smol-v2"])
    assert args.served_model_name == ["smol", "org/smol-v2"]


def test_guard_errors_have_openai_shape_on_v1(tiny_engine):
    from radixflow.runtime.server.limits import ServerLimits

    running = start_server(
        tiny_engine,
        served_model_name=TINY_NAME,
        api_key="sesame",
        limits=ServerLimits(max_body_bytes=2000),
    )
    try:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            err = _error(client.get("/v1/models"), 401)
            assert err["code"] == "invalid_api_key"
            native = client.get("/get_model_info")  # the native routes keep SGLang's shape
            assert native.status_code == 401 and native.json()["error"]["code"] == 401
            big = {"model": TINY_NAME, "prompt": "x" * 3000}
            headers = {"authorization": "Bearer sesame"}
            err = _error(client.post("/v1/completions", json=big, headers=headers), 413)
            assert err["code"] is None
    finally:
        running.stop()


def test_allowed_tools_choice_limits_the_calls(http):
    time_tool = {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 5}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    }
    tools = [{"type": "function", "function": f} for f in (WEATHER, time_tool)]
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "get_time"}}],
        },
    }
    one = {"parallel_tool_calls": False, "max_tokens": 120}
    r = _chat(http, messages=[USER], tools=tools, tool_choice=choice, **one)
    assert_valid(r.json(), "CreateChatCompletionResponse")
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert calls and {c["function"]["name"] for c in calls} == {"get_time"}
    choice["allowed_tools"]["tools"][0]["function"]["name"] = "nope"
    err = _error(_chat(http, messages=[USER], tools=tools, tool_choice=choice))
    assert "'nope'" in err["message"]
    responses_choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    flat = [{"type": "function", **f} for f in (WEATHER, time_tool)]
    r = http.post(
        "/v1/responses",
        json={
            "model": TINY_NAME,
            "input": "Hi",
            "tools": flat,
            "tool_choice": responses_choice,
            "parallel_tool_calls": False,
        },
    )
    assert_valid(r.json(), "Response")
    assert {item["name"] for item in r.json()["output"]} == {"get_time"}
