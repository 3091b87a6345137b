"""The DSL's interpreter on a scripted backend (no model): state, roles, forks, errors, tracing."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

import radixflow as rf
from radixflow.frontend.backend import Backend, Prompt, RequestError
from radixflow.frontend.chat_template import PLAIN_TEMPLATE, ChatTemplate
from radixflow.frontend.choices import ChoicesSamplingMethod, call_method
from radixflow.frontend.ir import REGEX_INT, GenArgs


class ScriptedBackend(Backend):
    """gen answers `reply(prompt, args)`; select scores a choice by -len (shortest wins)."""

    def __init__(self, reply=None, template: ChatTemplate = PLAIN_TEMPLATE) -> None:
        self.chat_template = template
        self.reply = reply or (lambda prompt, args: f"<{len(prompt.text)}>")
        self.calls: list[tuple[str, GenArgs]] = []
        self.cached: list[str] = []
        self.lock = threading.Lock()

    def generate(self, prompt: Prompt, args: GenArgs):
        with self.lock:
            self.calls.append((prompt.text, args))
        if args.temperature is not None and args.temperature < 0:
            raise RequestError("temperature must be >= 0")
        text = self.reply(prompt, args)
        if args.n and args.n > 1:
            return [text] * args.n, {"n": args.n}
        return text, {"prompt_tokens": len(prompt.text), "args": args}

    def generate_stream(self, prompt: Prompt, args: GenArgs):
        text, meta = self.generate(prompt, args)
        for ch in text:
            yield ch, None
        yield "", meta

    def select(self, prompt, choices, temperature, method: ChoicesSamplingMethod):
        scored = [[(-float(len(c)), i, c)] for i, c in enumerate(choices)]
        return call_method(method, choices, scored, scored)

    def pin_prefix(self, text: str) -> None:
        self.cached.append(text)

    def flush_cache(self) -> None:
        self.cached.clear()

    def get_server_info(self):
        return {"calls": len(self.calls)}

    def shutdown(self) -> None:
        pass


@pytest.fixture
def backend():
    b = ScriptedBackend()
    rf.set_default_backend(b)
    return b


def test_gen_appends_and_stores(backend):
    @rf.function
    def prog(s, x):
        s += "Q: " + x + "\nA:" + rf.gen("a", max_tokens=5, stop="\n")
        s += " then" + rf.gen("b")

    state = prog.run("hi", temperature=0.5)
    assert state["a"] == "<8>"
    assert state.text() == "Q: hi\nA:<8> then<16>"
    assert state["b"] == "<16>"
    args = backend.calls[0][1]
    # gen's own knobs win; unset ones come from run()
    assert (args.max_new_tokens, args.stop, args.temperature) == (5, "\n", 0.5)
    assert backend.calls[1][1].max_new_tokens == 128
    assert state.get_meta_info("a")["prompt_tokens"] == 8


def test_sampling_params_mapping():
    args = rf.gen("x", max_tokens=3, min_tokens=1, top_k=5, dtype=int).args
    assert args.sampling_params() == {
        "max_new_tokens": 3,
        "min_new_tokens": 1,
        "top_k": 5,
        "regex": REGEX_INT,
        "stop": [" ", "\n"],  # as SGLang: an int ends at a space or newline
    }
    assert rf.gen_string("s").args.sampling_params()["regex"].startswith('\\"')
    assert rf.gen("j", json_schema={"type": "object"}).args.sampling_params()["json_schema"] == {
        "type": "object"
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"regex": "(unclosed"}, "not a valid regex"),
        ({"dtype": int, "regex": "[0-9]+"}, "either dtype"),
        ({"regex": "a", "json_schema": "{}"}, "at most one constraint"),
        ({"dtype": list}, "dtype must be"),
    ],
)
def test_gen_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rf.gen("x", **kwargs)


def test_select_and_choices(backend):
    @rf.function
    def prog(s):
        s += "Pick: " + rf.select("c", ["long one", "b", "mid"])
        s += " " + rf.gen("d", choices=["xx", "y"])

    state = prog.run()
    assert (state["c"], state["d"]) == ("b", "y")
    assert state.text() == "Pick: b y"
    assert state.get_meta_info("c")["normalized_prompt_logprobs"] == [-8.0, -1.0, -3.0]
    with pytest.raises(ValueError, match="non-empty"):
        rf.select("x", [])


def test_choice_methods_match_their_definitions():
    choices = ["a", "b", "c"]
    scored = [
        [(-1.0, 1, None), (-3.0, 2, None)],  # mean -2.0
        [(-0.5, 3, None)],  # mean -0.5
        [(-1.0, 4, None), (-0.1, 5, None), (-0.1, 6, None)],  # mean -0.4
    ]
    lengths = call_method(rf.token_length_normalized, choices, scored)
    assert lengths.decision == "c"
    # greedy: position 0 best is b (-0.5); it is alone, so b wins
    greedy = call_method(rf.greedy_token_selection, choices, scored)
    assert greedy.decision == "b"
    # a tie at position 0 goes on to position 1 (b padded with its mean)
    tie = [
        [(-1.0, 1, None), (-2.0, 2, None)],
        [(-1.0, 3, None)],
        [(-1.0, 4, None), (-1.5, 5, None)],
    ]
    assert call_method(rf.greedy_token_selection, choices, tie).decision == "b"
    uncond = [
        [(None, 1, None), (-0.5, 2, None)],  # diff mean: (-1 - 0 + -3 + 0.5) / 2 = -1.75
        [(None, 3, None)],  # diff -0.5
        [(None, 4, None), (-3.0, 5, None), (-3.0, 6, None)],  # (-1 + 2.9 + 2.9) / 3 = 1.6
    ]
    decision = call_method(rf.unconditional_likelihood_normalized, choices, scored, uncond)
    assert decision.decision == "c"
    assert decision.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx(
        [-1.75, -0.5, 1.6]
    )


def test_roles_build_text_and_messages(backend):
    template = ChatTemplate(
        "t",
        {"system": ("<s>", "</s>"), "user": ("<u>", "</u>"), "assistant": ("<a>", "</a>")},
        first_prefix={"user": "<s>default</s><u>"},
    )
    backend.chat_template = template

    @rf.function
    def chat(s):
        s += rf.user("hi")
        s += rf.assistant(rf.gen("r1"))
        with s.user():
            s += "more"
        s += rf.assistant_begin() + rf.gen("r2") + rf.assistant_end()

    state = chat.run()
    assert state.text() == "<s>default</s><u>hi</u><a><26></a><u>more</u><a><48></a>"
    assert state.messages() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<26>"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "<48>"},
    ]


def test_chat_template_matches_apply_chat_template():
    transformers = pytest.importorskip("transformers")
    from radixflow.frontend.chat_template import chat_template_from_tokenizer
    from radixflow.runtime.model_loader import resolve_model_dir

    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_dir(None))
    template = chat_template_from_tokenizer(tok)
    b = ScriptedBackend(template=template)

    @rf.function
    def chat(s, with_system):
        if with_system:
            s += rf.system("Be brief.")
        s += rf.user("Hello")
        s += rf.assistant(rf.gen("a"))
        s += rf.user("Bye")

    for with_system in (True, False):
        state = chat.run(with_system, backend=b)
        assert state.text() == tok.apply_chat_template(state.messages(), tokenize=False)
    gen_prompt = tok.apply_chat_template(
        state.messages(), tokenize=False, add_generation_prompt=True
    )
    assert gen_prompt == state.text() + template.role_prefix_and_suffix["assistant"][0]


def test_fork_gather_and_concat(backend):
    @rf.function
    def prog(s):
        s += "root:"
        forks = s.fork(3)
        forks += lambda i: f"[{i}]" + rf.gen("g")
        forks.join()
        s += "|"
        forks = s.fork(2)
        forks += rf.gen("h")
        forks.join(mode="concate_and_append")

    state = prog.run()
    assert state["g"] == ["<8>", "<8>", "<8>"]
    assert state.text() == "root:|<6><6>"
    assert backend.cached == ["root:", "root:|"]  # each fork's prefix computed once


def test_forks_run_concurrently():
    barrier = threading.Barrier(3, timeout=5)

    def reply(prompt, args):
        barrier.wait()  # deadlocks (and times out) unless all three calls are in flight at once
        return "ok"

    b = ScriptedBackend(reply)

    @rf.function
    def prog(s):
        forks = s.fork(3)
        forks += rf.gen("x")
        forks.join()

    assert prog.run(backend=b)["x"] == ["ok"] * 3


def test_var_scope_bind_and_set_var(backend):
    @rf.function
    def prog(s, a, b="B"):
        with s.var_scope("scoped"):
            s += a + b + rf.gen("x")
        s["manual"] = 42

    state = prog.bind(b="b").run("a")
    assert state["scoped"] == "ab<2>"
    assert state["manual"] == 42 and "manual" in state
    with pytest.raises(ValueError, match="no argument"):
        prog.bind(c=1)


def test_n_samples_store_a_list(backend):
    @rf.function
    def prog(s):
        s += "x" + rf.gen("many", n=3)

    state = prog.run()
    assert state["many"] == ["<1>"] * 3 and state.text() == "x<1>"


def test_stream_increments_concatenate(backend):
    @rf.function
    def prog(s):
        s += "Q" + rf.gen("a") + "R" + rf.gen("b")

    state = prog.run(stream=True)
    chunks = list(state.text_iter())
    assert len(chunks) > 4 and "".join(chunks) == state.text()
    state = prog.run(stream=True)
    assert "".join(state.text_iter("b")) == state["b"] == "<5>"


async def test_async_iteration(backend):
    @rf.function
    def prog(s):
        s += "Q" + rf.gen("a")

    state = prog.run(stream=True)
    chunks = [c async for c in state.text_async_iter("a")]
    assert "".join(chunks) == "<1>"
    state = prog.run(stream=True)
    assert "".join([c async for c in state]) == "Q<1>"


def test_program_exception_names_its_line(backend):
    @rf.function
    def prog(s):
        s += "x" + rf.gen("a")
        if s["a"]:
            raise KeyError("boom")  # the failing line

    with pytest.raises(rf.ProgramError, match="the failing line") as info:
        prog.run()
    assert isinstance(info.value.__cause__, KeyError)
    assert "test_frontend_dsl.py" in str(info.value)


def test_failed_request_surfaces_and_skips_the_rest(backend):
    @rf.function
    def prog(s):
        s += rf.gen("a", temperature=-1)  # rejected by the backend
        s += rf.gen("b")

    with pytest.raises(rf.ProgramError, match="temperature must be") as info:
        prog.run()
    assert 'rf.gen("a", temperature=-1)' in str(info.value)
    assert len(backend.calls) == 1  # b never ran


def test_run_batch_keeps_order_and_isolates_failures(backend):
    @rf.function
    def prog(s, i):
        if i == 2:
            raise ValueError("bad input")
        s += "n" * i + rf.gen("x")

    states = prog.run_batch([{"i": i} for i in range(5)], progress_bar=False)
    assert [s.error() is None for s in states] == [True, True, False, True, True]
    assert [states[i]["x"] for i in (0, 1, 3, 4)] == ["<0>", "<1>", "<3>", "<4>"]
    assert "bad input" in str(states[2].error())
    gen_states = list(prog.run_batch([{"i": 1}, {"i": 3}], generator_style=True))
    assert [s["x"] for s in gen_states] == ["<1>", "<3>"]


def test_a_failing_state_does_not_hang_others(backend):
    slow = ScriptedBackend(lambda p, a: time.sleep(0.05) or "ok")

    @rf.function
    def prog(s, fail):
        s += rf.gen("a", temperature=-1 if fail else 0)
        s += rf.gen("b")

    states = prog.run_batch([{"fail": f} for f in (True, False, True, False)], backend=slow)
    assert [s.error() is not None for s in states] == [True, False, True, False]
    assert states[1]["b"] == "ok"
    with pytest.raises(rf.ProgramError):
        states[0]["b"]


def test_trace_finds_the_constant_prefix(backend):
    @rf.function
    def prog(s, question):
        s += rf.system("Answer briefly.")
        s += "Examples: 1+1=2.\n"
        s += rf.user("Q: " + question)
        s += rf.assistant(rf.gen("answer"))
        if s["answer"].startswith("4"):
            s += "done"

    trace = prog.trace()
    kinds = [n.kind for n in trace.nodes]
    assert kinds[:5] == ["role_begin", "text", "role_end", "text", "role_begin"]
    assert "arg" in kinds and "gen" in kinds
    assert trace.prefix == "System: Answer briefly.\n\nExamples: 1+1=2.\nUser: Q: "
    assert trace.stopped
    prog.run_batch([{"question": "a"}, {"question": "b"}])
    assert backend.cached[0] == trace.prefix


def test_no_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(rf.global_config, "default_backend", None)

    @rf.function
    def prog(s):
        s += "x"

    with pytest.raises(ValueError, match="set_default_backend"):
        prog.run()


def test_trace_uses_defaults_and_given_arguments(backend):
    @rf.function
    def prog(s, topic, style="briefly"):
        s += "Explain " + style + " " + topic + ":" + rf.gen("x")

    assert prog.trace().prefix == "Explain briefly "
    assert prog.trace(topic="tides").prefix == "Explain briefly tides:"
    assert prog.bind(style="slowly").trace().prefix == "Explain slowly "


# -- SGLang parity (reference: SGLang 0.5.23's frontend, loaded from the installed wheel) ------


@pytest.fixture
def sglang_frontend():
    """SGLang's real `sglang.lang` (skips when the wheel is absent)."""
    from peer.conftest import programs_on_sglang

    with programs_on_sglang() as (_, sgl):
        import sglang.lang.ir as sgl_ir

        yield sgl, sgl_ir


