"""Evicted grammars are freed on the reaper's thread, a slice at a time, and only where nothing
else holds them: a matcher or a caller keeping a grammar's automaton keeps it whole and
working."""

from __future__ import annotations

import os
import threading
import warnings
import weakref

import numpy as np
import pytest
from tiny_models import tiny_tokenizer

import radixflow.grammars.compiler as compiler_module
import radixflow.grammars.reaper as reaper_module
from radixflow.grammars import GrammarCompiler, allocate_token_bitmask
from radixflow.grammars.cfg import GrammarAutomaton
from radixflow.grammars.reaper import Reaper, reaper


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["name"],
}
TEXT = '{"name":"ab","tags":[1,22,333]}'


def _walk(matcher, text: str) -> list[np.ndarray]:
    """The masks along `text`'s tokens, each token accepted after its mask."""
    tok = matcher.grammar.index
    masks = []
    for token in _tokens(tok, text):
        masks.append(matcher.next_token_mask().copy())
        assert matcher.accept(token)
    return masks


def _tokens(index, text: str) -> list[int]:
    """`text` as single-byte tokens of the index's vocabulary."""
    return [index.token_bytes.index(bytes([b])) for b in text.encode()]


def test_an_evicted_walked_grammar_is_taken_apart_on_the_reapers_thread(tok):
    compiler = GrammarCompiler(tok)
    grammar = compiler.compile_json_schema(SCHEMA)
    _walk(grammar.matcher(), TEXT)
    nfa = grammar.automaton.dfa.nfa
    parts = [nfa._eps, nfa._ids, grammar.automaton.dfa.states._rows, grammar._masks]
    assert all(len(p) > 0 for p in parts)
    freed_on = []
    weakref.finalize(grammar, lambda: freed_on.append(threading.current_thread().name))
    del grammar, nfa
    compiler.clear_cache()
    reaper.wait()
    assert freed_on == ["radixflow-grammar-reaper"]
    assert [len(p) for p in parts] == [0, 0, 0, 0]  # emptied in slices before it was freed


def test_a_grammar_a_matcher_holds_stays_whole_and_working(tok):
    compiler = GrammarCompiler(tok)
    grammar = compiler.compile_json_schema(SCHEMA)
    matcher = grammar.matcher()
    half = len(TEXT) // 2
    first = _walk(matcher, TEXT[:half])
    gone = weakref.ref(grammar)
    del grammar
    compiler.clear_cache()
    reaper.wait()
    assert gone() is not None  # the matcher holds it
    rest = _walk(matcher, TEXT[half:])
    fresh = _walk(GrammarCompiler(tok).compile_json_schema(SCHEMA).matcher(), TEXT)
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, fresh, strict=True))
    del matcher
    assert gone() is None  # freed when its last holder let go


def test_an_automaton_held_without_its_grammar_stays_whole(tok):
    compiler = GrammarCompiler(tok)
    grammar = compiler.compile_json_schema(SCHEMA)
    _walk(grammar.matcher(), TEXT)
    automaton = grammar.automaton
    rows = [automaton.row(s).copy() for s in range(len(automaton.dfa.sets))]
    del grammar
    compiler.clear_cache()
    reaper.wait()
    assert len(automaton.dfa.nfa._eps) > 0
    assert all(np.array_equal(automaton.row(s), r) for s, r in enumerate(rows))


class _Held:
    """Stands in for a grammar: an automaton named twice, as a grammar and its walk table do,
    and containers (`parts`) that block the reaper until `release` is set."""

    def __init__(self, release: threading.Event | None = None, nbytes: int = 0):
        self.automaton = object()
        self._walk_automaton = self.automaton
        self.release = release
        self.parts = [list(range(1000)), dict.fromkeys(range(1000))]
        self.nbytes = nbytes

    def containers(self) -> list:
        if self.release is not None:
            self.release.wait(timeout=30)
        return self.parts


def test_grammars_past_the_bound_are_freed_by_the_thread_that_drops_them(monkeypatch):
    """Past the bound the dropping thread frees the smallest waiting grammars (the cheapest
    to free at once); the largest stay with the reaper's thread."""
    monkeypatch.setattr(reaper_module, "MAX_WAITING", 4)
    own = Reaper()
    release = threading.Event()
    own.drop([_Held(release, nbytes=10**9)])  # keeps the reaper's thread busy
    freed = []

    def held(nbytes: int) -> _Held:
        out = _Held(nbytes=nbytes)
        weakref.finalize(out, lambda: freed.append((nbytes, threading.current_thread().name)))
        return out

    first = [held(n) for n in (80, 5, 90)]
    own.drop(first)
    assert first == [] and freed == []  # within the bound: all wait for the reaper
    late = [held(n) for n in (50, 10, 70, 30, 60, 20, 40)]
    own.drop(late)
    assert late == []  # the reaper took them
    here = threading.current_thread().name
    assert sorted(freed) == [(n, here) for n in (5, 10, 20, 30, 40, 50)]  # 10, bound 4
    release.set()
    own.wait()
    assert sorted(freed[6:]) == [(n, "radixflow-grammar-reaper") for n in (60, 70, 80, 90)]


