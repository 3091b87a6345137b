"""Fuzzing the HTTP server with random bodies, over a tiny random model (fast generation).

Random JSON bodies (plausible and random keys, wrong types, lone surrogates, huge numbers,
NaN/Infinity sent as raw text, nested lists, random sampling params and grammars) and random
raw bytes (malformed, truncated, deeply nested JSON, odd content types) go to /generate,
/v1/completions, /v1/chat/completions, /abort_request and /flush_cache. Properties:
- no answer is a 5xx, and each comes within BOUND seconds;
- every body is strict JSON (no NaN/Infinity), an SSE stream's events too, and a 4xx body holds
  an error object with a message (/flush_cache's 200 is SGLang's plain text);
- afterwards a normal request still succeeds and, after /flush_cache, every KV page is free.

Runs are derandomized (`derandomize=True`, no example database): CI sees the same examples
every run; a failure prints the minimal body.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from server_harness import kv_all_free, sse_events, start_server
from tiny_models import make_tiny_model_dir
from transformers import AutoTokenizer

import radixflow as rf

pytestmark = pytest.mark.slow

BOUND = 30.0  # seconds for any one answer (tiny model: a full-context generation takes ~1 s)
ROUTES = ["/generate", "/v1/completions", "/v1/chat/completions", "/abort_request", "/flush_cache"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("fuzz-llama"), "llama", seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # so the chat route gets past templating
    tok.save_pretrained(path)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=2048, chunked_prefill_size=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=BOUND) as client:
        yield client


# -- checking one answer ----------------------------------------------------------------------
def strict_json(text: str, what: str) -> Any:
    def refuse(name: str):
        raise AssertionError(f"{what}: non-standard JSON constant {name}")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{what}: not JSON ({exc}): {text[:300]!r}") from None


def send(http: httpx.Client, method: str, route: str, content: bytes, ctype: str | None):
    headers = {} if ctype is None else {"content-type": ctype}
    start = time.monotonic()
    try:
        r = http.request(method, route, content=content, headers=headers)
    except httpx.TimeoutException:
        pytest.fail(f"{method} {route}: no answer within {BOUND:.0f}s; body {content[:300]!r}")
    return r, time.monotonic() - start


def check_answer(method: str, route: str, content: bytes, r: httpx.Response, took: float):
    if currently_in_test_context():  # for --hypothesis-show-statistics
        event(f"{method} {route} -> {r.status_code}")
    what = f"{method} {route} with body {content[:300]!r} -> {r.status_code}"
    assert r.status_code < 500, f"{what}: server error {r.text[:500]}"
    assert took <= BOUND, f"{what}: took {took:.1f}s"
    ctype = r.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        events = list(sse_events(r.text.splitlines()))
        assert events, f"{what}: empty event stream"
        for data in events:
            if data != "[DONE]":
                chunk = strict_json(data, f"{what} (event)")
                if "error" in chunk:
                    assert isinstance(chunk["error"].get("message"), str), f"{what}: {data}"
        return
    if r.status_code == 200 and route == "/flush_cache":
        return  # SGLang's plain-text "Cache flushed."
    body = strict_json(r.text, what)
    if r.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict) and isinstance(error.get("message"), str), (
            f"{what}: no error object: {r.text[:300]}"
        )


def still_serves(http: httpx.Client, engine) -> None:
    params = {"max_new_tokens": 2, "ignore_eos": True}
    r = http.post("/generate", json={"text": "hello", "sampling_params": params})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 2
    kv_all_free(http, engine)


# -- values ---------------------------------------------------------------------------------
# An integer of 5000 digits: Python's json refuses to write it (and, by default, to read it), so
# it is a marker string replaced by the digits in the body text.
HUGE = "\x00HUGE\x00"
HUGE_DIGITS = b"1" + b"0" * 5000
SURROGATES = st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2
)
STRINGS = st.one_of(
    st.text(max_size=12),
    SURROGATES,
    st.sampled_from(["", "a\udfffb", "\x00", "é日本", "<s>", "</s>", "The capital of", "x" * 9000]),
)
NUMBERS = st.one_of(
    st.integers(-3, 300),
    st.integers(),
    st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30, HUGE]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -0.0, 5e-324, 0.5, 2.5]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
VALUES = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(STRINGS, c, max_size=4),
    max_leaves=10,
)


GOOD_PROMPTS = st.one_of(
    st.sampled_from(["hello", "The capital of France is", " ", "é日本", '{"a": 1}']),
    st.text(min_size=1, max_size=20),
)
BAD_PROMPTS = st.one_of(st.sampled_from(["", "x" * 9000, "a\udfffb"]), SURROGATES)
GOOD_IDS = st.lists(st.integers(2, 300), min_size=1, max_size=8)
BAD_IDS = st.lists(st.sampled_from([-1, 0, 320, 10**6, 2**40, -(2**63), 1.5]), max_size=4)
GOOD_TOKENS = st.integers(0, 6)
BAD_TOKENS = st.sampled_from([-1, None, 10**9, 2**63, 1e308, "3", 2.5, HUGE])
GOOD_REGEXES = st.sampled_from(["[ab]{1,4}", r"\d+", "(yes|no)", "[a-z ]{0,10}", "é+"])
BAD_REGEXES = st.sampled_from(
    ["(", "a{1000000}", "((a{0,40}){0,40}){0,40}", "", "a|", "(?=a)a", r"(a)\1", "[^a]{100000}"]
)
GOOD_SCHEMAS = st.sampled_from(
    [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        {"type": "integer", "minimum": -5, "maximum": 99},
        {"enum": ["x", 1, None]},
        {"type": "string", "maxLength": 3},
    ]
)
BAD_SCHEMAS = st.one_of(
    st.sampled_from(
        [
            {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
            {"type": "string", "pattern": "("},
            {"type": "nonsense"},
            {"$ref": "#/nowhere"},
            {"type": "integer", "minimum": HUGE},
            {"type": "integer", "maximum": 1e308},
            {"type": "array", "uniqueItems": True},
            True,
            "{not json",
        ]
    ),
    VALUES,
)
GOOD_LARK = st.sampled_from(
    ['start: "a" start?', 'start: x\nx: "a" | "b" | x x | x x x | x x x x', "start: /[0-9]{1,3}/"]
)
BAD_LARK = st.sampled_from(["start: ", "%%%", "start: undefined_rule", "start: /(/"])


def json_text_of(schemas: st.SearchStrategy) -> st.SearchStrategy:
    return schemas.map(lambda s: s if isinstance(s, str) else json.dumps(s))


SAMPLING_FIELDS = {  # key: (good values, bad values)
    "min_new_tokens": (st.integers(0, 3), st.sampled_from([-1, 10**9, "1"])),
    "stop": (
        st.one_of(
            st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=3)
        ),
        st.one_of(st.sampled_from(["", ["x"] * 300]), SURROGATES, st.lists(STRINGS, max_size=3)),
    ),
    "stop_token_ids": (st.lists(st.integers(2, 300), max_size=3), BAD_IDS),
    "temperature": (
        st.floats(0, 2),
        st.sampled_from([-1.0, float("nan"), float("inf"), 1e308, "hot"]),
    ),
    "top_p": (st.floats(0.05, 1), st.sampled_from([0, -0.5, 1.5, float("nan")])),
    "top_k": (st.sampled_from([-1, 1, 5, 50]), st.sampled_from([-2, 0, 10**9, 2**63])),
    "min_p": (st.floats(0, 1), st.sampled_from([-0.5, 1.5, float("-inf")])),
    "frequency_penalty": (st.floats(-2, 2), st.sampled_from([-3.0, 3.0, float("nan")])),
    "presence_penalty": (st.floats(-2, 2), st.sampled_from([-3.0, 1e308])),
    "repetition_penalty": (st.floats(0.5, 2), st.sampled_from([0, -1.0, float("inf")])),
    "ignore_eos": (st.booleans(), st.sampled_from(["yes", 2])),
    "n": (st.sampled_from([1, 2, 3]), st.sampled_from([0, -1, 129, 257, 10**6, 2.5, "2"])),
    "seed": (st.integers(0, 2**32), st.sampled_from([-1, 2**64, 1.5])),
    "regex": (GOOD_REGEXES, BAD_REGEXES),
    "json_schema": (json_text_of(GOOD_SCHEMAS), json_text_of(BAD_SCHEMAS)),
    "ebnf": (GOOD_LARK, BAD_LARK),
    "lark": (GOOD_LARK, BAD_LARK),
    "skip_special_tokens": (st.booleans(), st.just("no")),
    "no_stop_trim": (st.booleans(), st.just(3)),
}
EXTRA = st.dictionaries(
    st.sampled_from(["foo", "", "__proto__", "model", "x" * 300]), VALUES, max_size=2
)


def body(required: dict, optional: dict, clean: bool) -> st.SearchStrategy:
    """A body from {key: (good, bad)}: clean, good values only; else each value good, bad or
    anything, with extra keys sometimes."""
    if clean:
        pick = {k: good for k, (good, _) in required.items()}
        opt = {k: good for k, (good, _) in optional.items()}
        return st.fixed_dictionaries(pick, optional=opt)

    def any_of(good, bad):
        return st.one_of(good, bad, bad, VALUES)

    plausible = st.fixed_dictionaries(
        {k: any_of(*v) for k, v in required.items()},
        optional={k: any_of(*v) for k, v in optional.items()},
    )
    return st.tuples(plausible, EXTRA, st.integers(0, 2)).map(
        lambda p: {**p[0], **p[1]} if p[2] == 0 else p[0]
    )


def sampling(clean: bool) -> st.SearchStrategy:
    return body({"max_new_tokens": (GOOD_TOKENS, BAD_TOKENS)}, SAMPLING_FIELDS, clean)


def grammar_at_most_one(params: dict) -> dict:
    """Clean sampling params carry at most one grammar (several are a 400 by design)."""
    kinds = [k for k in ("regex", "json_schema", "ebnf", "lark") if k in params]
    return {k: v for k, v in params.items() if k not in kinds[1:]}


SAMPLING_CLEAN = sampling(True).map(grammar_at_most_one)
SAMPLING_DIRTY = sampling(False)
PROMPT_FIELD = (
    st.one_of(GOOD_PROMPTS, st.lists(GOOD_PROMPTS, min_size=1, max_size=3)),
    st.one_of(BAD_PROMPTS, st.lists(BAD_PROMPTS, max_size=3), st.just([])),
)
OPENAI_FIELDS = {
    "n": (st.sampled_from([1, 2]), st.sampled_from([0, 129, 10**6, -1])),
    "stream": (st.booleans(), st.sampled_from(["true", 1])),
    "stream_options": (
        st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
        st.sampled_from([{"include_usage": "x"}, {"other": 1}, []]),
    ),
    "stop": SAMPLING_FIELDS["stop"],
    "seed": SAMPLING_FIELDS["seed"],
    "temperature": SAMPLING_FIELDS["temperature"],
    "top_p": SAMPLING_FIELDS["top_p"],
    "frequency_penalty": SAMPLING_FIELDS["frequency_penalty"],
    "logit_bias": (
        st.dictionaries(st.sampled_from(["5", "17", "300"]), st.floats(-100, 100), max_size=2),
        st.dictionaries(
            st.sampled_from(["abc", "99999", "-1", "1e3"]),
            st.sampled_from([float("inf"), float("nan"), 1e308, 1.0]),
            min_size=1,
            max_size=2,
        ),
    ),
    "response_format": (
        st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
            st.fixed_dictionaries(
                {
                    "type": st.just("json_schema"),
                    "json_schema": st.fixed_dictionaries(
                        {"name": st.just("x"), "schema": GOOD_SCHEMAS}
                    ),
                }
            ),
        ),
        st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "xml", ""])}),
            st.fixed_dictionaries(
                {
                    "type": st.just("json_schema"),
                    "json_schema": st.fixed_dictionaries(
                        {"name": st.sampled_from(["x", "y" * 100]), "schema": BAD_SCHEMAS}
                    ),
                }
            ),
        ),
    ),
    "ignore_eos": SAMPLING_FIELDS["ignore_eos"],
    "top_k": SAMPLING_FIELDS["top_k"],
    "min_tokens": (st.integers(0, 3), st.sampled_from([-1, 10**9])),
    "stop_token_ids": SAMPLING_FIELDS["stop_token_ids"],
    "rid": (st.text(min_size=1, max_size=8), st.one_of(SURROGATES, st.just(""), VALUES)),
}
GRAMMAR_FIELDS = {k: SAMPLING_FIELDS[k] for k in ("regex", "json_schema", "ebnf")}
GOOD_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system"]),
            "content": st.one_of(
                GOOD_PROMPTS,
                st.lists(
                    st.fixed_dictionaries({"type": st.just("text"), "text": GOOD_PROMPTS}),
                    min_size=1,
                    max_size=2,
                ),
            ),
        }
    ),
    min_size=1,
    max_size=3,
)
BAD_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "tool", "developer", "root", ""]),
            "content": st.one_of(BAD_PROMPTS, st.none(), VALUES),
        },
        optional={"name": STRINGS, "tool_call_id": STRINGS, "tool_calls": VALUES},
    ),
    max_size=3,
)
GOOD_TOOLS = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "get_weather"])},
                optional={"parameters": GOOD_SCHEMAS},
            ),
        }
    ),
    min_size=1,
    max_size=2,
)
BAD_TOOLS = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["function", "retrieval"]),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "bad name!", "", "x" * 65])},
                optional={"parameters": BAD_SCHEMAS},
            ),
        }
    ),
    max_size=3,
)
TOOL_CHOICE = (
    st.one_of(
        st.sampled_from(["auto", "none", "required"]),
        st.just({"type": "function", "function": {"name": "f"}}),
    ),
    st.one_of(
        st.sampled_from(["any", ""]),
        st.just({"type": "function", "function": {"name": "missing"}}),
    ),
)
GENERATE_FIELDS = {
    "sampling_params": (
        st.one_of(SAMPLING_CLEAN, st.lists(SAMPLING_CLEAN, min_size=1, max_size=3)),
        st.one_of(SAMPLING_DIRTY, st.lists(SAMPLING_DIRTY, max_size=3)),
    ),
    "rid": (
        st.text(min_size=1, max_size=8),
        st.one_of(SURROGATES, st.lists(STRINGS, max_size=3), VALUES),
    ),
    "stream": (st.booleans(), st.just("yes")),
    "return_logprob": (st.booleans(), st.just(2)),
    "logprob_start_len": (st.integers(-1, 10), st.sampled_from([-3, 10**9])),
    "top_logprobs_num": (st.integers(0, 5), st.sampled_from([-1, 101, 10**9])),
    "return_text_in_logprobs": (st.booleans(), st.just(None)),
}
IDS_FIELD = (
    st.one_of(GOOD_IDS, st.lists(GOOD_IDS, min_size=1, max_size=3)),
    st.one_of(BAD_IDS, st.lists(BAD_IDS, max_size=3), st.just([[]])),
)


def route_bodies(clean: bool) -> dict[str, st.SearchStrategy]:
    return {
        "/generate": st.one_of(
            body({"text": PROMPT_FIELD}, GENERATE_FIELDS, clean),
            body({"input_ids": IDS_FIELD}, GENERATE_FIELDS, clean),
            body({}, {"text": PROMPT_FIELD, "input_ids": IDS_FIELD, **GENERATE_FIELDS}, clean),
        ),
        "/v1/completions": body(
            {
                "model": (st.just("m"), st.sampled_from(["", None])),
                "prompt": (st.one_of(PROMPT_FIELD[0], IDS_FIELD[0]), PROMPT_FIELD[1]),
                "max_tokens": (GOOD_TOKENS, BAD_TOKENS),
            },
            {
                **OPENAI_FIELDS,
                **({} if clean else GRAMMAR_FIELDS),
                "logprobs": (st.integers(0, 5), st.sampled_from([-1, 21])),
                "echo": (st.booleans(), st.just("no")),
                "suffix": (st.none(), STRINGS),
                "best_of": (st.just(1), st.sampled_from([0, 3, 129])),
            },
            clean,
        ),
        "/v1/chat/completions": body(
            {
                "model": (st.just("m"), st.sampled_from(["", None])),
                "messages": (GOOD_MESSAGES, BAD_MESSAGES),
                "max_tokens": (GOOD_TOKENS, BAD_TOKENS),
            },
            {
                **OPENAI_FIELDS,
                **({} if clean else GRAMMAR_FIELDS),
                "max_completion_tokens": (GOOD_TOKENS, BAD_TOKENS),
                "logprobs": (st.booleans(), st.just(3)),
                "top_logprobs": (st.integers(0, 5), st.sampled_from([-1, 21])),
                "tools": (GOOD_TOOLS, BAD_TOOLS),
                "tool_choice": TOOL_CHOICE,
            },
            clean,
        ),
        "/abort_request": body(
            {},
            {
                "rid": (st.text(max_size=8), VALUES),
                "abort_all": (st.booleans(), st.sampled_from(["true", 1])),
            },
            clean,
        ),
        "/flush_cache": body({}, {"foo": (st.just(1), VALUES)}, clean),
    }


CLEAN_BODIES = route_bodies(True)
DIRTY_BODIES = route_bodies(False)


def encode(value: Any, ascii_only: bool) -> bytes:
    """JSON text as Python writes it: NaN/Infinity literals allowed; lone surrogates either as
    \\u escapes or (ascii_only False) as the invalid UTF-8 bytes of the surrogate itself."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    return text.encode("utf-8", errors="surrogatepass").replace(
        b'"\\u0000HUGE\\u0000"', HUGE_DIGITS
    )


