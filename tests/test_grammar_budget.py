"""Grammar budgets and the compiled-grammar cache.

A grammar past one of its budgets (states, state size, Earley items, memory, time per call)
fails its own request with an abort naming the budget, in bounded time, while requests in
the same batch finish as they would alone. Compiled grammars stay within the cache's bytes
and `flush_cache` lets them be collected.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir, tiny_tokenizer

import radixflow as rf
from radixflow.grammars import GrammarBudgetExceeded, GrammarCompiler, GrammarLimits
from radixflow.grammars.reaper import reaper

# DFA states of thousands of NFA states: counts of nested repeats that no smaller count
# subsumes (((a{0,40}){0,40}){0,40}, once the example here, now stays small: see nfa.prune).
PATHOLOGICAL_REGEX = "(((a{1,40}){1,40}){1,40}){1,40}"
AMBIGUOUS_LARK = 'start: x\nx: "a" | "b" | x x | x x x | x x x x\n'  # Earley sets grow forever
BUDGETS = {"grammar_max_state_size": 10_000, "grammar_max_earley_items": 300}
NORMAL_PROMPT = "Count: 1, 2, 3,"
NORMAL = {"max_new_tokens": 8, "temperature": 0, "regex": "( [0-9]+,)+"}
BAD_PROMPT = "aaaaaaaa"  # the tiny model then keeps writing "a"s, so n-grams propose some
SECONDS = 10.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("budget"), "llama", seed=1)


def _engine(model_dir, **options) -> rf.Engine:
    return rf.Engine(str(model_dir), dtype="float32", max_total_tokens=2048, **BUDGETS, **options)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = _engine(model_dir)
    yield eng
    eng.shutdown()


def _fails_alone(engine: rf.Engine, bad: dict, budget: str) -> None:
    """`bad` aborts naming `budget` in bounded time; a request batched with it is unaffected."""
    expected = engine.generate(NORMAL_PROMPT, NORMAL)
    start = time.monotonic()
    failed, normal = engine.generate([BAD_PROMPT, NORMAL_PROMPT], [bad, NORMAL])
    assert time.monotonic() - start < SECONDS
    reason = failed["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"
    assert budget in reason["message"]
    assert normal["output_ids"] == expected["output_ids"]
    assert normal["meta_info"]["finish_reason"] == expected["meta_info"]["finish_reason"]
    assert engine.generate(NORMAL_PROMPT, NORMAL)["output_ids"] == expected["output_ids"]
    assert_kv_released(engine)


@pytest.mark.parametrize(
    ("grammar", "budget"),
    [
        ({"regex": PATHOLOGICAL_REGEX}, "grammar_max_state_size"),
        ({"lark": AMBIGUOUS_LARK}, "grammar_max_earley_items"),
    ],
)
def test_grammar_past_its_budget_fails_only_its_request(engine, grammar, budget):
    bad = {"max_new_tokens": 400, "min_new_tokens": 400, "temperature": 0, **grammar}
    _fails_alone(engine, bad, budget)


@pytest.mark.parametrize("grammar", [{"regex": PATHOLOGICAL_REGEX}, {"lark": AMBIGUOUS_LARK}])
def test_budget_failures_with_speculative_drafts(model_dir, grammar):
    engine = _engine(model_dir, speculative_algorithm="ngram")
    try:
        bad = {"max_new_tokens": 400, "temperature": 0, **grammar}
        _fails_alone(engine, bad, "grammar_max_")
        assert engine.stats["spec_draft_tokens"] > 0  # drafts walked the grammar too
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _walk_a(matcher, steps: int) -> None:
    """Mask, then accept the token "a", `steps` times."""
    a = matcher.grammar.index.token_bytes.index(b"a")
    for _ in range(steps):
        matcher.next_token_mask()
        assert matcher.accept(a)


def test_step_timeout_bounds_one_call(tok):
    limits = GrammarLimits(step_timeout=0.02, max_earley_items=10**9, max_chart_items=10**9)
    matcher = GrammarCompiler(tok, limits=limits).compile_lark(AMBIGUOUS_LARK).matcher()
    with pytest.raises(GrammarBudgetExceeded) as err:
        while True:  # each step does more work than the one before it
            start = time.perf_counter()
            _walk_a(matcher, 1)
    assert err.value.budget == "step_timeout"
    assert time.perf_counter() - start < 0.02 + 3.0  # past the limit by little (a loaded CPU)


@pytest.mark.parametrize(
    ("kind", "source", "limits", "budget"),
    [
        ("regex", "[ab]{0,500}", GrammarLimits(max_states=50), "max_states"),
        ("regex", PATHOLOGICAL_REGEX, GrammarLimits(max_mb=20.0), "max_mb"),
        ("lark", AMBIGUOUS_LARK, GrammarLimits(max_chart_items=2000), "max_chart_items"),
    ],
)
def test_each_budget_stops_a_growing_grammar(tok, kind, source, limits, budget):
    compiler = GrammarCompiler(tok, limits=limits)
    grammar = compiler.compile_regex(source) if kind == "regex" else compiler.compile_lark(source)
    matcher = grammar.matcher()
    with pytest.raises(GrammarBudgetExceeded) as err:
        _walk_a(matcher, 500)
    assert err.value.budget == budget
    assert budget in str(err.value)
    # The matcher stays failed (its request is aborted); rollback still works.
    with pytest.raises(GrammarBudgetExceeded):
        matcher.next_token_mask()
    matcher.rollback(matcher.num_accepted)


def test_cache_holds_its_bytes_least_recently_used_out(tok):
    budget = 2**19
    compiler = GrammarCompiler(tok, cache_mb=0.5)
    first = compiler.compile_regex("[ab]{0,300}")
    assert 0 < compiler.cache_nbytes <= budget
    _walk_a(first.matcher(), 300)  # a grammar grows as its states are visited ...
    assert first.nbytes > budget
    first_ref = weakref.ref(first)
    del first
    compiler.compile_regex("b")  # ... so every insert or lookup checks the total again
    assert compiler.cache_nbytes <= budget
    reaper.wait()  # evicted grammars are freed on the reaper's thread
    gc.collect()
    assert first_ref() is None  # dropped, and nothing else holds it
    refs = []
    for n in range(8):
        grammar = compiler.compile_regex(f"[ab]{{0,{300 + n}}}")
        assert compiler.cache_nbytes <= budget
        _walk_a(grammar.matcher(), 60)  # each grows to a third to a half of the budget
        refs.append(weakref.ref(grammar))
        del grammar
    compiler.compile_regex("b")
    assert compiler.cache_nbytes <= budget
    reaper.wait()
    gc.collect()
    assert refs[0]() is None  # least recently used out first
    assert refs[-1]() is not None
    assert compiler.cache_len < len(refs)


def test_an_evicted_grammar_is_freed_outside_the_cache_lock_and_the_compile(tok):
    """Freeing a walked grammar takes milliseconds: the reaper's thread frees it, so neither
    other threads' cache lookups nor the compile that evicted it wait."""
    compiler = GrammarCompiler(tok, cache_mb=0.5)
    first = compiler.compile_regex("[ab]{0,300}")
    _walk_a(first.matcher(), 300)  # past the cache's bytes
    freed = []
    weakref.finalize(
        first, lambda: freed.append((compiler._lock.locked(), threading.current_thread().name))
    )
    del first
    compiler.compile_regex("b")
    reaper.wait()
    assert freed == [(False, "radixflow-grammar-reaper")]


def test_flush_cache_empties_the_grammar_cache(engine):
    engine.generate(NORMAL_PROMPT, NORMAL)
    compiler = engine.grammars.compiler
    used = weakref.ref(compiler.compile_regex(NORMAL["regex"]))  # the cached grammar it used
    assert compiler.cache_len > 0 and compiler.cache_nbytes > 0
    engine.flush_cache()
    assert compiler.cache_len == 0 and compiler.cache_nbytes == 0
    reaper.wait()
    gc.collect()
    assert used() is None
    out = engine.generate(NORMAL_PROMPT, NORMAL)
    assert out["meta_info"]["finish_reason"]["type"] in {"stop", "length"}
    assert compiler.cache_len == 1
