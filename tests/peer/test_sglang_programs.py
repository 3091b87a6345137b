"""SGLang's own test programs (`sglang/test/test_programs.py`, SGLang 0.5.23's wheel) run
unchanged two ways, on a tiny seeded random model (tests/tiny_models.py):

- in process, with `import sglang as sgl` bound to radixflow and `rf.Runtime` as the backend;
- with SGLang's real frontend and its real `RuntimeEndpoint` against a radixflow server.

Every program whose assertion does not depend on what the model answers passes both ways.
Functions with a `check_answer` argument run with `check_answer=False` (as SGLang's own
backend tests call them); with True they belong to the list below.

Answer-dependent (a random tiny model cannot pass them; they run only on a real model):
- test_few_shot_qa: asserts the answers are Washington, Tokyo, London, Beijing.
- test_decode_int: asserts 24 hours in a day and 365 days in a year.
- test_decode_json_regex, test_decode_json: json.loads the output, but SGLang's own regexes
  let a model write what JSON forbids (REGEX_STR's `\\s` allows raw newlines and tabs inside
  a string, REGEX_INT allows `+1` and leading zeros such as `07`).
- test_expert_answer (check_answer=True), test_parallel_encoding (check_answer=True): assert
  "paris" / "Noah" appear in the answer.
- test_tool_use: eval()s the model's arithmetic expression and checks the product.
- test_react: asserts the final answer names Finland or the United States (and needs the
  model to choose "Finish" within four steps to set `answer` at all).
- test_completion_speculative: needs a completion backend with `token_usage` (SGLang's or our
  `OpenAI(model, False)`, e.g. against `radixflow serve`'s /v1), and asserts that
  `num_api_spec_tokens` used fewer prompt tokens; that holds only when the speculated text
  follows the program's "\nBirthday:" / "\nJob:" layout, so it is sampled luck on a random
  model (API speculation itself: tests/test_frontend_dsl.py).

Excluded for another reason:
- test_image_qa: needs a vision model and an example_image.png; radixflow serves text-only
  models, so `sgl.image` fails with an error saying so (tested below).

Over HTTP, SGLang's RuntimeEndpoint sends `parallel encoding` joins to
`/concate_and_append_request`, a route SGLang's own server no longer has; the fixture turns that
path off (`support_concate_and_append = False`) so the join appends text, as SGLang does for
backends without it. test_stream_logprobs asserts that each chunk's meta info holds only that
chunk's output_token_logprobs: SGLang's server (and ours) sends that with
--incremental-streaming-output, and cumulative lists without it, so over HTTP that program runs
against a server started with the flag (in process, chunks always carry their own) through our
RuntimeEndpoint. Through SGLang's own interpreter it is timing-dependent, whatever the server:
SGLang's StreamExecutor keeps only the latest chunk's meta info per variable, so when two
chunks arrive before `text_async_iter` wakes (a loaded machine), the first chunk's logprobs
are lost and the program's assertion fails; it is not run that way here.
test_chat_completion_speculative only calls `.sync()`: SGLang's own
interpreter fails inside it over RuntimeEndpoint (which has no `is_chat_model`) and the test
still passes, in SGLang too; in process it runs to the end here (checked below).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import pytest
from peer.conftest import programs_on_radixflow, programs_on_sglang
from server_harness import start_server
from tiny_models import make_tiny_model_dir

import radixflow as rf

ANSWER_DEPENDENT = {
    "test_few_shot_qa",
    "test_decode_int",
    "test_decode_json_regex",
    "test_decode_json",
    "test_tool_use",
    "test_react",
    "test_completion_speculative",
}
NOT_APPLICABLE = {"test_image_qa"}
# answer-independent programs (check_answer=False where the function takes it)
PROGRAMS = [
    "test_mt_bench",
    "test_select",
    "test_expert_answer",
    "test_parallel_decoding",
    "test_parallel_encoding",
    "test_stream",
    "test_stream_logprobs",
    "test_regex",
    "test_dtype_gen",
    "test_chat_completion_speculative",
    "test_gen_min_new_tokens",
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # 4096 positions: test_react's few-shot prompt is longer than the default 512
    path = tmp_path_factory.mktemp("sglang-programs")
    return str(make_tiny_model_dir(path, "llama", seed=0, max_position_embeddings=4096))


@pytest.fixture(scope="module")
def engine(model_path):
    eng = rf.Engine(model_path, dtype="float32", max_total_tokens=8192)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def incremental_server(model_path):
    """A server started with --incremental-streaming-output (see the module docstring)."""
    eng = rf.Engine(model_path, dtype="float32", incremental_streaming_output=True)
    running = start_server(eng)
    yield running
    running.stop()
    eng.shutdown()


@pytest.fixture
def radixflow_programs(engine):
    saved = rf.get_default_backend()
    with programs_on_radixflow() as programs:
        rf.set_default_backend(rf.Runtime(engine=engine))
        yield programs
    rf.global_config.default_backend = saved


@contextmanager
def _on_sglang(url: str):
    with programs_on_sglang() as (programs, sgl):
        endpoint = sgl.RuntimeEndpoint(url)
        endpoint.support_concate_and_append = False  # see the module docstring
        # test_gen_min_new_tokens reads `default_backend.endpoint` (SGLang's Runtime has one)
        endpoint.endpoint = endpoint
        sgl.set_default_backend(endpoint)
        yield programs


@pytest.fixture
def sglang_programs(server):
    with _on_sglang(server.url) as programs:
        yield programs


def _run(programs, name: str) -> None:
    func = getattr(programs, name)
    kwargs = {"check_answer": False} if "check_answer" in inspect.signature(func).parameters else {}
    func(**kwargs)


def test_the_lists_cover_every_program(radixflow_programs):
    names = {n for n in vars(radixflow_programs) if n.startswith("test_")}
    assert names == set(PROGRAMS) | ANSWER_DEPENDENT | NOT_APPLICABLE


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_in_process(radixflow_programs, name):
    _run(radixflow_programs, name)


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p != "test_stream_logprobs"])
def test_program_through_sglang_runtime_endpoint(sglang_programs, name):
    _run(sglang_programs, name)


@pytest.mark.parametrize("name", ["test_stream", "test_stream_logprobs"])
def test_stream_programs_through_our_endpoint_on_an_incremental_server(incremental_server, name):
    """Our RuntimeEndpoint reads the server's streaming mode: every chunk's text is its own."""
    saved = rf.get_default_backend()
    with programs_on_radixflow() as programs:
        rf.set_default_backend(rf.RuntimeEndpoint(incremental_server.url))
        try:
            _run(programs, name)
        finally:
            rf.global_config.default_backend = saved


def test_chat_speculative_program_runs_to_the_end_in_process(radixflow_programs):
    @rf.function(num_api_spec_tokens=256)
    def probe(s):  # the first half of test_chat_completion_speculative's program
        s += rf.system("You are a helpful assistant.")
        s += rf.user("Please generate new Name, Birthday and Job.\n")
        s += rf.assistant("Name:" + rf.gen("name", stop="\n", max_tokens=8))

    state = probe.run()
    assert state.error() is None and isinstance(state["name"], str)


def test_image_program_fails_clearly_on_a_text_only_model(radixflow_programs):
    with pytest.raises(rf.ProgramError, match="text-only"):
        radixflow_programs.test_image_qa()
