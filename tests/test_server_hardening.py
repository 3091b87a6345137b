"""Hardening of the HTTP face: no request reads or stops another's, bad input gets a fast 4xx
naming what was wrong, keys are checked before bodies are read, responses are strict JSON.

Each test ends by checking that a normal request still succeeds and, after a flush, every KV
page is free."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from server_harness import kv_all_free, sse_events, wait_idle

from radixflow.runtime.server.limits import ServerLimits

pytestmark = pytest.mark.slow
pytest_plugins = ["server_harness"]  # fixtures: engine, server, http, server_factory

PROMPT = "The capital of France is"
LONG = {"max_new_tokens": 120, "ignore_eos": True, "temperature": 0}
GREEDY3 = {"max_new_tokens": 3, "temperature": 0}


def strict_json(text: str):
    """Parse as standard JSON: NaN and Infinity are errors."""

    def refuse(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def still_serves(http, engine) -> None:
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 2
    kv_all_free(http, engine)


def assert_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    error = strict_json(r.text)["error"]
    for word in words:
        assert word in error["message"], error["message"]
    return error


def raw_post(server, path: str, body: str, headers: dict | None = None) -> httpx.Response:
    """POST a body that is not standard JSON (NaN, Infinity, lone surrogates)."""
    all_headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(
        f"{server.url}{path}", content=body.encode("utf-8"), headers=all_headers, timeout=60
    )


# -- 1. rids --------------------------------------------------------------------------------
def test_a_client_rid_cannot_take_over_another_requests_samples(server, http, engine):
    """Client A runs rid X with n=2 (shown as X-0, X-1); client B sending rid X-0 gets its own
    answer, never A's, and A gets both of its samples."""
    victim = {"text": PROMPT, "rid": "X", "sampling_params": {**LONG, "n": 2}, "stream": True}
    with (
        httpx.Client(base_url=server.url, timeout=60) as a,
        a.stream("POST", "/generate", json=victim) as stream,
    ):
        events = sse_events(stream.iter_lines())
        next(events)
        other = http.post(
            "/generate",
            json={"text": "1, 2, 3,", "rid": "X-0", "sampling_params": GREEDY3},
        )
        assert other.status_code == 200, other.text
        mine = other.json()
        assert mine["meta_info"]["id"] == "X-0"
        expected = engine.generate("1, 2, 3,", GREEDY3)["output_ids"]
        assert mine["output_ids"] == expected
        dup = http.post("/generate", json={"text": PROMPT, "rid": "X"})
        assert_error(dup, 400, "already in use")
        finals = {}
        for data in events:
            if data == "[DONE]":
                break
            out = strict_json(data)
            finals[out["meta_info"]["id"]] = out["meta_info"]
    assert sorted(finals) == ["X-0", "X-1"]
    for meta in finals.values():
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 120
    still_serves(http, engine)


def test_engine_refuses_a_live_rid(engine):
    stream = engine.generate(PROMPT, LONG, stream=True, rid="live")
    next(stream)
    with pytest.raises(ValueError, match="already in use"):
        engine.generate(PROMPT, {"max_new_tokens": 1}, rid="live")
    engine.abort("live")
    for _ in stream:
        pass
    assert engine.generate(PROMPT, {"max_new_tokens": 1}, rid="live")["meta_info"]["id"] == "live"


