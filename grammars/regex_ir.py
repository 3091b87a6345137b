"""A small regular-expression tree: the IR every grammar source becomes.

IR nodes: `Chars` (a set of code points as sorted, disjoint ranges), `Seq`, `Alt`,
`Repeat(item, lo, hi)` (hi None = unbounded), `Dfa` (an explicit code point DFA, what the
regex algebra of `regex_algebra` builds, optionally with bounds on the length of its words)
and `Ref` (a grammar nonterminal, only inside context-free rules). Nodes compare by identity
so that the NFA builder can share a subtree compiled twice with the same continuation.

Python `re` syntax becomes IR in `regex_parse`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_CODEPOINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]


# Every node but `Ref` knows at construction, from its children's, whether it matches nothing
# and whether it matches the empty word: `facts` is (dead, nullable), None when unknown (under
# a `Ref`, a repeat with max < min, a `Dfa` whose length window needs work). The lazy NFA asks
# for them at every node it builds (`regex_facts`), so no compile walks its whole IR for them.
_FACTS = [(False, False), (False, True), (True, False), (True, True)]  # shared, not allocated


def set_facts(node, dead: bool, nullable: bool) -> None:
    object.__setattr__(node, "facts", _FACTS[2 * bool(dead) + bool(nullable)])


@dataclass(eq=False, init=False, slots=True, weakref_slot=True)  # slotted: see Seq below
class Chars:
    ranges: Ranges
    facts: tuple[bool, bool] | None = field(repr=False)

    def __init__(self, ranges: Ranges) -> None:
        self.ranges = ranges
        # dead when no code point in it has a UTF-8 encoding (surrogates, out of range)
        for lo, hi in ranges:
            if lo <= hi and ((lo <= 0xD7FF and hi >= 0) or (lo <= MAX_CODEPOINT and hi >= 0xE000)):
                self.facts = _FACTS[0]  # live, not nullable
                return
        self.facts = _FACTS[2]  # dead


def _bounded_repr(node, depth: int = 3) -> str:
    """`Kind(...)` written to `depth` levels: IR is a DAG (a free value shares each level with
    the next), which the dataclasses' own repr would write out as an exponential tree."""
    kids, name = children(node), type(node).__name__
    if not kids:  # a leaf (its dataclass repr), or an empty Seq or Alt
        return f"{name}()" if isinstance(node, (Seq, Alt)) else repr(node)
    if depth == 0:
        return f"{name}(<{len(kids)} items>)"
    inner = ", ".join(_bounded_repr(k, depth - 1) for k in kids[:8])
    more = f", <{len(kids) - 8} more>" if len(kids) > 8 else ""
    bounds = f", {node.lo}, {node.hi}" if isinstance(node, Repeat) else ""
    return f"{name}({inner}{more}{bounds})"


# Seq, Alt and Repeat, the nodes a compile makes by the ten thousand, are slotted and set
# their fields in their own __init__: no __dict__ (a third of the memory, one object for the
# cyclic collector instead of two) and no frozen dataclass __setattr__ (twice the time per
# node). Like every IR node they are never changed once made.
@dataclass(eq=False, repr=False, init=False, slots=True, weakref_slot=True)
class Seq:
    items: tuple
    facts: tuple[bool, bool] | None
    __repr__ = _bounded_repr

    def __init__(self, items: tuple) -> None:
        self.items = items
        dead, nullable = False, True
        for item in items:
            got = getattr(item, "facts", None)
            if got is None:
                self.facts = None
                return
            dead = dead or got[0]
            nullable = nullable and got[1]
        self.facts = _FACTS[2 * dead + nullable]


@dataclass(eq=False, repr=False, init=False, slots=True, weakref_slot=True)
class Alt:
    items: tuple
    facts: tuple[bool, bool] | None
    __repr__ = _bounded_repr

    def __init__(self, items: tuple) -> None:
        self.items = items
        dead, nullable = True, False
        for item in items:
            got = getattr(item, "facts", None)
            if got is None:
                self.facts = None
                return
            dead = dead and got[0]
            nullable = nullable or (got[1] and not got[0])
        self.facts = _FACTS[2 * dead + nullable]


@dataclass(eq=False, repr=False, init=False, slots=True, weakref_slot=True)
class Repeat:
    item: object
    lo: int
    hi: int | None
    facts: tuple[bool, bool] | None
    __repr__ = _bounded_repr

    def __init__(self, item: object, lo: int, hi: int | None) -> None:
        self.item, self.lo, self.hi = item, lo, hi
        got = getattr(item, "facts", None)
        if got is not None and (hi is None or hi >= lo):
            self.facts = _FACTS[2 * (lo > 0 and got[0]) + (lo == 0 or got[1])]
        else:
            self.facts = None


@dataclass(frozen=True, eq=False)
class Dfa:
    """Words that `table` (a `regex_dfa.DfaTable`) accepts from state `start` whose length in
    code points is in [lo, hi] (hi None = unbounded); `spell` writes one code point class as
    IR (a JSON string's escapes), None for the code points themselves."""

    table: object
    start: int
    lo: int = 0
    hi: int | None = None
    spell: Callable[[Chars], object] | None = None
    facts = None
    # Whether every string of JSON string text can be read from each of its states (a table
    # with a move on every code point, no length bound, text spelled as itself): the names
    # an object allows beside its declared ones. The trie walk then takes the text tokens
    # whole at a state that holds one (`trie_walk.c`).
    reads_any_text = False

    def __post_init__(self) -> None:
        live = self.table.known_live(self.start, 0, self.lo, self.hi)
        if live is not None:
            set_facts(self, not live, self.nullable)
        if (
            self.hi is None
            and getattr(self.table, "covers_text", False)
            and (self.spell is None or getattr(self.spell, "keeps_text", False))
        ):
            object.__setattr__(self, "reads_any_text", True)

    @property
    def nullable(self) -> bool:
        return self.lo == 0 and self.table.accepting[self.start]