def test_choice_methods_match_sglang(sglang_frontend):
    sgl, _ = sglang_frontend
    rng = random.Random(0)
    for _ in range(20):
        choices = ["a", "bb", "ccc", "d"]
        scored = [
            [(round(-rng.random() * 3, 1), t, None) for t in range(rng.randint(1, 4))]
            for _ in choices
        ]
        uncond = [[(None, 0, None)] + [(-rng.random(), t, None) for t, *_ in s[1:]] for s in scored]
        for ours, theirs in (
            (rf.token_length_normalized, sgl.token_length_normalized),
            (rf.greedy_token_selection, sgl.greedy_token_selection),
            (rf.unconditional_likelihood_normalized, sgl.unconditional_likelihood_normalized),
        ):
            mine = call_method(ours, choices, scored, uncond)
            ref = theirs(
                choices=choices,
                normalized_prompt_logprobs=mine.meta_info["normalized_prompt_logprobs"],
                input_token_logprobs=scored,
                output_token_logprobs=[[] for _ in choices],
                unconditional_token_logprobs=uncond,
            )
            assert mine.decision == ref.decision
            assert mine.meta_info.keys() == ref.meta_info.keys()
            for key in ("greedy_logprob_matrix", "normalized_unconditional_prompt_logprobs"):
                if key in ref.meta_info:
                    assert np.allclose(mine.meta_info[key], ref.meta_info[key])