def test_abort_all_needs_the_admin_key(server_factory, engine):
    secured = server_factory(api_key="user", admin_api_key="admin")
    user = {"Authorization": "Bearer user"}
    admin = {"Authorization": "Bearer admin"}
    with httpx.Client(base_url=secured.url, timeout=60) as c:
        done = {}
        body = {"text": PROMPT, "rid": "mine", "sampling_params": LONG}
        t = threading.Thread(
            target=lambda: done.update(r=c.post("/generate", json=body, headers=user))
        )
        t.start()
        deadline = time.monotonic() + 30
        while not engine.scheduler.running:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = c.post("/abort_request", json={"abort_all": True}, headers=user)
        assert_error(refused, 403, "admin")
        assert c.post("/abort_request", json={"abort_all": True}, headers=admin).json() == {
            "aborted": 1
        }
        t.join(timeout=30)
        assert done["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert_error(c.post("/flush_cache", headers=user), 403, "admin")
        wait_idle(engine)
        assert c.post("/flush_cache", headers=admin).status_code == 200
        assert engine.kv_pages_free() == engine.kv_pages_total()


# -- 6. sizes and keys before work ------------------------------------------------------------
def _headers_only(url: str, path: str, headers: dict[str, str]) -> tuple[int, float]:
    """Send a request's headers, never its body; the status line and how long it took."""
    parts = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.hostname}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    start = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status = sock.recv(4096).split(b" ", 2)[1]
    return int(status), time.monotonic() - start


def test_the_key_is_checked_before_the_body_is_read(server_factory, http, engine):
    secured = server_factory(api_key="sesame")
    huge = {"Content-Length": str(300 * 2**20), "Content-Type": "application/json"}
    status, took = _headers_only(secured.url, "/generate", huge)
    assert status == 401 and took < 2
    status, took = _headers_only(
        secured.url, "/generate", {**huge, "Authorization": "Bearer sesame"}
    )
    assert status == 413 and took < 2
    bad_json = raw_post(secured, "/generate", "{not json")
    assert_error(bad_json, 401, "API key")
    still_serves(http, engine)


def test_a_body_over_the_cap_is_refused_while_it_streams(server_factory, http, engine):
    small = server_factory(limits=ServerLimits(max_body_bytes=4096))

    def chunks():  # no Content-Length: the size is only known as it arrives
        yield b'{"text": "'
        for _ in range(64):
            yield b"a" * 1024
        yield b'"}'

    r = httpx.post(f"{small.url}/generate", content=chunks(), timeout=30)
    assert_error(r, 413, "4096 bytes")
    still_serves(http, engine)


def test_prompt_length_is_capped_before_tokenizing(server_factory, http, engine):
    start = time.monotonic()
    r = http.post("/generate", json={"text": "word " * (8 * 2**20 // 5)})
    assert_error(r, 400, "characters", "--max-prompt-chars")
    assert time.monotonic() - start < 5
    capped = server_factory(limits=ServerLimits(max_prompt_chars=100))
    with httpx.Client(base_url=capped.url, timeout=60) as c:
        assert_error(c.post("/generate", json={"text": "x" * 101}), 400, "at most 100")
        chat = {"model": "m", "messages": [{"role": "user", "content": "y" * 200}]}
        assert_error(c.post("/v1/chat/completions", json=chat), 400, "at most 100")
    still_serves(http, engine)


def test_prompts_times_n_is_capped(http, engine):
    body = {"text": [PROMPT] * 40, "sampling_params": {"n": 64, "max_new_tokens": 1}}
    start = time.monotonic()
    assert_error(http.post("/generate", json=body), 400, "2560 generations", "256")
    assert time.monotonic() - start < 2
    still_serves(http, engine)


def test_max_tokens_beyond_the_context_is_refused(http, engine):
    huge = {"text": PROMPT, "sampling_params": {"max_new_tokens": 10**20}}
    assert_error(http.post("/generate", json=huge), 400, "max_new_tokens", "context length")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**20}
    error = assert_error(http.post("/v1/chat/completions", json=chat), 400, "context length")
    assert error["param"] == "max_tokens"
    still_serves(http, engine)


# -- 7. bad text and non-finite numbers -------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", '{"text": "ok \\ud800"}', "text"),
        ("/generate", '{"text": "ok", "rid": "\\udfff"}', "rid"),
        ("/v1/completions", '{"model": "m", "prompt": "\\ud800"}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages",
        ),
    ],
)
def test_lone_surrogates_get_a_400(server, http, engine, path, body, field):
    error = assert_error(raw_post(server, path, body), 400, "surrogate")
    assert error["param"] == field
    still_serves(http, engine)


