"""GenerateInput: one typed, validated request for every shape a caller may send."""

from __future__ import annotations

import asyncio
import re

import pytest
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.io_struct import (
    AbortCause,
    FinishReason,
    GenerateInput,
    InputError,
    InputLimits,
)
from radixflow.runtime.request import LogprobRequest
from radixflow.runtime.sampling_params import SamplingParams

LIMITS = InputLimits(vocab_size=100, model_context_length=256, context_length=32)


def _build(prompts, params=None, **kwargs) -> GenerateInput:
    kwargs.setdefault("batched", len(prompts) != 1)
    return GenerateInput.build(prompts, params, LIMITS, **kwargs)


def _summary(inp: GenerateInput) -> list[tuple[list[int], int, str, int, int | None]]:
    return [(i.input_ids, i.prompt_index, i.name, i.params.n, i.params.seed) for i in inp.items]


def test_single_prompt_is_one_item_named_by_its_rid():
    inp = _build([[1, 2, 3]], {"max_new_tokens": 4}, batched=False, rid="r")
    assert not inp.batched
    assert _summary(inp) == [([1, 2, 3], 0, "r", 1, None)]
    assert inp.items[0].rid == "r"
    assert inp.items[0].params == SamplingParams(max_new_tokens=4)


def test_batch_with_per_prompt_params_and_n():
    inp = _build(
        [[1], [2, 3]],
        [{"n": 2, "seed": 7, "temperature": 0.5}, {"max_new_tokens": 1}],
        rid="b",
    )
    assert inp.batched
    assert _summary(inp) == [
        ([1], 0, "b-0-0", 1, 7),
        ([1], 0, "b-0-1", 1, 8),
        ([2, 3], 1, "b-1", 1, None),
    ]
    assert [i.params.temperature for i in inp.items] == [0.5, 0.5, 1.0]


def test_n_expansion_matches_sampling_params_expand():
    raw = {"n": 3, "sampling_seed": 2**64 - 2, "top_k": 5, "stop": ["x"]}
    inp = _build([[5, 6]], raw, batched=False)
    expected = SamplingParams.from_dict(raw).expand()
    assert [i.params for i in inp.items] == expected
    assert [i.params.seed for i in inp.items] == [2**64 - 2, 2**64 - 1, 0]


def test_model_defaults_apply_under_the_request():
    limits = InputLimits(100, 256, 32, sampling_defaults={"temperature": 0.3, "top_p": 0.9})
    inp = GenerateInput.build([[1]], {"top_p": 0.5}, limits, batched=False)
    assert (inp.items[0].params.temperature, inp.items[0].params.top_p) == (0.3, 0.5)


def test_private_rids_name_items_after_the_client_rid():
    inp = _build([[1], [2]], {"n": 2}, rid="c", private_rids=True)
    assert [i.name for i in inp.items] == ["c-0", "c-1", "c-2", "c-3"]
    assert inp.groups == {"c": ["c-0", "c-1", "c-2", "c-3"]}
    rids = [i.rid for i in inp.items]
    assert len(set(rids)) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", r) for r in rids)
    again = _build([[1], [2]], {"n": 2}, rid="c", private_rids=True)
    assert set(rids).isdisjoint(i.rid for i in again.items)  # random, never from the name
    assert all(len(r) == 32 for r in rids)  # 128 random bits, hex

    per_prompt = _build([[1], [2]], [{"n": 2}, {}], rid=["x", "y"], private_rids=True)
    assert per_prompt.groups == {"x": ["x-0", "x-1"], "y": ["y"]}


def test_logprob_options_are_carried_per_item():
    lp = [LIMITS.logprob(True, 0, 2), LIMITS.logprob(False)]
    inp = _build([[1], [2]], {"n": 2}, logprobs=lp)
    assert [i.logprob for i in inp.items] == [lp[0], lp[0], lp[1], lp[1]]
    assert lp[0] == LogprobRequest(True, 0, 2, None)
    assert lp[1] == LogprobRequest(False, -1, 0, None)


@pytest.mark.parametrize(
    ("prompts", "params", "kwargs", "field", "message"),
    [
        ([[]], None, {}, "input_ids", "prompt is empty"),
        ([[1, 100]], None, {}, "input_ids", r"integers in \[0, 100\)"),
        ([list(range(32))], None, {"prompt_field": "text"}, "text", "do not fit the KV pool"),
        ([], None, {"batched": True}, "input_ids", "the batch is empty"),
        ([[1], [2]], [{}], {}, "sampling_params", "1 entries for 2 prompts"),
        ([[1], [2]], {"n": 3}, {"max_items": 5}, "n", "asks for 6 generations"),
        ([[1]], {"n": 2}, {"stream": True}, "stream", "single prompt with n=1"),
        ([[1], [2]], None, {"rid": ["a"], "private_rids": True}, "rid", "one non-empty"),
        ([[1], [2]], None, {"rid": ["a", "a"], "private_rids": True}, "rid", "distinct"),
        ([[1]], None, {"rid": "", "private_rids": True}, "rid", "non-empty string"),
    ],
)
def test_errors_name_the_field(prompts, params, kwargs, field, message):
    with pytest.raises(InputError, match=message) as info:
        _build(prompts, params, **kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"temperature": -1}, "temperature"),
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"max_new_tokens": 257}, "max_new_tokens"),
        ({"tempurature": 1}, "tempurature"),
    ],
)
def test_sampling_param_errors_name_the_parameter(params, name):
    with pytest.raises(ValueError, match=f"'{name}'"):
        _build([[1]], params, batched=False)