@st.composite
def structured_requests(draw):
    route = draw(st.sampled_from(ROUTES))
    clean, dirty = CLEAN_BODIES[route], DIRTY_BODIES[route]
    value = draw(st.one_of(clean, clean, dirty, dirty, VALUES))
    return route, encode(value, draw(st.booleans()))


DEEP = 100_000
RAW_TEXTS = st.sampled_from(
    [
        b"",
        b"NaN",
        b"Infinity",
        b"null",
        b"[]",
        b'"text"',
        b"{",
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": NaN}}',
        b'{"text": "hi", "sampling_params": {"max_new_tokens": Infinity}}',
        b'{"model": "m", "prompt": "hi", "max_tokens": 2, "temperature": -Infinity}',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}',
        b'{"model": "m", "prompt": "hi", "max_tokens": 2, "json_schema": {"maximum": Infinity}}',
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 2, "json_schema": "{\\"type\\": \\"integer\\", \\"maximum\\": Infinity}"}}',
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 2}, "text": ["dup"]}',
        b'{"text": "\\ud800", "sampling_params": {"max_new_tokens": 2}}',
        b'{"text": "\xff\xfe", "sampling_params": {"max_new_tokens": 2}}',
        b'{"rid": 1' + b"0" * 5000 + b"}",
        b'{"text": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"text": ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}",
        b'{"text": "hi"} trailing',
        b"\xef\xbb\xbf{}",  # a byte-order mark
        b'{"text": "hi", "sampling_params": {"max_new_tokens": 2}}' * 2,
    ]
)


