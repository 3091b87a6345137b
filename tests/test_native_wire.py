"""SGLang 0.5.23 wire parity of /generate on a tiny model: every request field known, refused
fields named, stop_regex, seeds, logprob shapes (checked against transformers), streaming."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from server_harness import sse_events, start_server
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.sampling_params import UNSUPPORTED as UNSUPPORTED_PARAMS
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server.native_protocol import IGNORED, UNSUPPORTED, GenerateRequest

PROMPT = "The quick brown fox"
LONG = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
SGLANG = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/sglang"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("native-wire"), "llama", seed=0)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = rf.Engine(str(model_dir), dtype="float32", max_total_tokens=2048)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def http(engine):
    running = start_server(engine)
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()


def _post(http, **body):
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _error(http, **body) -> dict:
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def _class_fields(path: Path, name: str, stop_at: str | None = None) -> list[str]:
    """Annotated field names of class `name` in an SGLang source file (read, not imported: the
    package pulls GPU-only dependencies), up to the line holding `stop_at`."""
    source = path.read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    last = len(source.splitlines())
    if stop_at is not None:
        last = next(i for i, line in enumerate(source.splitlines(), 1) if stop_at in line)
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.lineno < last
    ]


@pytest.mark.skipif(not SGLANG.is_dir(), reason="the sglang wheel is not installed in .venv")
def test_every_sglang_field_is_implemented_or_named():
    request_fields = _class_fields(SGLANG / "srt/managers/io_struct.py", "GenerateReqInput")
    assert len(request_fields) > 60
    known = set(GenerateRequest.model_fields) | IGNORED | set(UNSUPPORTED)
    assert [f for f in request_fields if f not in known] == []
    param_fields = _class_fields(
        SGLANG / "srt/sampling/sampling_params.py", "SamplingParams", stop_at="Internal fields"
    )
    ours = {f for f in SamplingParams.__dataclass_fields__} | {"sampling_seed"}
    assert [f for f in param_fields if f not in ours | set(UNSUPPORTED_PARAMS)] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"image_data": "https://example.com/cat.png"}, "image_data"),
        ({"video_data": ["v.mp4"]}, "video_data"),
        ({"audio_data": "a.wav"}, "audio_data"),
        ({"custom_logit_processor": "{}"}, "custom_logit_processor"),
        ({"lora_path": "adapter"}, "lora_path"),
        ({"session_params": {"id": "s"}}, "session_params"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"input_embeds": [[0.0]]}, "input_embeds"),
        ({"data_parallel_rank": 1}, "data_parallel_rank"),
        ({"sampling_params": {"structural_tag": "{}"}}, "structural_tag"),
        ({"sampling_params": {"beam_width": 4}}, "beam_width"),
        ({"sampling_params": {"custom_params": {"a": 1}}}, "custom_params"),
    ],
)
def test_unsupported_fields_are_400_naming_them(http, body, field):
    err = _error(http, text=PROMPT, **body)
    assert err["param"] == field and "not supported" in err["message"]


def test_off_values_and_routing_fields_are_accepted(http):
    out = _post(
        http,
        text=PROMPT,
        sampling_params={**LONG, "max_new_tokens": 2, "beam_width": None, "stream_interval": 1},
        model="whatever-the-router-says",
        image_data=None,
        return_hidden_states=False,
        data_parallel_rank=0,
        session_id="s1",
        log_metrics=True,
    )
    assert out["meta_info"]["completion_tokens"] == 2


def test_unknown_names_get_a_did_you_mean(http):
    err = _error(http, text=PROMPT, retrun_logprob=True)
    assert err["param"] == "retrun_logprob" and "did you mean 'return_logprob'" in err["message"]
    err = _error(http, text=PROMPT, sampling_params={"stop_regexp": "x"})
    assert err["param"] == "stop_regexp" and "did you mean 'stop_regex'" in err["message"]


def test_sglang_frontend_defaults_are_accepted(http):
    # What SGLang's RuntimeEndpoint sends for a plain gen(): empty stop lists, nulls.
    params = {
        "max_new_tokens": 3,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": True,
        "regex": None,
        "json_schema": None,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
    }
    out = _post(http, text=PROMPT, sampling_params=params)
    assert out["meta_info"]["completion_tokens"] == 3


def test_stop_regex_trims_like_a_stop_string(http):
    ref = _post(http, text=PROMPT, sampling_params=LONG)["text"]
    target = ref[6:9]
    # Fixed width, so the first match to complete while decoding is the leftmost one.
    pattern = re.escape(target[0]) + r"[\s\S]" + re.escape(target[2])
    first = re.search(pattern, ref)
    assert first is not None and first.start() <= 6
    out = _post(http, text=PROMPT, sampling_params={**LONG, "stop_regex": [pattern]})
    assert out["text"] == ref[: first.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = _post(
        http, text=PROMPT, sampling_params={**LONG, "stop_regex": pattern, "no_stop_trim": True}
    )
    assert kept["text"] == ref[: first.end()]


@pytest.mark.parametrize(
    ("pattern", "words"), [("(", "valid regular expression"), ("x*", "empty string")]
)
def test_bad_stop_regex_is_400(http, pattern, words):
    err = _error(http, text=PROMPT, sampling_params={"stop_regex": pattern})
    assert err["param"] == "stop_regex" and words in err["message"]


def test_sampling_seed_is_the_seed(http):
    sampled = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    a = _post(http, text=PROMPT, sampling_params={**sampled, "sampling_seed": 7})
    b = _post(http, text=PROMPT, sampling_params={**sampled, "seed": 7})
    assert a["output_ids"] == b["output_ids"]
    many = _post(http, text=PROMPT, sampling_params={**sampled, "sampling_seed": 7, "n": 2})
    assert many[0]["output_ids"] == a["output_ids"]
    err = _error(http, text=PROMPT, sampling_params={"sampling_seed": 1, "seed": 2})
    assert err["param"] == "sampling_seed"


def _reference_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at every position of `ids`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits, dim=-1)


def test_logprob_meta_info_matches_transformers(http, engine, model_dir):
    prompt_ids = engine.tokenizer.encode(PROMPT)
    wanted = [5, 6, 40]
    out = _post(
        http,
        input_ids=prompt_ids,
        sampling_params={**LONG, "max_new_tokens": 4},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        token_ids_logprob=wanted,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    ref = _reference_logprobs(model_dir, prompt_ids + out["output_ids"])
    n = len(prompt_ids)
    assert meta["prompt_tokens"] == n and meta["completion_tokens"] == 4
    assert meta["output_token_logprobs_length"] == 4 == len(meta["output_token_logprobs"])
    inputs = meta["input_token_logprobs"]
    assert [t for _, t, _ in inputs] == prompt_ids and inputs[0][0] is None
    for pos, (lp, t, text) in enumerate(inputs[1:], 1):
        assert lp == pytest.approx(ref[pos - 1, t].item(), abs=1e-4)
        assert text == engine.tokenizer.decode([t])
    for i, (lp, t, _) in enumerate(meta["output_token_logprobs"]):
        assert lp == pytest.approx(ref[n - 1 + i, t].item(), abs=1e-4)
        top = meta["output_top_logprobs"][i]
        assert [e[1] for e in top] == ref[n - 1 + i].topk(2).indices.tolist()
        row = meta["output_token_ids_logprobs"][i]
        assert [e[1] for e in row] == wanted
        assert [e[0] for e in row] == pytest.approx(ref[n - 1 + i, wanted].tolist(), abs=1e-4)
    assert len(meta["input_token_ids_logprobs"]) == n
    assert meta["input_token_ids_logprobs"][0] is None
    assert [e[0] for e in meta["input_token_ids_logprobs"][2]] == pytest.approx(
        ref[1, wanted].tolist(), abs=1e-4
    )


def test_logprobs_without_start_follow_sglang(http, engine):
    out = _post(
        http, text=PROMPT, sampling_params={**LONG, "max_new_tokens": 3}, return_logprob=True
    )
    meta = out["meta_info"]
    assert meta["input_token_logprobs"] == [] and len(meta["output_token_logprobs"]) == 3
    # Prefill-only scoring without a start (select's unconditional pass): the whole prompt.
    ids = engine.tokenizer.encode(PROMPT)
    scored = _post(
        http, input_ids=[ids], sampling_params={"max_new_tokens": 0}, return_logprob=True
    )
    assert [t for _, t, _ in scored[0]["meta_info"]["input_token_logprobs"]] == ids


def test_per_prompt_logprob_options_and_prompt_ids(http, engine):
    out = _post(
        http,
        text=[PROMPT, "Paris is"],
        sampling_params={**LONG, "max_new_tokens": 2},
        return_logprob=[True, False],
        logprob_start_len=[1, -1],
        return_prompt_token_ids=True,
    )
    assert len(out[0]["meta_info"]["input_token_logprobs"]) == len(out[0]["prompt_token_ids"]) - 1
    assert "output_token_logprobs" not in out[1]["meta_info"]
    assert out[1]["prompt_token_ids"] == engine.tokenizer.encode("Paris is")
    err = _error(http, text=[PROMPT, "x"], return_logprob=[True])
    assert err["param"] == "return_logprob"
    err = _error(http, text=PROMPT, return_logprob=True, logprob_start_len=999)
    assert err["param"] == "logprob_start_len"


def _stream(http, body) -> list[dict]:
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_cumulative_stream_never_shows_a_stop_string_prefix(http):
    ref = _post(http, text=PROMPT, sampling_params=LONG)["text"]
    stop = ref[8:11]
    final = _post(http, text=PROMPT, sampling_params={**LONG, "stop": stop})
    chunks = _stream(http, {"text": PROMPT, "sampling_params": {**LONG, "stop": stop}})
    assert chunks[-1]["text"] == final["text"]
    for chunk in chunks:
        assert final["text"].startswith(chunk["text"])


@pytest.fixture(scope="module")
def incremental_http(model_dir):
    eng = rf.Engine(
        str(model_dir), dtype="float32", max_total_tokens=1024, incremental_streaming_output=True
    )
    running = start_server(eng)
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()
    eng.shutdown()


def test_incremental_streaming_sends_only_the_new_part(http, incremental_http):
    body = {"text": PROMPT, "sampling_params": LONG, "return_logprob": True}
    whole = _post(http, **body)
    chunks = _stream(incremental_http, body)
    assert len(chunks) > 2
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    logprobs = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert [t for _, t, _ in logprobs] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["output_token_logprobs_length"] == len(whole["output_ids"])
    # The default stays cumulative, as SGLang's.
    assert _stream(http, body)[-1]["text"] == whole["text"]


def test_router_routes_are_served(http, engine):
    info = http.get("/model_info").json()
    assert info == http.get("/get_model_info").json()
    assert info["model_type"] == "llama" and info["is_generation"] is True
    (load,) = http.get("/get_load").json()  # one entry per data-parallel rank, as SGLang
    assert load["num_reqs"] == 0 and load["num_waiting_reqs"] == 0 and load["num_tokens"] >= 0
    assert http.get("/server_info").json() == http.get("/get_server_info").json()
