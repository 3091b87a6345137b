"""Chat templates and streaming across the frontend's backends, on tiny random models.

- `chat_template_kwargs` (Qwen3's `enable_thinking=False`) reach the DSL's role rendering in
  `Runtime` and `RuntimeEndpoint`: the text before a `gen` is transformers' own
  `apply_chat_template(..., enable_thinking=False)` (the real Qwen3 tokenizer from
  ../shared/tokenizers; skipped where absent).
- `RuntimeEndpoint` follows the server's effective template (its `chat_template` override),
  not the template saved with the model; an explicit `chat_template_name` still wins (SGLang).
- `RuntimeEndpoint` against a server run with `--incremental-streaming-output`.
- `radixflow run --chat` renders as the chat route does (override and template kwargs).
"""

from __future__ import annotations

import copy

import httpx
import pytest
import transformers
from server_harness import start_server
from test_templates_roles import tiny_model_with_tokenizer
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime import cli
from radixflow.runtime.chat_templates import BUILTIN_TEMPLATES
from radixflow.runtime.engine import Engine

NO_THINKING = {"enable_thinking": False}
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@rf.function
def ask(s, question):
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=3, temperature=0))


def _chat_prefix(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


# -- enable_thinking=False on Qwen3's template ---------------------------------------------
@pytest.fixture(scope="module")
def qwen3_engine(tmp_path_factory):
    path = tiny_model_with_tokenizer(tmp_path_factory.mktemp("qwen3-tok"), "qwen3")
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=1024)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def qwen3_url(qwen3_engine):
    running = start_server(qwen3_engine)
    yield running.url
    running.stop()


@pytest.mark.parametrize("kind", ["runtime", "endpoint"])
def test_chat_template_kwargs_turn_thinking_off(qwen3_engine, qwen3_url, kind):
    tok = copy.deepcopy(qwen3_engine.tokenizer)
    question = [{"role": "user", "content": "What is 2+2?"}]
    thinking_off = _chat_prefix(tok, question, **NO_THINKING)
    assert thinking_off != _chat_prefix(tok, question)  # the kwarg changes this template

    def backend(**kwargs):
        if kind == "runtime":
            return rf.Runtime(engine=qwen3_engine, **kwargs)
        return rf.RuntimeEndpoint(qwen3_url, **kwargs)

    for kwargs, expected in ((NO_THINKING, thinking_off), ({}, _chat_prefix(tok, question))):
        state = ask.run("What is 2+2?", backend=backend(chat_template_kwargs=kwargs))
        assert state.error() is None
        assert state.text().startswith(expected + state["answer"])
        ref = qwen3_engine.generate(
            input_ids=tok.encode(expected, add_special_tokens=False),
            sampling_params={"max_new_tokens": 3, "temperature": 0},
        )
        assert state["answer"] == ref["text"]


def test_bad_chat_template_kwargs_are_refused_by_name(qwen3_engine, qwen3_url):
    for backend in (rf.Runtime, rf.RuntimeEndpoint):
        target = {"engine": qwen3_engine} if backend is rf.Runtime else {"base_url": qwen3_url}
        with pytest.raises(ValueError, match="chat_template_kwargs may not set 'tools'"):
            backend(**target, chat_template_kwargs={"tools": []})
        with pytest.raises(ValueError, match="chat_template_kwargs must be a dict"):
            backend(**target, chat_template_kwargs=["enable_thinking"])


# -- the server's --chat-template override reaches RuntimeEndpoint -------------------------
@pytest.fixture(scope="module")
def chatml_model_dir(tmp_path_factory):
    """A tiny model whose saved tokenizer carries the chatml template."""
    path = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-chatml"), "llama", seed=2)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gemma_override_server(chatml_model_dir):
    eng = rf.Engine(str(chatml_model_dir), chat_template="gemma", dtype="float32")
    running = start_server(eng)
    yield running, eng
    running.stop()
    eng.shutdown()


def _with_template(path, name: str):
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.chat_template = BUILTIN_TEMPLATES[name]
    return tok


def test_endpoint_uses_the_servers_chat_template_override(chatml_model_dir, gemma_override_server):
    server, _ = gemma_override_server
    info = httpx.get(f"{server.url}/get_model_info").json()
    assert info["chat_template"] == BUILTIN_TEMPLATES["gemma"]
    state = ask.run("What is 2+2?", backend=rf.RuntimeEndpoint(server.url))
    gemma = _with_template(chatml_model_dir, "gemma")
    prefix = _chat_prefix(gemma, state.messages()[:1])
    assert state.text().startswith(prefix + state["answer"])
    # the same prompt as the server's own chat route renders for those messages
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "m", "messages": state.messages()[:1], "max_tokens": 1},
    ).json()
    assert state.get_meta_info("answer")["prompt_tokens"] == chat["usage"]["prompt_tokens"]


def test_endpoint_chat_template_name_wins_over_the_servers(chatml_model_dir, gemma_override_server):
    server, _ = gemma_override_server
    state = ask.run("What is 2+2?", backend=rf.RuntimeEndpoint(server.url, None, None, "llama-3"))
    llama3 = _with_template(chatml_model_dir, "llama-3")
    assert state.text().startswith(_chat_prefix(llama3, state.messages()[:1]) + state["answer"])