@pytest.mark.parametrize(
    "params",
    [
        '{"json_schema": {"type": "integer", "minimum": Infinity}}',
        '{"json_schema": {"type": "number", "maximum": NaN}}',
        '{"temperature": NaN}',
        '{"top_p": Infinity}',
        '{"repetition_penalty": 1e-300}',
    ],
)
def test_non_finite_and_degenerate_numbers_get_a_400(server, http, engine, params):
    body = f'{{"text": "{PROMPT}", "sampling_params": {params}}}'
    r = raw_post(server, "/generate", body)
    assert 400 <= r.status_code < 500, r.text
    strict_json(r.text)
    still_serves(http, engine)


def _finite_logprobs(values) -> None:
    assert values and all(isinstance(v, float) and math.isfinite(v) for v in values)


def test_constrained_top_logprobs_are_finite_json(server, http, engine):
    """Tokens the grammar forbids have logprob -inf; responses carry a finite floor instead."""
    params = {"regex": "(yes|no)", "max_new_tokens": 4, "temperature": 0}
    native = http.post(
        "/generate",
        json={"text": PROMPT, "sampling_params": params, "return_logprob": True,
              "top_logprobs_num": 8},
    )  # fmt: skip
    assert native.status_code == 200
    meta = strict_json(native.text)["meta_info"]
    _finite_logprobs([lp for row in meta["output_top_logprobs"] for lp, _, _ in row])
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Is Paris in France?"}],
        "regex": "(yes|no)",
        "logprobs": True,
        "top_logprobs": 8,
        "max_tokens": 4,
    }
    whole = http.post("/v1/chat/completions", json=chat)
    assert whole.status_code == 200, whole.text
    content = strict_json(whole.text)["choices"][0]["logprobs"]["content"]
    _finite_logprobs([t["logprob"] for c in content for t in c["top_logprobs"]])
    streamed = []
    with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
        for data in sse_events(r.iter_lines()):
            if data != "[DONE]":
                lp = strict_json(data)["choices"][0]["logprobs"]
                for c in (lp or {}).get("content", []):
                    streamed += [t["logprob"] for t in c["top_logprobs"]]
    _finite_logprobs(streamed)
    still_serves(http, engine)


# -- 8. files and operator routes -------------------------------------------------------------
def test_lark_imports_cannot_read_server_files(server, http, engine, tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "secret.lark").write_text("TOPSECRET: /password-[0-9]+/\n")
    monkeypatch.chdir(tmp_path)
    grammar = "%import .sub.secret (TOPSECRET)\nstart: TOPSECRET\n"
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": {"lark": grammar}})
    assert 400 <= r.status_code < 500
    assert "password" not in r.text and "TOPSECRET:" not in r.text
    still_serves(http, engine)


def test_docs_are_local_and_behind_the_key(server_factory):
    secured = server_factory(api_key="sesame")
    ok = {"Authorization": "Bearer sesame"}
    with httpx.Client(base_url=secured.url, timeout=60) as c:
        for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui-bundle.js"):
            assert c.get(path).status_code == 401
        page = c.get("/docs", headers=ok)
        assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "cdn" not in page.text.lower()
        script = c.get("/docs/assets/swagger-ui-bundle.js", headers=ok)
        assert script.status_code == 200 and "SwaggerUIBundle" in script.text
        assert "/generate" in c.get("/openapi.json", headers=ok).json()["paths"]


def test_flush_is_post_only_and_framework_errors_are_typed(http, engine):
    error = assert_error(http.get("/flush_cache"), 405)
    assert error["type"] == "invalid_request_error"
    assert assert_error(http.get("/no/such/route"), 404)["type"] == "not_found_error"
    still_serves(http, engine)