def test_custom_choice_method_gets_sglang_keywords(backend):
    class Longest(rf.ChoicesSamplingMethod):
        def __call__(
            self,
            *,
            choices,
            normalized_prompt_logprobs,
            input_token_logprobs,
            output_token_logprobs,
            unconditional_token_logprobs=None,
        ):
            assert len(normalized_prompt_logprobs) == len(output_token_logprobs) == len(choices)
            return rf.ChoicesDecision(max(choices, key=len), {"custom": True})

    @rf.function
    def prog(s):
        s += rf.select("x", ["a", "bbb", "cc"], choices_method=Longest())

    state = prog.run()
    assert state["x"] == "bbb" and state.get_meta_info("x") == {"custom": True}


def test_typed_gen_matches_sglang_stop_and_argument_order(sglang_frontend):
    sgl, sgl_ir = sglang_frontend
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    for dtype in (int, float, str, bool):
        ref = sgl_ir.SglSamplingParams(stop=["END"], dtype=dtype)
        RuntimeEndpoint._handle_dtype_to_regex(None, ref)
        mine = rf.gen("x", stop=["END"], dtype=dtype).args.sampling_params()
        assert (mine["regex"], mine["stop"]) == (ref.regex, ref.stop)
    # positional order: gen_int(name, max_tokens, n, stop, ...), gen(name, max_tokens, min_tokens, ...)
    assert rf.gen_int("x", 7, None, ["\n"]).args.max_new_tokens == 7
    assert (
        rf.gen_int("x", 7, None, ["\n"]).args.stop
        == sgl.gen_int("x", 7, None, ["\n"]).sampling_params.stop
    )
    ref = sgl.gen("x", 5, 2, None, None, None, "a+").sampling_params
    mine = rf.gen("x", 5, 2, None, None, None, "a+").args
    assert (mine.max_new_tokens, mine.min_new_tokens, mine.stop_regex) == (
        ref.max_new_tokens,
        ref.min_new_tokens,
        ref.stop_regex,
    )