# -- --incremental-streaming-output --------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-stream"), "llama", seed=1)


@pytest.fixture(scope="module", params=[False, True], ids=["cumulative", "incremental"])
def stream_server(tiny_dir, request):
    eng = rf.Engine(
        str(tiny_dir),
        dtype="float32",
        max_total_tokens=1024,
        incremental_streaming_output=request.param,
    )
    running = start_server(eng)
    yield running, eng
    running.stop()
    eng.shutdown()


@rf.function
def continue_text(s):
    s += "The quick brown" + rf.gen(
        "out", max_tokens=10, temperature=0, ignore_eos=True, return_logprob=True
    )
    s += " and then" + rf.gen("more", max_tokens=4, temperature=0, ignore_eos=True)


def test_endpoint_streams_right_text_in_either_streaming_mode(stream_server):
    server, eng = stream_server
    state = continue_text.run(stream=True, backend=rf.RuntimeEndpoint(server.url))
    chunks = list(state.text_iter("out"))
    ref = eng.generate("The quick brown", {**GREEDY, "max_new_tokens": 10}, return_logprob=True)
    assert len(chunks) > 1 and "".join(chunks) == ref["text"] == state["out"]
    ids = [t for _, t, *_ in state.get_meta_info("out")["output_token_logprobs"]]
    assert ids == ref["output_ids"]
    more = eng.generate(
        "The quick brown" + ref["text"] + " and then", {**GREEDY, "max_new_tokens": 4}
    )
    assert state["more"] == more["text"]
    assert state.text() == "The quick brown" + ref["text"] + " and then" + more["text"]


# -- radixflow run --chat ------------------------------------------------------------------
def _run_cli(monkeypatch, capsys, argv):
    """`radixflow run` with the engine's prompt ids recorded; (rc, ids, stdout, stderr)."""
    seen: list[list[int]] = []
    real = Engine.generate

    def spy(self, *args, **kwargs):
        seen.append(list(kwargs["input_ids"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    rc = cli.main(["run", *argv, "--dtype", "float32", "--max-total-tokens", "512"])
    out = capsys.readouterr()
    return rc, seen, out.out, out.err


def test_cli_run_chat_uses_the_override(monkeypatch, capsys, chatml_model_dir):
    args = ["Hello there", "--chat", "--model-path", str(chatml_model_dir), "--max-new-tokens", "5"]
    for override, template in ((None, "chatml"), ("gemma", "gemma")):
        argv = args + (["--chat-template", override] if override else [])
        rc, seen, out, _ = _run_cli(monkeypatch, capsys, argv)
        tok = _with_template(chatml_model_dir, template)
        expected = tok.apply_chat_template(
            [{"role": "user", "content": "Hello there"}], add_generation_prompt=True, tokenize=False
        )
        assert rc == 0 and seen == [tok.encode(expected, add_special_tokens=False)]
        with Engine(str(chatml_model_dir), dtype="float32", max_total_tokens=512) as eng:
            ref = eng.generate(
                input_ids=seen[0], sampling_params={"max_new_tokens": 5, "temperature": 0}
            )
        assert out == ref["text"]  # the streamed answer (the summary line goes to stderr)


def test_cli_run_chat_template_kwargs(monkeypatch, capsys, qwen3_engine):
    path = str(qwen3_engine.model_dir)
    argv = ["Hi", "--chat", "--model-path", path, "--max-new-tokens", "2"]
    rc, seen, _, _ = _run_cli(
        monkeypatch, capsys, argv + ["--chat-template-kwargs", '{"enable_thinking": false}']
    )
    tok = qwen3_engine.tokenizer
    expected = _chat_prefix(tok, [{"role": "user", "content": "Hi"}], **NO_THINKING)
    assert rc == 0 and seen == [tok.encode(expected, add_special_tokens=False)]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--chat-template-kwargs", '{"enable_thinking": false}'], "needs --chat"),
        (["--chat", "--chat-template-kwargs", '{"tools": []}'], "may not set 'tools'"),
    ],
)
def test_cli_run_refuses_bad_template_kwargs(monkeypatch, capsys, tiny_dir, extra, message):
    rc, seen, _, err = _run_cli(monkeypatch, capsys, ["Hi", "--model-path", str(tiny_dir), *extra])
    assert rc == 2 and seen == [] and message in err


def test_cli_run_template_kwargs_must_be_a_json_object(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "Hi", "--chat", "--chat-template-kwargs", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


# -- num_api_spec_tokens on a chat model, through the openai client --------------------------
def test_chat_model_speculation_through_the_openai_client(gemma_override_server):
    import openai

    server, _ = gemma_override_server
    backend = rf.OpenAI("m", base_url=server.url + "/v1", api_key="unused")

    @rf.function(num_api_spec_tokens=6)
    def prog(s):
        s += rf.user("Hi")
        s += rf.assistant(rf.gen("a", stop="\n", temperature=0))

    state = prog.run(backend=backend)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    ref = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0
    )
    # one request of num_api_spec_tokens tokens; the stop string cuts the value here
    assert state["a"] == ref.choices[0].message.content.split("\n")[0]
    assert backend.token_usage.completion_tokens == ref.usage.completion_tokens
    assert backend.token_usage.prompt_tokens == ref.usage.prompt_tokens
