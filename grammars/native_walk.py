"""The trie walk in C (`trie_walk.c`), built on first use (`native_build`), with the numpy walk
as its twin.

The numpy walk (`masks`) goes one trie depth at a time, a dozen array calls per depth; the C
walk goes depth-first and skips a dead node's subtree in one step, so a mask costs about the
nodes it reaches alive. The C walk reads the automaton's rows where they are kept (through
`row_pointers()`, no copy); where a row is not computed yet it calls back into Python, which
computes it and hands back the rows' addresses, and the walk goes on from the same node (the
callback is in C where `dfa_rows` is built, else a ctypes callback into `_fill`). Under a
state that reads JSON string text (free string content, object names beside declared ones) it
takes the text tokens of a subtree whole and walks only the nodes that are not text, as the
numpy walk does (`masks`); what it learns of which states read text is kept per automaton
(`TextStates`): a free string's mask reads the few nodes that are not text, not the whole trie.
So it does under a state from which every string of text can be read (the automaton's
`any_text` flags: an object's names where undeclared ones are allowed), stepping down only to
the nodes that are not text: the first name of a Kubernetes object makes a few rows, not one
per prefix of its declared names. `describe()` says which walk is in use.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .automaton import ByteAutomaton
from .native_build import load_native
from .native_rows import dfa_rows
from .tokenizer_index import NEXT_PHASE, NOT_TEXT, NUM_PHASES, TokenizerIndex

SOURCE = Path(__file__).with_name("trie_walk.c")
# A subtree gets a packed row from a mask's words / TEXT_ROW_DIVISOR text tokens on: or-ing a
# row goes several words an instruction, setting bits one token at a time does not (masks at
# the first key of a Kubernetes object 3-7% cheaper than at one mask's words; rows of 0.6 MB for
# SmolLM2's tokenizer, 1.4 MB for Llama-3's).
TEXT_ROW_DIVISOR = 8
_P = ctypes.c_void_p
# int64_t fill(int32_t state, int64_t *num_rows): the rows' addresses once state's row is made
_FILL = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64))
_ARGTYPES = (_P, ctypes.c_int64, _P, ctypes.c_int32, _P, _P, _FILL, _P, _P)


def _load(lib: Path) -> Callable[..., int]:
    # Called with the GIL held (PyDLL): a walk makes rows through Python objects, and a walk
    # that let go of the GIL would take it back for each row, where another thread (the
    # reaper, a compile) may hold it: a first key mask in a process that frees evicted
    # grammars took 0.150 ms so, 0.131 with the GIL held.
    fn = ctypes.PyDLL(str(lib)).rf_trie_walk
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
    """`struct trie` of trie_walk.c: the index's preorder arrays and its text subtrees'."""

    _fields_ = [
        ("byte", _P),
        ("depth", _P),
        ("size", _P),
        ("token", _P),
        ("max_depth", ctypes.c_int64),
        ("phase", _P),
        ("rough_next", _P),
        ("up_phase", _P),
        ("words_of", _P),
        ("text_words", _P),
        ("num_words", ctypes.c_int64),
        ("next_phase", _P),
        ("num_phases", ctypes.c_int64),
    ]


@dataclass
class _TextTrie:
    """What the C walk's text shortcut reads of an index, by preorder number (see trie_walk.c):
    the arrays the `struct trie` points into are held here."""

    phase: np.ndarray  # uint8[num_nodes]
    rough_next: np.ndarray  # int32[num_nodes + 1]
    up_phase: np.ndarray  # uint8[num_nodes]
    words_of: np.ndarray  # int32[num_nodes]
    text_words: np.ndarray  # uint32[rows, num_words]


def _text_trie(index: TokenizerIndex) -> _TextTrie:
    """Text subtrees of `index` for the C walk. A subtree with at least a mask's words /
    TEXT_ROW_DIVISOR text tokens (or-ing its packed row costs less than setting their bits one
    by one), and the whole trie, get a packed row of their text tokens."""
    n = index.num_nodes
    order = np.empty(n, dtype=np.int64)
    order[index.pre] = np.arange(n)
    text = index.text_phase != NOT_TEXT
    rough = np.flatnonzero(~text & text[index.parent])
    rough_pre = np.sort(index.pre[rough])
    bounds = np.append(rough_pre, n)
    rough_next = bounds[np.searchsorted(rough_pre, np.arange(n + 1))].astype(np.int32)
    up_phase = np.full(n, NOT_TEXT, dtype=np.uint8)
    up_phase[index.pre[rough]] = index.text_phase[index.parent[rough]]
    spelled = (index.pre_token < index.num_words * 32) & text[order]  # text tokens, preorder
    before = np.concatenate([[0], np.cumsum(spelled)])
    count = before[index.pre_size + np.arange(n)] - before[:n]
    big = np.flatnonzero(count >= index.num_words // TEXT_ROW_DIVISOR)
    big = np.union1d(big, [0])  # the whole trie: a walk from a state that reads text
    words_of = np.full(n, -1, dtype=np.int32)
    words_of[big] = np.arange(big.shape[0])
    rows = np.zeros((big.shape[0], index.num_words * 32), dtype=bool)
    for k, p in enumerate(big.tolist()):
        tokens = index.pre_token[p : p + int(index.pre_size[p])]
        rows[k, tokens[spelled[p : p + int(index.pre_size[p])]]] = True
    text_words = np.packbits(rows, axis=1, bitorder="little").view("<u4")
    return _TextTrie(index.text_phase[order], rough_next, up_phase, words_of, text_words)


class _TrieView:
    """The `struct trie` of an index with the arrays it points into."""

    def __init__(self, index: TokenizerIndex):
        self.text = text = _text_trie(index)
        self.struct = _Trie(
            *(a.ctypes.data for a in (index.pre_byte, index.pre_depth, index.pre_size)),
            index.pre_token.ctypes.data,
            index.depth_start.shape[0] - 2,
            text.phase.ctypes.data,
            text.rough_next.ctypes.data,
            text.up_phase.ctypes.data,
            text.words_of.ctypes.data,
            text.text_words.ctypes.data,
            index.num_words,
            NEXT_PHASE.ctypes.data,
            NUM_PHASES,
        )


_TRIES: dict[int, _TrieView] = {}


def _trie(index: TokenizerIndex) -> _TrieView:
    """The `struct trie` of `index`, made once and dropped with the index."""
    got = _TRIES.get(id(index))
    if got is None:
        got = _TRIES[id(index)] = _TrieView(index)
        weakref.finalize(index, _TRIES.pop, id(index), None)
    return got


def prepare(index: TokenizerIndex) -> None:
    """Make the C walk (built on first use) and `index`'s trie for it now: the first mask of
    every process otherwise waits for them (milliseconds; seconds where the walk is built)."""
    if trie_walk() is not None:
        _trie(index)


class _TextCache(ctypes.Structure):
    """`struct text_cache` of trie_walk.c."""

    _fields_ = [
        ("index", _P),
        ("cap", ctypes.c_int64),
        ("states", _P),
        ("rows_cap", ctypes.c_int64),
        ("rows_used", _P),
        ("any_text", _P),
        ("any_text_cap", ctypes.c_int64),
    ]


class TextStates:
    """Per automaton state, what the C walk learnt of whether it reads text (and its state
    per UTF-8 phase where it does), kept between walks. Before each walk it is grown, where it
    has no room for every state the automaton has room for, to twice that, so that most
    states a walk makes are kept too (the walk works out the others again each time)."""

    def __init__(self) -> None:
        self.index = np.zeros(0, dtype=np.int32)  # 0 unknown, -1 no, k: row k - 1 of states
        self.states = np.zeros((0, NUM_PHASES), dtype=np.int32)
        self.used = np.zeros(1, dtype=np.int64)
        self.struct = _TextCache(0, 0, 0, 0, self.used.ctypes.data, 0, 0)
        # the automaton's `any_text` flags the walk reads, held: the automaton replaces its
        # array as it grows, and a walk goes on reading the one it was handed
        self.any_text: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.states.nbytes

    def reserve(self, num_states: int, any_text: np.ndarray | None) -> None:
        """Room for at least `num_states` states (twice that when it grows), and rows for 16
        more states that read text (as many again as are used when it grows); the walk reads
        the automaton's `any_text` flags (`ByteAutomaton.any_text`) from this array."""
        if any_text is not self.any_text:
            self.any_text = any_text
            self.struct.any_text = 0 if any_text is None else any_text.ctypes.data
            self.struct.any_text_cap = 0 if any_text is None else any_text.shape[0]
        if self.index.shape[0] < num_states:
            index = np.zeros(max(2 * num_states, 256), dtype=np.int32)
            index[: self.index.shape[0]] = self.index
            self.index = index
            self.struct.index, self.struct.cap = index.ctypes.data, index.shape[0]
        used = int(self.used[0])
        if self.states.shape[0] < used + 16:
            states = np.zeros((max(2 * used, 64), NUM_PHASES), dtype=np.int32)
            states[:used] = self.states[:used]
            self.states = states
            self.struct.states, self.struct.rows_cap = states.ctypes.data, states.shape[0]


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
    fn: Callable[..., int], args: tuple, cache: int, automaton: ByteAutomaton, rows: np.ndarray
) -> tuple[int, BaseException | None]:
    """`fn(*args, fill, cache, lexer)`, with the row callback in C where `dfa_rows` is built
    (the same steps as `_fill` without ctypes' conversions and Python frames), and for a
    grammar automaton the callbacks that walk its lexer's rows as pairs (`lexer`, see
    trie_walk.c), else `_fill` and no pairs; returns what the walk returned and the first
    error a callback met."""
    native = dfa_rows()
    if native is not None:
        fill, lexer = native.begin_walk(automaton, rows, automaton.native_rows)
        try:
            steps = fn(*args, _c_fill(fill), cache, lexer or None)
        finally:
            error = native.end_walk()
        return steps, error
    walk = _WALK
    walk.automaton, walk.rows, walk.address, walk.error = automaton, rows, args[0], None
    try:
        return fn(*args, _fill, cache, None), walk.error
    finally:
        del walk.automaton, walk.rows
        walk.error = None


