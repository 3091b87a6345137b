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
    # float activations: a retracted request's tokens are recomputed by a prefill, whose fp32
    # rounding differs from decode's; int8 activations can turn that into a different int8
    # code and so flip a near-tie, which is not what this test is about
    prompts = [f"{SYSTEM} Question {i}: {q}" for i, q in enumerate(QUESTIONS * 3)]
    reference = _engine(disable_radix_cache=True, quant_activations="float")
    try:
        expected = [o["output_ids"] for o in reference.generate(prompts, GREEDY)]
    finally:
        reference.shutdown()
    engine = _engine(max_total_tokens=200, page_size=1, quant_activations="float")
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


def _fill_pool(engine: rf.Engine) -> None:
    """Unrelated prompts that need most of a small pool, so the tree must evict."""
    for i in range(5):  # one after another: together far more than the pool
        engine.generate(f"Item {i}: " + "numbers and letters " * 50, {"max_new_tokens": 2})


def test_pinned_prefix_survives_eviction_until_unpinned():
    engine = _engine(max_total_tokens=640, page_size=1)
    try:
        prompt = f"{SYSTEM} Question: {QUESTIONS[0]}"
        engine.generate(SYSTEM, {"max_new_tokens": 0})  # cached, not pinned
        _fill_pool(engine)
        unpinned = engine.generate(prompt, GREEDY)["meta_info"]["cached_tokens"]

        engine.flush_cache()
        pin = engine.pin_prefix(SYSTEM)
        assert pin.tokens == len(engine.tokenizer.encode(SYSTEM))
        assert engine.stats["pinned_tokens"] == pin.tokens
        _fill_pool(engine)
        pinned = engine.generate(prompt, GREEDY)["meta_info"]["cached_tokens"]
        assert unpinned < pin.tokens <= pinned  # evicted without the pin, kept with it

        engine.unpin_prefix(pin)
        engine.unpin_prefix(pin)  # a second unpin is harmless
        assert_kv_released(engine)
        assert engine.stats["pinned_tokens"] == 0
    finally:
        engine.shutdown()


def test_pins_are_bounded_and_flushed():
    engine = _engine(max_total_tokens=200, page_size=1)
    off = _engine(disable_radix_cache=True)
    try:
        assert off.pin_prefix(SYSTEM).tokens == 0  # nothing to pin without the cache
        first = engine.pin_prefix(SYSTEM)
        assert 0 < first.tokens <= 100
        second = engine.pin_prefix(SYSTEM + " Again: " + SYSTEM)
        assert second.tokens == 0  # pins may hold at most half of the pool
        with pytest.raises(ValueError, match="one prompt"):
            engine.pin_prefix([SYSTEM, SYSTEM])
        engine.flush_cache()  # releases every pin
        assert engine.stats["pinned_tokens"] == 0
        assert engine.kv_pages_free() == engine.kv_pages_total()
        engine.unpin_prefix(first)  # already released by the flush: ignored
    finally:
        engine.shutdown()
        off.shutdown()