def test_global_config_is_the_default_backend(backend):
    assert rf.global_config.default_backend is backend is rf.get_default_backend()


def test_fork_items_take_appends_and_lists(backend):
    @rf.function
    def prog(s):
        forks = s.fork(3)
        for i in range(3):
            forks[i] += f"[{i}]"
        forks += ["a", "b", "c"]
        forks += lambda i: str(i * 10)
        forks.join("concate_and_append")

    assert prog.run().text() == "[0]a0[1]b10[2]c20"

    @rf.function
    def bad(s):
        forks = s.fork(2)
        forks += ["only one"]

    with pytest.raises(rf.ProgramError, match="one item per branch"):
        bad.run()

    @rf.function
    def replace(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(rf.ProgramError, match="cannot be replaced"):
        replace.run()


def test_copy_and_fork_position_ids_offset(backend):
    @rf.function
    def prog(s):
        s += "x"
        with s.copy() as c:
            c += rf.gen("inner")
        s += "y"

    state = prog.run()
    assert state["inner"] == ["<1>"] and state.text() == "xy"

    @rf.function
    def offsets(s, offset):
        s.fork(2, position_ids_offset=offset).join()

    offsets.run([0, 5])
    with pytest.raises(rf.ProgramError, match="one int per branch"):
        offsets.run([0])


class StreamingMetaBackend(ScriptedBackend):
    """Streams one character per chunk, each with its token's logprob, as SGLang's server does;
    the first chunk carries a token and no text."""

    def generate_stream(self, prompt, args):
        text, _ = self.generate(prompt, args)
        pieces = ["", *text]
        for i, piece in enumerate(pieces):
            meta = {
                "completion_tokens": i + 1,
                "output_token_logprobs_length": i + 1,
                "output_token_logprobs": [(-float(i), i, None)],
            }
            yield piece, meta


async def test_text_async_iter_meta_chunks_like_sglang():
    rf.set_default_backend(StreamingMetaBackend())

    @rf.function
    def prog(s):
        s += "Q" + rf.gen("a", return_logprob=True)

    state = prog.run(stream=True)
    chunks = [c async for c in state.text_async_iter("a", return_meta_data=True)]
    assert [text for text, _ in chunks] == list("<1>")
    # the text-less first chunk's token is merged into the next chunk, as SGLang does
    assert [len(meta["output_token_logprobs"]) for _, meta in chunks] == [2, 1, 1]
    assert [meta["completion_tokens"] for _, meta in chunks] == [2, 3, 4]
    assert len(state.get_meta_info("a")["output_token_logprobs"]) == 4
    state = prog.run(stream=True)
    assert [c async for c in state.text_async_iter("a")] == list("<1>")


def test_image_and_video_fail_clearly(backend):
    @rf.function
    def prog(s):
        s += rf.user(rf.image("cat.png") + "What is this?")

    with pytest.raises(rf.ProgramError, match="image.*text-only"):
        prog.run()
    with pytest.raises(ValueError, match="path"):
        rf.video(3, 4)


def test_run_defaults_stop_regex_n_and_use_thread(backend):
    threads = []

    def reply(prompt, args):
        threads.append(threading.current_thread())
        return "r"

    backend.reply = reply

    @rf.function
    def prog(s):
        s += "x" + rf.gen("a") + rf.gen("b", stop_regex=r"\d")

    prog.run(stop_regex="[.]", n=1, use_thread=False)
    assert threads == [threading.current_thread()] * 2
    assert backend.calls[0][1].sampling_params()["stop_regex"] == "[.]"
    assert backend.calls[1][1].sampling_params()["stop_regex"] == r"\d"
    prog.run()
    assert threads[-1] is not threading.current_thread()


def test_run_batch_takes_positional_lists(backend):
    @rf.function
    def prog(s, a, b="B"):
        s += a + b

    states = prog.run_batch([["1"], ("2", "3"), {"a": "4"}])
    assert [st.text() for st in states] == ["1B", "23", "4B"]
    with pytest.raises(ValueError, match="1 to 2 positional"):
        prog.run_batch([["1", "2", "3"]])
    assert prog.run_batch([]) == []


def test_messages_content_is_left_stripped(backend):
    @rf.function
    def prog(s):
        s += rf.user("  hi ")
        s += rf.assistant("\n" + rf.gen("a"))

    assert [m["content"] for m in prog.run().messages()] == ["hi ", "<25>"]


def test_separate_reasoning_splits_think(backend):
    backend.reply = lambda prompt, args: "<think>plan it</think>The answer."

    @rf.function
    def prog(s):
        s += rf.user("q")
        s += rf.assistant(rf.separate_reasoning(rf.gen("a"), model_type="qwen3"))

    state = prog.run()
    assert state["a"] == "The answer."
    assert state["a_reasoning_content"] == "plan it"
    assert state.messages()[-1]["content"] == "The answer."
    assert "think" not in state.text()
    with pytest.raises(ValueError, match="model_type"):
        rf.separate_reasoning(rf.gen("a"))


def test_trace_last_node_and_cache(backend):
    @rf.function
    def prog(s, q):
        s += "A long constant instruction that every run of this program shares. " * 2
        s += q + rf.gen("a")

    trace = prog.trace()
    assert trace.last_node.kind == "gen"
    assert trace.last_node.prev_node.kind == "arg"
    prog.cache()
    assert backend.cached == [trace.prefix]

    @rf.function
    def short(s, q):
        s += "short" + q

    short.cache()  # 64 characters or fewer: not worth a request, as SGLang
    assert backend.cached == [trace.prefix]


def test_api_speculative_execution_uses_one_request(backend):
    backend.reply = lambda prompt, args: " Ada\nBirthday: 1815\nJob: mathematician\nmore"

    @rf.function(num_api_spec_tokens=64)
    def character(s):
        s += "Name:" + rf.gen("name", stop="\n") + "\nBirthday:" + rf.gen("birthday", stop="\n")
        s += "\nJob:" + rf.gen("job", stop="\n") + "\n"

    state = character.run()
    assert len(backend.calls) == 1  # one request: the rest came from the speculated text
    assert backend.calls[0][1].max_new_tokens == 128 and backend.calls[0][1].stop is None
    assert (state["name"], state["birthday"], state["job"]) == (" Ada", " 1815", " mathematician")
    assert state.text() == "Name: Ada\nBirthday: 1815\nJob: mathematician\n"

    backend.reply = lambda prompt, args: " Bob, unrelated text"
    backend.calls.clear()
    state = character.run()
    # no stop string in what was speculated: each gen uses it all up, the next asks again
    assert len(backend.calls) == 3
    assert state["name"] == " Bob, unrelated text"


class ChatOnlyBackend(ScriptedBackend):
    """A chat model's backend (as OpenAI(is_chat_model=True)): gen answers whole messages."""

    is_chat_model = True

    def __init__(self, answers: list[str]) -> None:
        super().__init__(reply=self._answer)
        self.answers = answers
        self.prompts: list[Prompt] = []

    def _answer(self, prompt: Prompt, args: GenArgs) -> str:
        self.prompts.append(prompt)
        return self.answers[min(len(self.prompts), len(self.answers)) - 1]


@rf.function(num_api_spec_tokens=64)
def chat_character(s):
    s += rf.system("You are a helpful assistant.")
    s += rf.user("Please generate new Name, Birthday and Job.\n")
    s += rf.assistant(
        "Name:" + rf.gen("name", stop="\n") + "\nBirthday:" + rf.gen("birthday", stop="\n")
    )
    s += rf.user("And a job?")
    s += rf.assistant("Job:" + rf.gen("job", max_tokens=5))


def test_chat_model_speculation_writes_each_assistant_message_in_one_request():
    backend = ChatOnlyBackend(["Name: Ada\nBirthday: 1815\nand more", "Job: mathematician"])
    state = chat_character.run(backend=backend)
    assert state.error() is None
    assert len(backend.calls) == 2  # one per assistant message, not one per gen
    assert all(args.max_new_tokens == 64 and args.stop is None for _, args in backend.calls)
    first, second = backend.prompts
    assert (first.role, first.role_text) == ("assistant", "")
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert (state["name"], state["birthday"], state["job"]) == (" Ada", " 1815", " mathematician")
    assert second.messages[-2]["content"] == "Name: Ada\nBirthday: 1815"  # text after: dropped
    assert [m["content"] for m in state.messages()[2::2]] == [
        "Name: Ada\nBirthday: 1815",
        "Job: mathematician",
    ]
    # the same text as running the gens one by one on a completion backend would give
    assert state.text().endswith("Assistant: Job: mathematician\n\n")


def test_chat_model_speculation_retries_then_fails_clearly():
    backend = ChatOnlyBackend(["Nom: Ada", "Name: Ada\nBirthday: 1815", "Job: j"])
    state = chat_character.run(backend=backend)
    assert len(backend.prompts) == 3  # one retry for the first message, one request for the job
    assert (state["name"], state["birthday"], state["job"]) == (" Ada", " 1815", " j")

    backend = ChatOnlyBackend(["I cannot help with that."])
    with pytest.raises(rf.ProgramError, match="never wrote the assistant message") as info:
        chat_character.run(backend=backend)
    assert len(backend.prompts) == 3
    assert "'Name:{name}\\nBirthday:{birthday}'" in str(info.value)


def test_chat_model_speculation_refuses_what_one_request_cannot_do():
    @rf.function(num_api_spec_tokens=32)
    def mixed(s):
        s += rf.user("hi")
        s += rf.assistant(rf.gen("a", stop=".", temperature=0) + rf.gen("b", temperature=1))

    @rf.function(num_api_spec_tokens=32)
    def glued(s):
        s += rf.user("hi")
        s += rf.assistant(rf.gen("a") + rf.gen("b"))

    backend = ChatOnlyBackend(["x"])
    with pytest.raises(rf.ProgramError, match="must be the same"):
        mixed.run(backend=backend)
    with pytest.raises(rf.ProgramError, match="has no stop string"):
        glued.run(backend=backend)
    assert backend.prompts == []
    with pytest.raises(ValueError, match="num_api_spec_tokens must be a positive int"):
        rf.function(num_api_spec_tokens=0)(lambda s: None)
