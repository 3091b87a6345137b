"""SGLang-native routes over HTTP: /generate (single, batch, stream, logprobs), info, health,
cache, abort, metrics, API key, CORS, bad input and client disconnects."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import kv_all_free, sse_events, wait_idle

pytestmark = pytest.mark.slow
pytest_plugins = ["server_harness"]  # fixtures: engine, server, http

PROMPT = "The capital of France is"

GREEDY = {"max_new_tokens": 6, "temperature": 0}


def _generate(http, **body):
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_matches_engine(http, engine):
    ref = engine.generate(PROMPT, GREEDY)
    out = _generate(http, text=PROMPT, sampling_params=GREEDY)
    assert out["text"] == ref["text"] and out["output_ids"] == ref["output_ids"]
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(engine.tokenizer.encode(PROMPT))
    assert meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["e2e_latency"] >= meta["ttft"] > 0


def test_generate_batch_input_ids_and_n(http, engine):
    ids = [engine.tokenizer.encode(p) for p in (PROMPT, "1, 2, 3,")]
    out = _generate(http, input_ids=ids, sampling_params={**GREEDY, "n": 2}, rid=["a", "b"])
    assert [o["meta_info"]["id"] for o in out] == ["a-0", "a-1", "b-0", "b-1"]
    for o, prompt in zip(out, [ids[0], ids[0], ids[1], ids[1]], strict=True):
        assert (
            o["output_ids"]
            == engine.generate(input_ids=prompt, sampling_params=GREEDY)["output_ids"]
        )
    per_prompt = _generate(
        http,
        text=[PROMPT, PROMPT],
        sampling_params=[{"max_new_tokens": 1}, {"max_new_tokens": 3}],
    )
    assert [o["meta_info"]["completion_tokens"] for o in per_prompt] == [1, 3]


def test_generate_stream_is_cumulative(http, engine):
    final = _generate(http, text=PROMPT, sampling_params=GREEDY)
    with http.stream(
        "POST", "/generate", json={"text": PROMPT, "sampling_params": GREEDY, "stream": True}
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert texts[-1] == final["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_generate_stream_batch_has_indices(http):
    body = {"text": [PROMPT, "Hi"], "sampling_params": GREEDY, "stream": True}
    with http.stream("POST", "/generate", json=body) as r:
        chunks = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]


def test_logprobs_with_text(http, engine):
    prompt = "Logprobs of every prompt token after the first"
    kwargs = dict(return_logprob=True, logprob_start_len=1, top_logprobs_num=2)
    out = _generate(
        http, text=prompt, sampling_params=GREEDY, return_text_in_logprobs=True, **kwargs
    )
    meta = out["meta_info"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - 1
    ref_meta = engine.generate(prompt, GREEDY, **kwargs)["meta_info"]
    for key in ("output_token_logprobs", "input_token_logprobs"):
        got = meta[key]
        assert [t for _, t, _ in got] == [t for _, t, _ in ref_meta[key]]
        assert [lp for lp, _, _ in got] == pytest.approx(
            [lp for lp, _, _ in ref_meta[key]], abs=1e-4
        )
        assert [text for _, t, text in got] == [engine.tokenizer.decode([t]) for _, t, _ in got]
    assert [len(row) for row in meta["output_top_logprobs"]] == [2] * 6
    plain = _generate(http, text=prompt, sampling_params=GREEDY, **kwargs)
    assert all(text is None for _, _, text in plain["meta_info"]["output_token_logprobs"])


def test_prefill_only_caches_prompt(http, engine):
    prompt = "A long shared system prompt that several requests reuse, word for word. " * 3
    first = _generate(http, text=prompt, sampling_params={"max_new_tokens": 0})
    assert first["meta_info"]["completion_tokens"] == 0 and first["text"] == ""
    again = _generate(http, text=prompt + "Question:", sampling_params={"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 1


def test_info_routes(http, engine):
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["context_length"] == engine.context_length
    for path in ("/server_info", "/get_server_info"):
        s = http.get(path).json()
        assert s["dtype"] == "float32" and s["kv_pages_total"] == engine.kv_pages_total()
        assert s["max_total_tokens"] == 4096
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200


@pytest.mark.parametrize("path", ["/encode", "/v1/embeddings"])
def test_embeddings_are_refused(http, path):
    r = http.post(path, json={"text": "x"})
    assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]


def test_flush_cache_refuses_while_running(http, engine):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        events = sse_events(r.iter_lines())  # held: dropping it would close the connection
        next(events)
        refused = http.post("/flush_cache")
        assert refused.status_code == 400 and "flush" in refused.json()["error"]["message"]
    kv_all_free(http, engine)


def test_abort_request(http, engine):
    results = {}

    def run():
        body = {
            "text": PROMPT,
            "rid": "victim",
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
        }
        results["out"] = http.post("/generate", json=body).json()

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while "aborted" not in results:  # abort once the request is running
        assert time.monotonic() < deadline
        if engine.scheduler.running:
            results["aborted"] = http.post("/abort_request", json={"rid": "victim"}).json()
        time.sleep(0.05)
    t.join(timeout=30)
    assert results["aborted"] == {"aborted": 1}
    meta = results["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 400
    assert http.post("/abort_request", json={}).status_code == 400


def test_disconnect_mid_stream_aborts_and_frees_kv(server, engine):
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True},
        "stream": True,
    }
    before = engine.stats["completion_tokens"]
    with (
        httpx.Client(base_url=server.url) as client,
        client.stream("POST", "/generate", json=body) as r,
    ):
        events = sse_events(r.iter_lines())
        next(events), next(events)
    start = time.monotonic()
    wait_idle(engine, timeout=10)
    assert time.monotonic() - start < 10
    assert engine.stats["completion_tokens"] - before < 500
    with httpx.Client(base_url=server.url) as client:
        kv_all_free(client, engine)


def test_disconnect_while_waiting_aborts(server, engine):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    with httpx.Client(base_url=server.url, timeout=1.0) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/generate", json=body)
    wait_idle(engine, timeout=10)


BAD_BODIES = [
    ({"text": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": PROMPT, "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": PROMPT, "sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
    ({"text": PROMPT, "sampling_params": {"max_new_token": 5}}, "max_new_token"),
    ({"text": PROMPT, "sampling_params": {"stop_token_ids": [10**9]}}, "stop_token_ids"),
    ({"text": PROMPT, "sampling_params": {"regex": "a", "json_schema": "{}"}}, "regex"),
    ({"text": PROMPT, "unknown_field": 1}, "unknown_field"),
    ({"text": 5}, "text"),
    ({"text": ""}, "text"),
    ({"input_ids": [1, -3]}, "input_ids"),
    ({"text": PROMPT, "input_ids": [1]}, "text"),
    ({"text": PROMPT, "stream": "yes"}, "stream"),
    ({"text": PROMPT, "top_logprobs_num": -1}, "top_logprobs_num"),
    ({"text": [PROMPT, PROMPT], "sampling_params": [{}]}, "sampling_params"),
    ({"text": "word " * 9000}, "text"),
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES, ids=[f for _, f in BAD_BODIES])
def test_bad_input_is_400_naming_the_field(http, body, field):
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field or field in error["message"], error


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"json_schema": '{"type": "no-such-type"}'}, "json_schema"),
    ],
)
def test_invalid_grammar_is_400(http, params, field):
    r = http.post(
        "/generate", json={"text": PROMPT, "sampling_params": {**params, "max_new_tokens": 2}}
    )
    assert r.status_code == 400 and field in json.dumps(r.json())


def test_malformed_json_is_400(http):
    r = http.post(
        "/generate", content=b'{"text": "x",', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_bad_input_leaves_other_requests_alone(http, server, engine):
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 12}, "stream": True}
    with (
        httpx.Client(base_url=server.url, timeout=60) as other,
        other.stream("POST", "/generate", json=body) as r,
    ):
        for bad, _ in BAD_BODIES[:6]:
            assert http.post("/generate", json=bad).status_code == 400
        chunks = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert chunks[-1]["text"] == engine.generate(PROMPT, {**GREEDY, "max_new_tokens": 12})["text"]


def test_metrics(http):
    _generate(http, text=PROMPT, sampling_params=GREEDY)
    with http.stream(
        "POST", "/generate", json={"text": PROMPT, "sampling_params": GREEDY, "stream": True}
    ) as r:
        list(r.iter_lines())
    http.post("/generate", json={"text": 5})
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}

    def value(name, suffix="", **labels):
        return sum(
            s.value
            for s in families[name].samples
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert value("radixflow_requests", "_total", finish_reason="length") >= 2
    assert value("radixflow_prompt_tokens", "_total") >= 10
    assert value("radixflow_generation_tokens", "_total") >= 12
    assert value("radixflow_cached_tokens", "_total") > 0
    for hist in ("time_to_first_token", "inter_token_latency", "e2e_request_latency"):
        assert value(f"radixflow_{hist}_seconds", "_count") >= 2
    assert value("radixflow_http_errors", "_total", status="400") >= 1
    for gauge in (
        "num_running_reqs",
        "num_waiting_reqs",
        "kv_pages_used",
        "kv_usage",
        "pinned_tokens",
    ):
        assert f"radixflow_{gauge}" in families
    assert value("radixflow_kv_pages_total") == 4096


def test_api_key_and_cors(server_factory):
    secured = server_factory(api_key="sesame", cors_origins=["http://example.test"])
    with httpx.Client(base_url=secured.url, timeout=60) as c:
        assert c.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            r = c.post("/generate", json={"text": PROMPT}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert c.get("/v1/models", headers=headers).status_code == 401
        ok = {"Authorization": "Bearer sesame"}
        assert c.get("/v1/models", headers=ok).status_code == 200
        preflight = c.options(
            "/v1/models",
            headers={"Origin": "http://example.test", "Access-Control-Request-Method": "GET"},
        )
        assert preflight.headers["access-control-allow-origin"] == "http://example.test"


def test_cors_off_by_default(http):
    r = http.get("/get_model_info", headers={"Origin": "http://example.test"})
    assert "access-control-allow-origin" not in r.headers
