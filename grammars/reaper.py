"""Grammars a cache lets go of, freed on a thread of their own a slice at a time.

A grammar that requests have walked holds up to hundreds of thousands of Python objects (its
NFA's packed lists, its DFA states and rows, its Earley chart), and freeing it in one go holds
the GIL for milliseconds (10-15 ms for the largest walked Github_hard grammars here): inside
the compile whose insertion evicted it, and stalling every other thread meanwhile. The
reaper's thread takes such a grammar apart instead: the lists and dicts it alone holds
(`CompiledGrammar.containers`) are emptied `SLICE` items at a time, letting go of the GIL in
between, and the rest is freed once they are empty. It takes no slice while a trie walk, a
mask fill or a compile runs (`busy`; each lets go of the GIL here and there and would wait for
the slice), waiting for them without the GIL (`dfa_rows.wait_idle`). It runs while the CPU is
otherwise idle or busy without the GIL (waiting for the GPU, in torch ops, in the tokenizer);
with no such time, the thread the GIL's switch interval interrupts lends it a hold of the GIL
every few milliseconds: one slice, or slices for up to `BEHIND_HOLD_S` once half of
`MAX_WAITING` grammars wait, so that it keeps up with a benchmark compiling and walking schemas
back to back. A grammar that something else still holds (a matcher) is only let go of, and
freed when its last holder lets go. Past `MAX_WAITING` waiting grammars, the thread that drops
more frees the smallest of them itself, so that memory stays bounded: freeing takes time in
proportion to a grammar's size (100-160 ms for the largest walked Github_hard grammars), which
the reaper's thread spends a slice at a time, and the compile that dropped them would
otherwise spend at once.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from operator import attrgetter

from .native_rows import dfa_rows

SLICE = 256  # items freed per slice (one slice per hold of the GIL unless behind)
MAX_WAITING = 16  # grammars waiting past this are freed by the thread that drops more
PAUSE_S = 0.0002  # between looks at whether a walk, fill or compile still runs
BEHIND_HOLD_S = 0.001  # with MAX_WAITING // 2 grammars waiting or more: slices per GIL hold


def walks_running() -> int:
    """Trie walks, mask fills and compiles (`busy`) in progress on any thread (none counted
    without the C rows)."""
    native = dfa_rows()
    return 0 if native is None else native.walks_running()


def _wait_idle() -> None:
    """Return once no walk, fill or compile (`busy`) runs: a slice taken in one would make it
    wait. Looked at without the GIL (`dfa_rows.wait_idle`), then again with it, as one may
    have begun in between."""
    native = dfa_rows()
    while native is not None and native.walks_running():
        native.wait_idle(PAUSE_S)


class _Busy:
    """`with busy:` around work the reaper must not take slices in, a mask fill or a compile:
    each lets go of the GIL here and there (a fill's copy into the caller's row by ctypes'
    memmove or torch's copy; a compile's numpy and C parts), and the reaper, taking the GIL
    then for a slice, would make the work wait for it."""

    def __enter__(self) -> None:
        native = dfa_rows()
        if native is not None:
            native.hold_busy()

    def __exit__(self, *exc: object) -> None:
        native = dfa_rows()
        if native is not None:
            native.release_busy()


busy = _Busy()


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _call_refs() -> int:
    """What a call of `_refs` on a name adds to the count (its parameter, getrefcount's
    argument): measured, since interpreters differ in what they count."""
    probe = object()
    return _refs(probe) - 1  # less the `probe` name


_CALL_REFS = _call_refs()


def _take_apart(grammar, behind: Callable[[], bool]) -> None:
    """Empty the containers of `grammar` a slice at a time, when nothing else holds it or its
    automaton: `grammar` is named by the reaper's loop and here, the automaton by the grammar
    and its walk table (and here); a matcher or any other holder adds to those counts. Each
    hold of the GIL takes one slice, or slices for up to `BEHIND_HOLD_S` while `behind()`."""
    automaton = grammar.automaton
    if _refs(grammar) != _CALL_REFS + 2 or _refs(automaton) != _CALL_REFS + 3:
        return
    del automaton
    seen = set()
    until = 0.0  # this hold of the GIL ends at the first slice past it
    for box in grammar.containers():
        if id(box) in seen:  # listed twice: the NFA's parts and its facts share one dict
            continue
        seen.add(id(box))
        while box:
            if time.perf_counter() >= until:
                time.sleep(0)  # lets go of the GIL: a waiting thread runs next
                _wait_idle()
                until = time.perf_counter() + (BEHIND_HOLD_S if behind() else 0.0)
            if type(box) is list:
                del box[-SLICE:]
            else:
                take = box.popitem if type(box) is dict else box.pop
                for _ in range(min(SLICE, len(box))):
                    take()


class Reaper:
    """A thread (started on first use, and again after a fork) that frees dropped grammars."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._waiting: deque = deque()
        self._working = False
        self._thread: threading.Thread | None = None

    def drop(self, grammars: list) -> None:
        """Take the grammars in `grammars` (which it empties) to free on the reaper's thread."""
        if not grammars:  # most compiles and cache hits drop none
            return
        with self._changed:
            self._waiting.extend(grammars)
            grammars.clear()
            late, excess = [], len(self._waiting) - MAX_WAITING
            if excess > 0:
                late = sorted(self._waiting, key=attrgetter("nbytes"))[:excess]
                freed_here = set(map(id, late))
                self._waiting = deque(g for g in self._waiting if id(g) not in freed_here)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="radixflow-grammar-reaper", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()
        late.clear()  # past the bound: freed here, at once

    def _behind(self) -> bool:
        """Whether half of `MAX_WAITING` or more grammars wait (read without the lock)."""
        return len(self._waiting) >= MAX_WAITING // 2

    def wait(self) -> None:
        """Block until every grammar dropped so far is freed (or let go of, where held)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._waiting and not self._working)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._waiting))
                grammar = self._waiting.popleft()
                self._working = True
            try:
                _take_apart(grammar, self._behind)
            finally:
                del grammar
                with self._changed:
                    self._working = False
                    self._changed.notify_all()


reaper = Reaper()
