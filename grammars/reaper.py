"""Grammars a cache lets go of, freed on a thread of their own a slice at a time.

A grammar that requests have walked holds up to hundreds of thousands of Python objects (its
NFA's packed lists, its DFA states and rows, its Earley chart), and freeing it in one go holds
the GIL for milliseconds (13 ms for one walked Github_hard grammar here): inside the compile
whose insertion evicted it, and stalling every other thread meanwhile. The reaper's thread takes
such a grammar apart instead: the lists and dicts it alone holds (`CompiledGrammar.containers`)
are emptied `SLICE` items at a time, letting go of the GIL in between and pausing while a
mask is filled (its trie walk holds the GIL, but its Python parts and its copy into the
caller's row let go of it between them: each would wait for a slice), and the rest is freed
once they are empty. It runs while the CPU is otherwise idle or busy without the GIL (waiting
for the GPU, in torch ops, in the tokenizer); with no such time, the compile that the GIL's
switch interval interrupts lends it a slice every few milliseconds. A grammar that something
else still holds (a matcher) is only let go of, and freed when its last holder lets go. Past
`MAX_WAITING` waiting grammars, the thread that drops more frees the oldest itself, so that
memory stays bounded: where the CPU is busy with the GIL held throughout (a benchmark compiling
and walking schemas back to back), most dropped grammars end there, in the compile that drops
them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from .native_rows import dfa_rows

SLICE = 256  # items freed per hold of the GIL
MAX_WAITING = 16  # grammars waiting past this are freed by the thread that drops more
PAUSE_S = 0.0002  # between looks at whether a walk or fill still runs


def walks_running() -> int:
    """Trie walks and mask fills (`filling`) in progress on any thread (none counted without
    the C rows)."""
    native = dfa_rows()
    return 0 if native is None else native.walks_running()


class _Filling:
    """`with filling:` around a mask fill, so that the reaper takes no slice in it: a fill's
    Python parts run with the GIL, and its copy into the caller's row (ctypes' memmove, torch's
    copy) lets go of it, where the reaper would otherwise free a slice that the fill then waits
    for."""

    def __enter__(self) -> None:
        native = dfa_rows()
        if native is not None:
            native.hold_fill()

    def __exit__(self, *exc: object) -> None:
        native = dfa_rows()
        if native is not None:
            native.release_fill()


filling = _Filling()


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _call_refs() -> int:
    """What a call of `_refs` on a name adds to the count (its parameter, getrefcount's
    argument): measured, since interpreters differ in what they count."""
    probe = object()
    return _refs(probe) - 1  # less the `probe` name


_CALL_REFS = _call_refs()


def _take_apart(grammar) -> None:
    """Empty the containers of `grammar` a slice at a time, when nothing else holds it or its
    automaton: `grammar` is named by the reaper's loop and here, the automaton by the grammar
    and its walk table (and here); a matcher or any other holder adds to those counts."""
    automaton = grammar.automaton
    if _refs(grammar) != _CALL_REFS + 2 or _refs(automaton) != _CALL_REFS + 3:
        return
    del automaton
    seen = set()
    for box in grammar.containers():
        if id(box) in seen:  # listed twice: the NFA's parts and its facts share one dict
            continue
        seen.add(id(box))
        while box:
            if type(box) is list:
                del box[-SLICE:]
            else:
                take = box.popitem if type(box) is dict else box.pop
                for _ in range(min(SLICE, len(box))):
                    take()
            time.sleep(0)  # lets go of the GIL: a waiting thread runs next
            while walks_running():  # a fill (or a walk's row callbacks) would wait for a slice
                time.sleep(PAUSE_S)


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
            late = [self._waiting.popleft() for _ in range(len(self._waiting) - MAX_WAITING)]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="radixflow-grammar-reaper", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()
        late.clear()  # past the bound: freed here, at once

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
                _take_apart(grammar)
            finally:
                del grammar
                with self._changed:
                    self._working = False
                    self._changed.notify_all()


reaper = Reaper()
