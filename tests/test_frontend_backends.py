"""Programs end to end on the default model (float32), on Runtime, RuntimeEndpoint and OpenAI.

One engine serves all three: `Runtime(engine=...)` in process, and our server (runtime/server.py,
uvicorn on a free local port) for RuntimeEndpoint and the OpenAI backend.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import jsonschema
import pytest
import uvicorn

import radixflow as rf
from radixflow.runtime.server import create_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    eng = rf.Engine(dtype="float32", max_total_tokens=16384)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def runtime(engine):
    return rf.Runtime(engine=engine)


@pytest.fixture(scope="module")
def server_url(engine):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def endpoint(server_url):
    backend = rf.RuntimeEndpoint(server_url)
    yield backend
    backend.shutdown()


@rf.function
def chat_program(s, question):
    s += rf.system("You are a concise assistant.")
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=12))
    s += rf.user("Give a number from 1 to 9.")
    s += rf.assistant(rf.gen("number", max_tokens=6))


def test_chat_text_is_the_tokenizer_template(runtime):
    state = chat_program.run("What is the capital of France?", temperature=0, backend=runtime)
    assert state.text() == runtime.tokenizer.apply_chat_template(state.messages(), tokenize=False)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"] * 1 + [
        "user",
        "assistant",
    ]
    assert "Paris" in state["answer"]


def test_same_greedy_output_on_runtime_and_endpoint(runtime, endpoint):
    questions = ["What is the capital of France?", "Name a primary color."]
    local = [chat_program.run(q, temperature=0, backend=runtime) for q in questions]
    remote = chat_program.run_batch(
        [{"question": q} for q in questions], temperature=0, backend=endpoint
    )
    for a, b in zip(local, remote, strict=True):
        assert b.error() is None
        assert (a["answer"], a["number"], a.text()) == (b["answer"], b["number"], b.text())
        assert (
            a.get_meta_info("answer")["completion_tokens"]
            == len(runtime.tokenizer.encode(a["answer"]))
            or a.get_meta_info("answer")["finish_reason"]["type"] == "stop"
        )


@rf.function
def capital(s, method):
    s += "Q: What is the capital of France?\nA: The capital of France is"
    s += rf.select("city", [" Paris", " London", " a green banana"], choices_method=method)


@pytest.mark.parametrize(
    "method",
    [rf.token_length_normalized, rf.greedy_token_selection, rf.unconditional_likelihood_normalized],
)
def test_select_three_methods_agree_across_backends(runtime, endpoint, method):
    local = capital.run(method, backend=runtime)
    remote = capital.run(method, backend=endpoint)
    assert local["city"] == remote["city"]
    meta_l, meta_r = local.get_meta_info("city"), remote.get_meta_info("city")
    assert meta_l["normalized_prompt_logprobs"] == pytest.approx(
        meta_r["normalized_prompt_logprobs"], abs=1e-4
    )
    if method is rf.token_length_normalized:
        assert local["city"] == " Paris"


def test_select_scores_are_prompt_logprobs(runtime):
    """The select score of a choice is the mean logprob of its tokens after the prompt."""
    state = capital.run(rf.token_length_normalized, backend=runtime)
    prefix = "Q: What is the capital of France?\nA: The capital of France is"
    runtime.flush_cache()  # reference computed without any cached prefix
    for choice, score in zip(
        [" Paris", " London", " a green banana"],
        state.get_meta_info("city")["normalized_prompt_logprobs"],
        strict=True,
    ):
        ids = runtime.tokenizer.encode(prefix + choice)
        n = len(runtime.tokenizer.encode(prefix))
        out = runtime.engine.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        lps = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][n:]]
        assert score == pytest.approx(sum(lps) / len(lps), abs=1e-4)


def test_fork_branches_hit_the_shared_prefix(runtime):
    @rf.function
    def tree(s):
        s += "List three fruits, one per line, each with a short reason why it is healthy.\n" * 3
        forks = s.fork(3)
        forks += lambda i: f"Option {i + 1}:" + rf.gen("idea", max_tokens=6, temperature=0)
        forks.join()

    runtime.flush_cache()
    state = tree.run(backend=runtime)
    assert len(state["idea"]) == 3
    assert runtime.engine.scheduler.cache.protected_size() == 0  # the fork's pin was released
    prefix_tokens = len(runtime.tokenizer.encode(state.text()))
    for i in range(3):
        meta = state.stream_executor.children[i].meta_info["idea"]
        # every branch reuses (nearly) the whole shared prefix from the radix cache
        assert meta["cached_tokens"] >= prefix_tokens - 2


def test_fork_pins_its_prefix_while_the_program_runs(runtime):
    seen = []

    @rf.function
    def tree(s):
        s += "Think of three different ways to sort a list of numbers.\n"
        forks = s.fork(2)
        seen.append(runtime.engine.stats["pinned_tokens"])
        forks += rf.gen("way", max_tokens=4, temperature=0)
        forks.join()

    runtime.flush_cache()
    tree.run(backend=runtime)
    assert seen[0] >= len(runtime.tokenizer.encode("Think of three different ways")) > 0
    assert runtime.engine.stats["pinned_tokens"] == 0


def test_regex_int_and_json_results_are_valid(runtime):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }

    @rf.function
    def extract(s):
        s += "Alice is 31 years old and lives in Paris.\nPhone: "
        s += rf.gen("phone", regex=r"\d{3}-\d{4}", max_tokens=10)
        s += "\nAge: " + rf.gen_int("age", max_tokens=4)
        s += "\nJSON: " + rf.gen("json", json_schema=json.dumps(schema), max_tokens=64)

    state = extract.run(temperature=0, backend=runtime)
    assert re.fullmatch(r"\d{3}-\d{4}", state["phone"])
    assert re.fullmatch(r"[-+]?[0-9]+[ \n]*", state["age"])
    jsonschema.validate(json.loads(state["json"]), schema)


def test_streaming_increments_concatenate(runtime, endpoint):
    for backend in (runtime, endpoint):
        state = chat_program.run("Say hello.", temperature=0, stream=True, backend=backend)
        chunks = list(state.text_iter())
        assert len(chunks) > 5
        assert "".join(chunks) == state.text()
        state = chat_program.run("Say hello.", temperature=0, stream=True, backend=backend)
        assert "".join(state.text_iter("answer")) == state["answer"]


def test_logprobs_and_meta_info(runtime):
    @rf.function
    def prog(s):
        s += "The capital of France is" + rf.gen(
            "x", max_tokens=3, return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True
        )

    state = prog.run(temperature=0, backend=runtime)
    meta = state.get_meta_info("x")
    assert [t for _, t, _ in meta["output_token_logprobs"]] == runtime.tokenizer.encode(state["x"])
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == state["x"]
    # greedy: each sampled token is the top-1 alternative
    assert all(
        top[0][1] == tok
        for (_, tok, _), top in zip(
            meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
        )
    )


def test_failed_request_reports_the_program_line(runtime, endpoint):
    @rf.function
    def prog(s):
        s += "Hi" + rf.gen("x", max_tokens=4, top_p=7.0)

    for backend in (runtime, endpoint):
        with pytest.raises(rf.ProgramError, match="top_p") as info:
            prog.run(backend=backend)
        assert "top_p=7.0" in str(info.value)  # the program line is quoted


def test_openai_backend_chat_and_clear_limits(server_url, runtime):
    model = httpx.get(server_url + "/v1/models").json()["data"][0]["id"]
    backend = rf.OpenAI(model, base_url=server_url + "/v1", api_key="unused")
    state = chat_program.run("What is the capital of France?", temperature=0, backend=backend)
    local = chat_program.run("What is the capital of France?", temperature=0, backend=runtime)
    assert state["answer"] == local["answer"]

    @rf.function
    def needs_select(s):
        s += rf.user("Pick one") + rf.assistant(rf.select("x", ["a", "b"]))

    with pytest.raises(rf.ProgramError, match="cannot score choices"):
        needs_select.run(backend=backend)

    @rf.function
    def needs_regex(s):
        s += rf.user("Number?") + rf.assistant(rf.gen("x", regex="[0-9]+"))

    with pytest.raises(rf.ProgramError, match="cannot honour gen's regex"):
        needs_regex.run(backend=backend)


def test_openai_completion_model_select(server_url, runtime):
    model = httpx.get(server_url + "/v1/models").json()["data"][0]["id"]
    backend = rf.OpenAI(model, base_url=server_url + "/v1", api_key="unused", is_chat_model=False)
    remote = capital.run(rf.token_length_normalized, backend=backend)
    assert remote["city"] == " Paris"
