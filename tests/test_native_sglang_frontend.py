"""SGLang's real frontend (`sglang.lang`, its `RuntimeEndpoint`) against a radixflow server on a
tiny model: gen with stop / stop_regex, select (all three choice methods), streaming.

The wheel is imported without its GPU stack through tests/peer/conftest.py's stand-ins; the test
skips when the wheel is absent.
"""

from __future__ import annotations

import re

import httpx
import pytest
from peer.conftest import programs_on_sglang
from server_harness import start_server
from tiny_models import make_tiny_model_dir

import radixflow as rf

PROMPT = "The quick brown fox"
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("sglang-frontend"), "llama", seed=0)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=2048)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture
def sgl(server):
    with programs_on_sglang() as (_, sgl):
        sgl.set_default_backend(sgl.RuntimeEndpoint(server.url))
        yield sgl


def _reference(server, **params) -> str:
    body = {"text": PROMPT, "sampling_params": {**GREEDY, **params}}
    return httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["text"]


def test_gen_with_stop_and_stop_regex(sgl, server):
    ref = _reference(server)
    stop = ref[8:10]

    @sgl.function
    def with_stop(s):
        s += PROMPT + sgl.gen("out", max_tokens=24, temperature=0, ignore_eos=True, stop=stop)

    assert with_stop.run()["out"] == ref[: ref.index(stop)]

    pattern = re.escape(ref[5]) + r"[\s\S]" + re.escape(ref[7])
    first = re.search(pattern, ref)

    @sgl.function
    def with_regex(s):
        s += PROMPT + sgl.gen(
            "out", max_tokens=24, temperature=0, ignore_eos=True, stop_regex=pattern
        )

    state = with_regex.run()
    assert state["out"] == ref[: first.start()]
    assert state.get_meta_info("out")["finish_reason"] == {"type": "stop", "matched": pattern}


@pytest.mark.parametrize(
    "method", ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood"]
)
def test_select(sgl, method):
    choices = ["Paris", "Berlin", "the lazy dog"]
    choices_method = {
        "token_length_normalized": sgl.token_length_normalized,
        "greedy_token_selection": sgl.greedy_token_selection,
        "unconditional_likelihood": sgl.unconditional_likelihood_normalized,
    }[method]

    @sgl.function
    def pick(s):
        s += "Q: What is the capital of France? A: " + sgl.select(
            "city", choices=choices, choices_method=choices_method
        )

    state = pick.run()
    assert state["city"] in choices
    meta = state.get_meta_info("city")
    assert len(meta["input_token_logprobs"]) == len(choices)
    if method == "unconditional_likelihood":
        for inputs, unconditional in zip(
            meta["input_token_logprobs"], meta["unconditional_token_logprobs"], strict=True
        ):
            # SGLang subtracts these element-wise: one unconditional entry per scored token.
            assert len(unconditional) == len(inputs)
            assert [t[1] for t in unconditional] == [t[1] for t in inputs]
    if method == "token_length_normalized":
        best = max(range(len(choices)), key=lambda i: meta["normalized_prompt_logprobs"][i])
        assert state["city"] == choices[best]


def test_streaming(sgl, server):
    ref = _reference(server)

    @sgl.function
    def story(s):
        s += PROMPT + sgl.gen("out", max_tokens=24, temperature=0, ignore_eos=True)

    state = story.run(stream=True)
    pieces = list(state.text_iter("out"))
    assert len(pieces) > 1
    assert "".join(pieces) == ref
    assert state["out"] == ref
