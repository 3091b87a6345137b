"""Programs end to end on the default model (float32, marked slow), on Runtime, RuntimeEndpoint
and OpenAI; SGLang's backend API (the tiny-model tests at the end).

One engine serves all three: `Runtime(engine=...)` in process, and our server (runtime/server/,
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
import transformers
import uvicorn

import radixflow as rf
from radixflow.runtime.server.app import create_app


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


@pytest.mark.slow
def test_chat_text_is_the_tokenizer_template(runtime):
    state = chat_program.run("What is the capital of France?", temperature=0, backend=runtime)
    assert state.text() == runtime.tokenizer.apply_chat_template(state.messages(), tokenize=False)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"] * 1 + [
        "user",
        "assistant",
    ]
    assert "Paris" in state["answer"]


@pytest.mark.slow
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
@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert runtime.engine.kv.cache.protected_size() == 0  # the fork's pin was released
    prefix_tokens = len(runtime.tokenizer.encode(state.text()))
    for i in range(3):
        meta = state.stream_executor.children[i].meta_info["idea"]
        # every branch reuses (nearly) the whole shared prefix from the radix cache
        assert meta["cached_tokens"] >= prefix_tokens - 2


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_streaming_increments_concatenate(runtime, endpoint):
    for backend in (runtime, endpoint):
        state = chat_program.run("Say hello.", temperature=0, stream=True, backend=backend)
        chunks = list(state.text_iter())
        assert len(chunks) > 5
        assert "".join(chunks) == state.text()
        state = chat_program.run("Say hello.", temperature=0, stream=True, backend=backend)
        assert "".join(state.text_iter("answer")) == state["answer"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_failed_request_reports_the_program_line(runtime, endpoint):
    @rf.function
    def prog(s):
        s += "Hi" + rf.gen("x", max_tokens=4, top_p=7.0)

    for backend in (runtime, endpoint):
        with pytest.raises(rf.ProgramError, match="top_p") as info:
            prog.run(backend=backend)
        assert "top_p=7.0" in str(info.value)  # the program line is quoted


@pytest.mark.slow
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


@pytest.mark.slow
def test_openai_completion_model_select(server_url, runtime):
    model = httpx.get(server_url + "/v1/models").json()["data"][0]["id"]
    backend = rf.OpenAI(model, base_url=server_url + "/v1", api_key="unused", is_chat_model=False)
    remote = capital.run(rf.token_length_normalized, backend=backend)
    assert remote["city"] == " Paris"


# -- SGLang's backend API on a tiny model ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from tiny_models import make_tiny_model_dir

    path = make_tiny_model_dir(tmp_path_factory.mktemp("frontend-tiny"), "llama", seed=1)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=2048)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tiny_url(tiny_engine):
    from server_harness import start_server

    running = start_server(tiny_engine)
    yield running.url
    running.stop()


GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def test_runtime_has_sglangs_methods(tiny_engine):
    runtime = rf.Runtime(engine=tiny_engine)
    assert runtime.endpoint is runtime
    assert runtime.get_model_name() == str(tiny_engine.model_dir)
    assert runtime.get_tokenizer() is tiny_engine.tokenizer
    out = json.loads(runtime.generate("The quick", GREEDY))  # SGLang returns JSON text
    assert out["text"] == tiny_engine.generate("The quick", GREEDY)["text"]
    runtime.cache_prefix("Paris is the capital of France. " * 4)
    hit = tiny_engine.generate("Paris is the capital of France. " * 4 + "Berlin", GREEDY)
    assert hit["meta_info"]["cached_tokens"] > 0


def test_runtime_takes_sglang_server_args(tiny_engine):
    import logging

    path = str(tiny_engine.model_dir)
    runtime = rf.Runtime(path, log_level="warning", mem_fraction_static=0.5, max_total_tokens=512)
    try:
        assert logging.getLogger("radixflow").level == logging.WARNING
    finally:
        runtime.shutdown()
        logging.getLogger("radixflow").setLevel(logging.NOTSET)
    with pytest.raises(ValueError, match="log_level"):
        rf.Runtime(path, log_level="loud")
    with pytest.raises(ValueError, match="launch_timeout"):
        rf.Runtime(path, launch_timeout=0)
    with pytest.raises(ValueError, match="unknown engine option 'no_such_knob'"):
        rf.Runtime(path, no_such_knob=1)


@rf.function
def streamed(s):
    s += "The quick brown" + rf.gen(
        "out", max_tokens=8, temperature=0, ignore_eos=True, return_logprob=True
    )


@pytest.mark.parametrize("kind", ["runtime", "endpoint"])
async def test_stream_chunks_carry_their_own_logprobs(tiny_engine, tiny_url, kind):
    """SGLang's chunk shape: (text, meta) with only that chunk's output_token_logprobs."""
    backend = rf.Runtime(engine=tiny_engine) if kind == "runtime" else rf.RuntimeEndpoint(tiny_url)
    state = streamed.run(stream=True, backend=backend)
    chunks = [c async for c in state.text_async_iter("out", return_meta_data=True)]
    ref = tiny_engine.generate("The quick brown", GREEDY, return_logprob=True)
    assert "".join(text for text, _ in chunks) == ref["text"]
    ids = [t for _, meta in chunks for _, t, *_ in meta["output_token_logprobs"]]
    assert ids == ref["output_ids"]
    assert chunks[-1][1]["output_token_logprobs_length"] == len(ref["output_ids"])


def test_endpoint_takes_verify_and_chat_template_name(tiny_url, tiny_engine):
    from radixflow.runtime.chat_templates import BUILTIN_TEMPLATES

    endpoint = rf.RuntimeEndpoint(tiny_url, None, False, "chatml")
    assert endpoint.verify is False
    assert endpoint.get_model_name() == str(tiny_engine.model_dir)

    @rf.function
    def chat(s):
        s += rf.user("hi") + rf.assistant("yo")

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_engine.model_dir))
    tokenizer.chat_template = BUILTIN_TEMPLATES["chatml"]
    state = chat.run(backend=endpoint)
    assert state.text() == tokenizer.apply_chat_template(state.messages(), tokenize=False)
    with pytest.raises(ValueError, match="neither a file nor a built-in"):
        rf.RuntimeEndpoint(tiny_url, chat_template_name="no-such-template")


def test_select_over_http_all_methods_match_in_process(tiny_engine, tiny_url):
    @rf.function
    def pick(s, method):
        s += "Paris is the capital of" + rf.select(
            "x", [" France", " Germany", " fox"], choices_method=method
        )

    endpoint, runtime = rf.RuntimeEndpoint(tiny_url), rf.Runtime(engine=tiny_engine)
    for method in (
        rf.token_length_normalized,
        rf.greedy_token_selection,
        rf.unconditional_likelihood_normalized,
    ):
        remote, local = pick.run(method, backend=endpoint), pick.run(method, backend=runtime)
        assert remote["x"] == local["x"]
        for key, value in local.get_meta_info("x").items():
            if "normalized" in key:
                assert remote.get_meta_info("x")[key] == pytest.approx(value, abs=1e-4)


def test_openai_sglang_argument_order_and_token_usage(tiny_engine, tiny_url):
    import openai

    model = httpx.get(tiny_url + "/v1/models").json()["data"][0]["id"]
    backend = rf.OpenAI(model, False, base_url=tiny_url + "/v1", api_key="unused")
    assert backend.is_chat_model is False
    assert rf.OpenAI("gpt-3.5-turbo-instruct", api_key="x").is_chat_model is False
    assert rf.OpenAI("gpt-4o-mini", api_key="x").is_chat_model is True

    @rf.function
    def prog(s):
        s += "The quick brown" + rf.gen("a", max_tokens=5)
        s += " jumps" + rf.gen("b", max_tokens=3)

    prog.run(temperature=0, backend=backend)
    client = openai.OpenAI(base_url=tiny_url + "/v1", api_key="unused")
    first = client.completions.create(
        model=model, prompt="The quick brown", max_tokens=5, temperature=0
    )
    text = "The quick brown" + first.choices[0].text + " jumps"
    second = client.completions.create(model=model, prompt=text, max_tokens=3, temperature=0)
    usage = backend.token_usage
    assert usage.prompt_tokens == first.usage.prompt_tokens + second.usage.prompt_tokens
    assert usage.completion_tokens == first.usage.completion_tokens + second.usage.completion_tokens
    usage.reset()
    assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)


async def test_runtime_async_generate_streams_new_text(tiny_engine):
    runtime = rf.Runtime(engine=tiny_engine)
    pieces = [p async for p in runtime.async_generate("The quick", GREEDY)]
    assert len(pieces) > 1
    assert "".join(pieces) == tiny_engine.generate("The quick", GREEDY)["text"]
