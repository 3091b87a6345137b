"""The trie walk in C (`trie_walk.c`), built on first use (`native_build`), with the numpy walk
as its twin.

The numpy walk (`masks`) goes one trie depth at a time, a dozen array calls per depth; the C
walk goes depth-first and skips a dead node's subtree in one step, so a mask costs about the
nodes it reaches alive. The C walk reads the automaton's rows where they are kept (through
`row_pointers()`, no copy): it hands back the nodes whose parent's row is not computed yet,
Python computes those rows and hands the nodes back, one round per level of new rows.
`describe()` says which walk is in use.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .automaton import ByteAutomaton
from .native_build import load_native
from .tokenizer_index import TokenizerIndex

SOURCE = Path(__file__).with_name("trie_walk.c")
_P = ctypes.c_void_p
_ARGTYPES = (_P, ctypes.c_int64, _P, _P, ctypes.c_int64, _P, _P, _P)


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


def native_mask(
    fn: Callable[..., int], index: TokenizerIndex, automaton: ByteAutomaton, state: int
) -> np.ndarray:
    """Packed int32[num_words] mask of the tokens whose bytes `state` reads, one per trie node
    (`index.pre_token`: EOS and tokens that repeat a lower token's bytes not added), by the C
    walk `fn` over the automaton's rows (computing those it reaches first)."""
    trie = _trie(index)
    words = np.zeros(index.num_words + 1, dtype=np.uint32)  # the last: nodes without a token
    first_pending = trie.max_depth + 1
    first_missing = first_pending + 2 * index.num_nodes
    scratch = np.empty(first_missing + index.num_nodes, dtype=np.int32)
    num_missing = np.zeros(1, dtype=np.int64)
    roots = np.array([0, state], dtype=np.int32)  # (node, parent's state) pairs
    out = (scratch.ctypes.data, words.ctypes.data, num_missing.ctypes.data)
    while True:
        rows = automaton.row_pointers()  # held while the walk reads it (growth replaces it)
        pending = fn(
            rows.ctypes.data,
            rows.shape[0],
            ctypes.addressof(trie),
            roots.ctypes.data,
            roots.shape[0] // 2,
            *out,
        )
        if not pending:
            break
        roots = scratch[first_pending : first_pending + 2 * pending].copy()
        missing = scratch[first_missing : first_missing + int(num_missing[0])]
        for parent in set(missing.tolist()):
            automaton.row(parent)
    return words[:-1].view(np.int32)
