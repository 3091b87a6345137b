"""An SGLang-style program driven over HTTP by radixflow's `RuntimeEndpoint` backend.

SGLang's own frontend client is not used: `import sglang` pulls in its server stack (orjson,
msgspec, pybase64, aiohttp, pillow, zmq, ...), more than a few light packages.
"""

from __future__ import annotations

import re

import pytest

import radixflow as rf

pytestmark = pytest.mark.slow
pytest_plugins = ["server_harness"]  # fixtures: engine, server


@rf.function
def quiz(s, question):
    s += "Answer with one word.\n"
    s += "Question: " + question + "\nAnswer:"
    s += rf.gen("answer", max_tokens=4, stop="\n", temperature=0)
    s += "\nIs that right? "
    s += rf.select("verdict", choices=["yes", "no"])
    s += "\nYear of the answer: "
    s += rf.gen("year", max_tokens=6, regex=r"(1[0-9]|20)[0-9]{2}")


def test_program_over_runtime_endpoint(server, engine):
    backend = rf.RuntimeEndpoint(server.url)
    state = quiz.run(question="What is the capital of France?", backend=backend)
    prompt = "Answer with one word.\nQuestion: What is the capital of France?\nAnswer:"
    ref = engine.generate(prompt, {"max_new_tokens": 4, "stop": "\n", "temperature": 0})
    assert state["answer"] == ref["text"]
    assert state["verdict"] in ("yes", "no")
    assert re.fullmatch(r"(1[0-9]|20)[0-9]{2}", state["year"])
    assert state.get_meta_info("answer")["prompt_tokens"] == len(engine.tokenizer.encode(prompt))
