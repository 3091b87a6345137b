"""The trie walk in C (`trie_walk.c`), built on first use (`native_build`), with the numpy walk
as its twin.

The numpy walk (`masks`) goes one trie depth at a time, a dozen array calls per depth; the C
walk goes depth-first and skips a dead node's subtree in one step, so a mask costs about the
nodes it reaches alive. The C walk reads the automaton's rows where they are kept (through
`row_pointers()`, no copy); where a row is not computed yet it calls back into Python, which
computes it and hands back the rows' addresses, and the walk goes on from the same node (the
callback is in C where `dfa_rows` is built, else a ctypes callback into `_fill`).
`describe()` says which walk is in use.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .automaton import ByteAutomaton
from .native_build import load_native
from .native_rows import dfa_rows
from .tokenizer_index import TokenizerIndex

SOURCE = Path(__file__).with_name("trie_walk.c")
_P = ctypes.c_void_p
# int64_t fill(int32_t state, int64_t *num_rows): the rows' addresses once state's row is made
_FILL = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64))
_ARGTYPES = (_P, ctypes.c_int64, _P, ctypes.c_int32, _P, _P, _FILL)


def _load(lib: Path) -> Callable[..., int]:
    fn = ctypes.CDLL(str(lib)).rf_trie_walk
    fn.argtypes = _ARGTYPES
    fn.restype = ctypes.c_int64
    return fn


@functools.cache
def trie_walk() -> Callable[..., int] | None:
    """The C walk, or None (the numpy walk) with the reason logged or warned once."""
    return load_native(
        "grammar trie walk", "grammar masks use the slower numpy trie walk", SOURCE, _load
    )


def describe() -> str:
    """Which trie walk masks use, for the startup log."""
    return "native trie walk" if trie_walk() is not None else "numpy trie walk"


class _Trie(ctypes.Structure):
    """`struct trie` of trie_walk.c: the index's preorder arrays."""

    _fields_ = [
        ("byte", _P),
        ("depth", _P),
        ("size", _P),
        ("token", _P),
        ("max_depth", ctypes.c_int64),
    ]


_TRIES: dict[int, _Trie] = {}


def _trie(index: TokenizerIndex) -> _Trie:
    """The `struct trie` of `index`, made once and dropped with the index."""
    got = _TRIES.get(id(index))
    if got is None:
        got = _Trie(
            *(
                a.ctypes.data
                for a in (
                    index.pre_byte,
                    index.pre_depth,
                    index.pre_size,
                    index.pre_token,
                )
            ),
            index.depth_start.shape[0] - 2,
        )
        _TRIES[id(index)] = got
        weakref.finalize(index, _TRIES.pop, id(index), None)
    return got


class _Walk(threading.local):
    """What the running walk's row callback works on, per thread (one callback serves all)."""

    automaton: ByteAutomaton
    rows: np.ndarray  # the rows' addresses the C walk reads, held while it reads them
    address: int  # of `rows`
    error: BaseException | None


_WALK = _Walk()


@_FILL
def _fill(state: int, num_rows: ctypes._Pointer[ctypes.c_int64]) -> int:
    walk = _WALK
    try:
        walk.automaton.row(state)
        rows = walk.automaton.row_pointers()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller, ctypes would drop it
        walk.error = exc
        return 0
    if rows is not walk.rows:  # grown: a new array (`.ctypes` costs as much as a small row)
        walk.rows, walk.address = rows, rows.ctypes.data
    num_rows[0] = rows.shape[0]
    return walk.address


@functools.cache
def _c_fill(address: int) -> Callable[..., int]:
    """The row callback `dfa_rows` has in C (at `address`), as the walk's `fill` argument."""
    return _FILL(address)


def _walk(
    fn: Callable[..., int], args: tuple, automaton: ByteAutomaton, rows: np.ndarray
) -> tuple[int, BaseException | None]:
    """`fn(*args, fill)`, with the row callback in C where `dfa_rows` is built (the same
    steps as `_fill` without ctypes' conversions and Python frames), else `_fill`; returns
    what the walk returned and the first error a callback met."""
    native = dfa_rows()
    if native is not None:
        fill = _c_fill(native.begin_walk(automaton, rows))
        try:
            failed = fn(*args, fill)
        finally:
            error = native.end_walk()
        return failed, error
    walk = _WALK
    walk.automaton, walk.rows, walk.address, walk.error = automaton, rows, args[0], None
    try:
        return fn(*args, _fill), walk.error
    finally:
        del walk.automaton, walk.rows
        walk.error = None


def native_mask(
    fn: Callable[..., int], index: TokenizerIndex, automaton: ByteAutomaton, state: int
) -> np.ndarray:
    """Packed int32[num_words] mask of the tokens whose bytes `state` reads, one per trie node
    (`index.pre_token`: EOS and tokens that repeat a lower token's bytes not added), by the C
    walk `fn` over the automaton's rows (computing those it reaches first)."""
    trie = _trie(index)
    words = np.zeros(index.num_words + 1, dtype=np.uint32)  # the last: nodes without a token
    states = np.empty(trie.max_depth + 1, dtype=np.int32)
    rows = automaton.row_pointers()
    args = (
        rows.ctypes.data,
        rows.shape[0],
        ctypes.addressof(trie),
        state,
        states.ctypes.data,
        words.ctypes.data,
    )
    failed, error = _walk(fn, args, automaton, rows)
    if failed:
        raise error or RuntimeError(
            "the native trie walk met a row its automaton did not make (row_pointers() has no "
            "address for it after row())"
        )
    return words[:-1].view(np.int32)