@st.composite
def raw_requests(draw):
    route = draw(st.sampled_from(ROUTES))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        content = draw(RAW_TEXTS)
    elif kind == 1:
        content = draw(st.binary(max_size=64))
    else:  # a plausible body cut short or with a byte changed
        value = draw(st.one_of(CLEAN_BODIES[route], DIRTY_BODIES[route]))
        text = encode(value, True)
        cut = draw(st.integers(0, len(text)))
        if kind == 2:
            content = text[:cut]
        else:
            byte = draw(st.sampled_from([b"\x00", b"\xff", b"}", b'"', b",", b"\\"]))
            content = text[:cut] + byte + text[cut + 1 :]
    ctype = draw(
        st.sampled_from(
            ["application/json", "application/json", "text/plain", None, "multipart/form-data",
             "application/json; charset=latin-1", "application/x-www-form-urlencoded"]
        )
    )  # fmt: skip
    method = draw(st.sampled_from(["POST", "POST", "POST", "PUT", "GET", "DELETE", "PATCH"]))
    return method, route, content, ctype


# -- the tests --------------------------------------------------------------------------------
def test_random_json_bodies_get_clean_answers(http, engine):
    @settings(max_examples=250)
    @given(request=structured_requests())
    def run(request):
        route, content = request
        r, took = send(http, "POST", route, content, "application/json")
        check_answer("POST", route, content, r, took)

    run()
    still_serves(http, engine)


def test_random_raw_bodies_get_clean_answers(http, engine):
    @settings(max_examples=150)
    @given(request=raw_requests())
    def run(request):
        method, route, content, ctype = request
        r, took = send(http, method, route, content, ctype)
        check_answer(method, route, content, r, took)

    run()
    still_serves(http, engine)