def _slices_per_hold(monkeypatch, behind: bool) -> int:
    """How often `_take_apart` lets go of the GIL (`time.sleep(0)`) taking a stand-in of eight
    slices apart, `behind` or not."""
    me = threading.current_thread()
    sleep = reaper_module.time.sleep
    lets_go = []

    def counted(seconds):
        if threading.current_thread() is me:
            lets_go.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(reaper_module.time, "sleep", counted)
    held = _Held()  # 1,000 list items and 1,000 dict entries: 8 slices of 256
    reaper_module._take_apart(held, lambda: behind)
    monkeypatch.undo()
    assert [len(p) for p in held.parts] == [0, 0]
    return len(lets_go)


def test_a_reaper_behind_takes_slices_for_longer_per_hold_of_the_gil(monkeypatch):
    """One slice per hold of the GIL normally; with half its bound waiting or more, slices for
    up to `BEHIND_HOLD_S` per hold (here: all of them), so that it keeps up where the GIL is
    rarely free instead of leaving grammars to the compiles that drop more."""
    assert _slices_per_hold(monkeypatch, behind=False) == 8
    monkeypatch.setattr(reaper_module, "BEHIND_HOLD_S", 60.0)
    assert _slices_per_hold(monkeypatch, behind=True) == 1


def test_the_reaper_waits_without_the_gil_while_a_compile_runs(tok, monkeypatch):
    """A compile counts as busy, as fills and walks do; the reaper waits for none of them to
    run before each slice, looking without the GIL (a thread that looked with it would take
    the GIL from the compile each time the compile let go of it)."""
    if reaper_module.dfa_rows() is None:
        pytest.skip("work in progress is counted by the native rows, not built here")
    seen = []
    build = compiler_module.schema_to_ir

    def counted(*args, **kwargs):
        seen.append(reaper_module.walks_running())
        return build(*args, **kwargs)

    monkeypatch.setattr(compiler_module, "schema_to_ir", counted)
    GrammarCompiler(tok).compile_json_schema({"type": "array", "items": {"type": "integer"}})
    assert seen == [1] and reaper_module.walks_running() == 0
    idle = threading.Event()
    with reaper_module.busy:
        waiter = threading.Thread(target=lambda: (reaper_module._wait_idle(), idle.set()))
        waiter.start()
        assert not idle.wait(timeout=0.05)
    assert idle.wait(timeout=30)
    waiter.join()
    with pytest.raises(ValueError, match="pause"):
        reaper_module.dfa_rows().wait_idle(0.0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_counts_nothing_running():
    """A fill or compile running on another thread when the process forks does not run in
    the child (only the forking thread does): the child's reaper must not wait for it."""
    if reaper_module.dfa_rows() is None:
        pytest.skip("work in progress is counted by the native rows, not built here")
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with reaper_module.busy:
            inside.set()
            leave.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(timeout=30)
    try:
        assert reaper_module.walks_running() == 1
        with warnings.catch_warnings():  # 3.12 warns of forking with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: report and leave at once
            os._exit(0 if reaper_module.walks_running() == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reaper_module.walks_running() == 1  # the parent's count is its own
    finally:
        leave.set()
        holder.join()
    assert reaper_module.walks_running() == 0


TREE = {
    "$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "$ref": "#/$defs/node",
}


def test_walks_in_progress_are_counted_for_the_reaper(tok, monkeypatch):
    """The reaper pauses while a trie walk runs: a walk counts itself from its start to its
    end, row callbacks included, and not after (an error in a row callback included). A
    recursive schema's automaton whose rows the walk asks of Python (not made by C) shows the
    count."""
    if reaper_module.dfa_rows() is None:
        pytest.skip("walks are counted by the native rows, not built here")
    monkeypatch.setattr(GrammarAutomaton, "native_rows", property(lambda self: None))
    grammar = GrammarCompiler(tok).compile_json_schema(TREE)
    automaton = grammar.automaton
    assert automaton.native_rows is None
    seen = []

    def row(state):
        seen.append(reaper_module.walks_running())
        return type(automaton).row(automaton, state)

    automaton.row = row
    grammar.matcher().next_token_mask()
    assert seen and set(seen) == {1}
    assert reaper_module.walks_running() == 0

    def failing_row(state):
        raise RuntimeError("row callback failed")

    failing = GrammarCompiler(tok).compile_json_schema(TREE)
    failing.automaton.row = failing_row
    with pytest.raises(RuntimeError, match="row callback failed"):
        failing.matcher().next_token_mask()
    assert reaper_module.walks_running() == 0


def test_mask_fills_in_progress_are_counted_for_the_reaper(tok, monkeypatch):
    """The reaper takes no slice while a mask is filled, its Python parts and tensor copy
    included (the copy lets go of the GIL): a fill counts itself from its start to its end,
    and not after, a failing fill included."""
    if reaper_module.dfa_rows() is None:
        pytest.skip("fills are counted by the native rows, not built here")
    matcher = GrammarCompiler(tok).compile_json_schema(SCHEMA).matcher()
    seen = []
    made = type(matcher)._mask_entry

    def mask_entry(self):
        seen.append(reaper_module.walks_running())
        return made(self)

    monkeypatch.setattr(type(matcher), "_mask_entry", mask_entry)
    bitmask = allocate_token_bitmask(1, matcher.grammar.index.vocab_size)
    matcher.fill_mask(bitmask[0])
    assert seen == [1] and reaper_module.walks_running() == 0
    assert bitmask[0].any()  # the mask was written

    def failing(self):
        raise RuntimeError("fill failed")

    monkeypatch.setattr(type(matcher), "_mask_entry", failing)
    with pytest.raises(RuntimeError, match="fill failed"):
        matcher.fill_mask(bitmask[0])
    assert reaper_module.walks_running() == 0