def native_mask(
    fn: Callable[..., int],
    index: TokenizerIndex,
    automaton: ByteAutomaton,
    text: TextStates,
    state: int,
) -> tuple[np.ndarray, int]:
    """Packed int32[num_words] mask of the tokens whose bytes `state` reads, one per trie node
    (`index.pre_token`: EOS and tokens that repeat a lower token's bytes not added), by the C
    walk `fn` over the automaton's rows (computing those it reaches first), with the number
    of trie nodes the walk stepped through. `text` holds what walks learnt of the automaton's
    states that read text."""
    trie = _trie(index)
    words = np.zeros(index.num_words + 1, dtype=np.uint32)  # the last: nodes without a token
    states = np.empty(trie.struct.max_depth + 1, dtype=np.int32)
    rows = automaton.row_pointers()
    text.reserve(rows.shape[0], automaton.any_text(2 * rows.shape[0]))
    args = (
        rows.ctypes.data,
        rows.shape[0],
        ctypes.addressof(trie.struct),
        state,
        states.ctypes.data,
        words.ctypes.data,
    )
    steps, error = _walk(fn, args, ctypes.addressof(text.struct), automaton, rows)
    if steps < 0:
        raise error or RuntimeError(
            "the native trie walk met a row its automaton did not make (row_pointers() has no "
            "address for it after row())"
        )
    return words[:-1].view(np.int32), steps
