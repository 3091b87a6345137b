"""Prefix reuse in the engine: same outputs with the cache on and off, cached_tokens, eviction."""

from __future__ import annotations

import pytest
from kv_checks import assert_kv_released

import radixflow as rf

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a careful assistant. Answer in one short sentence. Facts: Paris is the capital of "
    "France, Berlin of Germany, Madrid of Spain, Rome of Italy, Lisbon of Portugal. "
)
QUESTIONS = ["What is the capital of Spain?", "And Italy?", "Which city is in Portugal?", "Hi!"]
GREEDY = {"max_new_tokens": 10, "temperature": 0}


def _engine(**options) -> rf.Engine:
    return rf.Engine(dtype="float32", **{"max_total_tokens": 4096, **options})


@pytest.mark.parametrize(
    "options",
    [
        {"page_size": 1, "chunked_prefill_size": -1},
        {"page_size": 1, "chunked_prefill_size": 16},
        {"page_size": 16, "chunked_prefill_size": -1},
        {"page_size": 16, "chunked_prefill_size": 16},
    ],
    ids=["p1", "p1-chunk", "p16", "p16-chunk"],
)
def test_outputs_identical_with_cache_on_and_off(options):
    prompts = [SYSTEM + q for q in QUESTIONS]
    results = {}
    for disable in (True, False):
        engine = _engine(disable_radix_cache=disable, **options)
        try:
            first = engine.generate(prompts, GREEDY)
            second = engine.generate(prompts[::-1], GREEDY)
            results[disable] = ([o["output_ids"] for o in first], [o["output_ids"] for o in second])
            cached = [o["meta_info"]["cached_tokens"] for o in second]
            if disable:
                assert cached == [0, 0, 0, 0]
            else:
                assert all(c > 0 for c in cached)
            assert_kv_released(engine)
        finally:
            engine.shutdown()
    assert results[True] == results[False]


@pytest.mark.parametrize("page_size", [1, 16])
def test_repeated_request_is_served_from_cache(page_size):
    engine = _engine(page_size=page_size)
    try:
        first = engine.generate(SYSTEM + QUESTIONS[0], GREEDY)
        again = engine.generate(SYSTEM + QUESTIONS[0], GREEDY)
        n = again["meta_info"]["prompt_tokens"]
        assert first["meta_info"]["cached_tokens"] == 0
        assert n - page_size <= again["meta_info"]["cached_tokens"] <= n - 1
        assert again["output_ids"] == first["output_ids"]
        assert engine.cache_hit_rate() == pytest.approx(
            again["meta_info"]["cached_tokens"] / (2 * n)
        )
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_multi_turn_chat_hits_all_earlier_turns():
    engine = _engine()
    try:
        messages = [{"role": "system", "content": SYSTEM}]
        previous_len = 0
        for turn, question in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": question})
            prompt = engine.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            out = engine.generate(prompt, GREEDY)
            if turn > 0:
                # Everything up to the previous prompt plus the previous answer is cached.
                assert out["meta_info"]["cached_tokens"] >= previous_len
            previous_len = (
                out["meta_info"]["prompt_tokens"] + out["meta_info"]["completion_tokens"] - 1
            )
            messages.append({"role": "assistant", "content": out["text"]})
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_tiny_pool_finishes_everything_correctly():
    prompts = [f"{SYSTEM} Question {i}: {q}" for i, q in enumerate(QUESTIONS * 3)]
    reference = _engine(disable_radix_cache=True)
    try:
        expected = [o["output_ids"] for o in reference.generate(prompts, GREEDY)]
    finally:
        reference.shutdown()
    engine = _engine(max_total_tokens=200, page_size=1)
    try:
        outs = engine.generate(prompts, GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_flush_cache_refuses_while_running():
    engine = _engine()
    try:
        stream = engine.generate(SYSTEM, {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
        next(stream)
        with pytest.raises(RuntimeError, match="running"):
            engine.flush_cache()
        for _ in stream:
            pass
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_input_logprobs_are_computed_for_cached_prompts():
    engine = _engine()
    try:
        prompt = SYSTEM + QUESTIONS[1]
        kwargs = {"return_logprob": True, "logprob_start_len": 3}
        first = engine.generate(prompt, {"max_new_tokens": 0}, **kwargs)
        again = engine.generate(prompt, {"max_new_tokens": 0}, **kwargs)
        n = first["meta_info"]["prompt_tokens"]
        assert len(again["meta_info"]["input_token_logprobs"]) == n - 3
        assert again["meta_info"]["cached_tokens"] == 2  # everything before position 2
        ours = [lp for lp, _, _ in again["meta_info"]["input_token_logprobs"]]
        ref = [lp for lp, _, _ in first["meta_info"]["input_token_logprobs"]]
        assert ours == pytest.approx(ref, abs=1e-4)
        assert_kv_released(engine)
    finally:
        engine.shutdown()