def test_logprob_option_errors_name_the_field():
    with pytest.raises(InputError) as info:
        LIMITS.logprob(True, top_logprobs_num=-1)
    assert info.value.field == "top_logprobs_num"
    with pytest.raises(InputError) as info:
        LIMITS.logprob(True, token_ids_logprob=[3, 100])
    assert info.value.field == "token_ids_logprob"


@pytest.mark.parametrize(
    ("reason", "wire"),
    [
        (FinishReason.stop(2), {"type": "stop", "matched": 2}),
        (FinishReason.stop("\n\n"), {"type": "stop", "matched": "\n\n"}),
        (FinishReason.limit(6), {"type": "length", "length": 6}),
        (
            FinishReason.abort("engine error: boom", AbortCause.ENGINE),
            {
                "type": "abort",
                "message": "engine error: boom",
                "status_code": 500,
                "err_type": "engine_error",
            },
        ),
        (
            FinishReason.abort("aborted by request", AbortCause.CANCELLED),
            {
                "type": "abort",
                "message": "aborted by request",
                "status_code": 503,
                "err_type": "request_aborted",
            },
        ),
    ],
)
def test_finish_reason_round_trips_through_sglangs_dict(reason, wire):
    assert reason.to_dict() == wire
    assert FinishReason.from_dict(wire) == reason


def test_an_abort_without_a_cause_is_the_requests_fault():
    # The scheduler and the grammar budget write plain SGLang aborts.
    reason = FinishReason.from_dict({"type": "abort", "message": "grammar budget exceeded"})
    assert reason.cause is AbortCause.REQUEST and not reason.engine_failed
    assert reason.to_dict()["status_code"] == 400
    # The cause comes from the typed field, never from the message text.
    text_only = FinishReason.from_dict({"type": "abort", "message": "engine error: looks bad"})
    assert not text_only.engine_failed


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("input"), "llama", seed=2)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=512)
    yield eng
    eng.shutdown()


def test_engine_normalises_every_prompt_shape(engine):
    encode = engine.tokenizer.encode
    cases = [
        ({"prompt": "hello"}, False, [encode("hello")]),
        ({"prompt": ["a b", "c"]}, True, [encode("a b"), encode("c")]),
        ({"input_ids": [3, 4, 5]}, False, [[3, 4, 5]]),
        ({"input_ids": [[3], [4, 5]]}, True, [[3], [4, 5]]),
    ]
    for kwargs, batched, ids in cases:
        inp = engine.make_input(**kwargs, sampling_params={"max_new_tokens": 2}, rid="q")
        assert inp.batched is batched
        assert [i.input_ids for i in inp.items] == ids
        expected_rids = ["q"] if len(ids) == 1 else [f"q-{k}" for k in range(len(ids))]
        assert [i.rid for i in inp.items] == [i.name for i in inp.items] == expected_rids
        assert all(i.params == SamplingParams(max_new_tokens=2) for i in inp.items)


def test_engine_input_errors(engine):
    with pytest.raises(ValueError, match="exactly one of prompt or input_ids"):
        engine.make_input(prompt="x", input_ids=[1])
    with pytest.raises(InputError, match="integers in") as info:
        engine.make_input(input_ids=[engine.vocab_size])
    assert info.value.field == "input_ids"
    with pytest.raises(InputError) as info:
        engine.make_input(input_ids=[1], return_logprob=True, top_logprobs_num=-2)
    assert info.value.field == "top_logprobs_num"
    with pytest.raises(InputError, match="single prompt with n=1"):
        engine.generate(input_ids=[1], sampling_params={"n": 2}, stream=True)


def test_engine_runs_a_built_input_as_generate_does(engine):
    params = {"max_new_tokens": 4, "temperature": 0.8, "seed": 11, "n": 2, "ignore_eos": True}
    direct = engine.generate(input_ids=[5, 6, 7], sampling_params=params)
    built = engine.make_input(input_ids=[5, 6, 7], sampling_params=params)
    via_input = asyncio.run(engine.async_run(built))
    assert [r["output_ids"] for r in via_input] == [r["output_ids"] for r in direct]