@dataclass(frozen=True, eq=False)
class Ref:
    name: str


EMPTY = Seq(())


def normalize(ranges) -> Ranges:
    """Sort and merge code point ranges."""
    if type(ranges) is tuple:  # most often already sorted and merged: returned as it is
        prev = -2
        for r in ranges:
            if type(r) is not tuple or r[0] <= prev + 1 or r[1] < r[0]:
                break
            prev = r[1]
        else:
            return ranges
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def complement(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return tuple(out)


def subtract(a: Ranges, b: Ranges) -> Ranges:
    return intersect(a, complement(b))


def intersect(a: Ranges, b: Ranges) -> Ranges:
    a, b = normalize(a), normalize(b)
    out, i, j, na, nb = [], 0, 0, len(a), len(b)
    while i < na and j < nb:  # a merge of the two sorted lists (called by the thousand)
        (alo, ahi), (blo, bhi) = a[i], b[j]
        lo, hi = alo if alo > blo else blo, ahi if ahi < bhi else bhi
        if lo <= hi:
            out.append((lo, hi))
        if ahi < bhi:
            i += 1
        else:
            j += 1
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _char(c: str) -> Chars:
    return Chars(((ord(c), ord(c)),))


@functools.lru_cache(maxsize=4096)
def shared_chars(ranges: Ranges) -> Chars:
    """One `Chars` node per (normalized) ranges, shared: the NFA makes one for each class an
    explicit DFA reads, in every grammar whose DFA has that class."""
    return Chars(ranges)


@functools.lru_cache(maxsize=8192)
def literal(text: str) -> Seq:
    """IR matching exactly `text` (one shared node per character: large enums stay small DAGs;
    one shared node per text: property names and punctuation recur in every schema)."""
    return Seq(tuple(map(_char, text)))


def seq(*items) -> Seq:
    return Seq(tuple(items))


def alt(*items) -> Alt:
    return Alt(tuple(items))


def opt(item) -> Repeat:
    return Repeat(item, 0, 1)


def star(item) -> Repeat:
    return Repeat(item, 0, None)


def word_prefix(node) -> str:
    """Text that every word of `node` starts with: its leading one-code-point characters, read
    through nested sequences ('' when it starts with anything else; never more than the words
    share)."""
    out: list[str] = []
    todo = [node]
    while todo:
        item = todo.pop()
        if isinstance(item, Seq):
            todo.extend(reversed(item.items))
        elif (
            isinstance(item, Chars)
            and len(item.ranges) == 1
            and item.ranges[0][0] == item.ranges[0][1]
        ):
            out.append(chr(item.ranges[0][0]))
        else:
            break
    return "".join(out)


def children(node) -> tuple:
    """The IR nodes directly inside `node` (none for Chars, Dfa and Ref)."""
    if isinstance(node, (Seq, Alt)):
        return node.items
    return (node.item,) if isinstance(node, Repeat) else ()


def fold(
    root,
    memo: dict,
    value: Callable[[object, list], object],
    tick: Callable[[], None] | None = None,
    known: Callable[[object], object] | None = None,
) -> object:
    """`value(node, [values of its children])` for `root`, computed bottom-up over the IR DAG
    with a loop (deep schemas nest IR hundreds of levels) and kept in `memo` by node id, for
    every node below it too; `tick()` runs once per new node (a clock). A node for which
    `known(node)` is not None has that value, and its children are not visited."""
    stack = [root]
    while stack:
        node = stack[-1]
        if id(node) in memo:
            stack.pop()
            continue
        if known is not None:
            got = known(node)
            if got is not None:
                memo[id(node)] = got
                stack.pop()
                continue
        size = len(stack)
        kids = children(node)
        stack.extend(k for k in kids if id(k) not in memo)
        if len(stack) > size:
            continue
        stack.pop()
        memo[id(node)] = value(node, [memo[id(k)] for k in kids])
        if tick is not None:
            tick()
    return memo[id(root)]


def map_chars(node, fn, memo: dict | None = None):
    """Copy of `node` with every `Chars` leaf replaced by `fn(leaf)` (shared subtrees stay shared)."""
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key][1]
    if isinstance(node, Chars):
        out = fn(node)
    elif isinstance(node, Seq):
        out = Seq(tuple(map_chars(i, fn, memo) for i in node.items))
    elif isinstance(node, Alt):
        out = Alt(tuple(map_chars(i, fn, memo) for i in node.items))
    elif isinstance(node, Repeat):
        out = Repeat(map_chars(node.item, fn, memo), node.lo, node.hi)
    elif isinstance(node, Dfa):
        inner = node.spell
        spell = fn if inner is None else lambda c: map_chars(inner(c), fn)
        out = Dfa(node.table, node.start, node.lo, node.hi, spell)
    else:
        out = node
    memo[key] = (node, out)
    return out


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split code points lo..hi into UTF-8 byte-range sequences (surrogates excluded)."""
    out: list[list[tuple[int, int]]] = []
    for a, b in intersect(((lo, hi),), ((0, 0xD7FF), (0xE000, MAX_CODEPOINT))):
        for lim_lo, lim_hi in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODEPOINT)):
            x, y = max(a, lim_lo), min(b, lim_hi)
            if x <= y:
                _split_same_length(x, y, out)
    return out


def _split_same_length(lo: int, hi: int, out: list) -> None:
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _split_same_length(lo, lo | m, out)
                _split_same_length((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split_same_length(lo, (hi & ~m) - 1, out)
                _split_same_length(hi & ~m, hi, out)
                return
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(list(zip(a, b, strict=True)))
