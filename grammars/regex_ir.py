"""A small regular-expression tree (the IR every grammar source becomes) and Python `re` parsing.

IR nodes: `Chars` (a set of code points as sorted, disjoint ranges), `Seq`, `Alt`,
`Repeat(item, lo, hi)` (hi None = unbounded), `Dfa` (an explicit code point DFA, what the
regex algebra of `regex_algebra` builds, optionally with bounds on the length of its words)
and `Ref` (a grammar nonterminal, only inside context-free rules). Nodes compare by identity
so that the NFA builder can share a subtree compiled twice with the same continuation.

`parse_regex` reads Python `re` syntax with the stdlib parser and accepts its regular subset:
back-references, look-arounds, conditionals, atomic groups, possessive repeats and anchors
anywhere but at the ends raise `ValueError`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

try:  # Python >= 3.11
    from re import _constants as sre_c
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MAX_CODEPOINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]


# Every node but `Ref` knows at construction, from its children's, whether it matches nothing
# and whether it matches the empty word: `facts` is (dead, nullable), None when unknown (under
# a `Ref`, a repeat with max < min, a `Dfa` whose length window needs work). The lazy NFA asks
# for them at every node it builds (`regex_facts`), so no compile walks its whole IR for them.
_FACTS = [(False, False), (False, True), (True, False), (True, True)]  # shared, not allocated


def set_facts(node, dead: bool, nullable: bool) -> None:
    object.__setattr__(node, "facts", _FACTS[2 * bool(dead) + bool(nullable)])


@dataclass(frozen=True, eq=False)
class Chars:
    ranges: Ranges
    facts = None

    def __post_init__(self) -> None:
        # dead when no code point in it has a UTF-8 encoding (surrogates, out of range)
        live = any(
            lo <= hi and ((lo <= 0xD7FF and hi >= 0) or (lo <= MAX_CODEPOINT and hi >= 0xE000))
            for lo, hi in self.ranges
        )
        set_facts(self, not live, False)


@dataclass(frozen=True, eq=False)
class Seq:
    items: tuple
    facts = None

    def __post_init__(self) -> None:
        dead, nullable = False, True
        for item in self.items:
            got = getattr(item, "facts", None)
            if got is None:
                return
            dead = dead or got[0]
            nullable = nullable and got[1]
        set_facts(self, dead, nullable)


@dataclass(frozen=True, eq=False)
class Alt:
    items: tuple
    facts = None

    def __post_init__(self) -> None:
        dead, nullable = True, False
        for item in self.items:
            got = getattr(item, "facts", None)
            if got is None:
                return
            dead = dead and got[0]
            nullable = nullable or (got[1] and not got[0])
        set_facts(self, dead, nullable)


@dataclass(frozen=True, eq=False)
class Repeat:
    item: object
    lo: int
    hi: int | None
    facts = None

    def __post_init__(self) -> None:
        got = getattr(self.item, "facts", None)
        if got is not None and (self.hi is None or self.hi >= self.lo):
            set_facts(self, self.lo > 0 and got[0], self.lo == 0 or got[1])


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

    def __post_init__(self) -> None:
        live = self.table.known_live(self.start, 0, self.lo, self.hi)
        if live is not None:
            set_facts(self, not live, self.nullable)

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
    out, i, j = [], 0, 0
    a, b = normalize(a), normalize(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _char(c: str) -> Chars:
    return Chars(((ord(c), ord(c)),))


@functools.lru_cache(maxsize=8192)
def literal(text: str) -> Seq:
    """IR matching exactly `text` (one shared node per character: large enums stay small DAGs;
    one shared node per text: property names and punctuation recur in every schema)."""
    return Seq(tuple(map(_char, text)))


def chars(spec: str) -> Chars:
    """IR for one character of a regex class body, e.g. chars('0-9a-f')."""
    return _to_ir(list(sre_parse.parse(f"[{spec}]")), 0)


def seq(*items) -> Seq:
    return Seq(tuple(items))


def alt(*items) -> Alt:
    return Alt(tuple(items))


def opt(item) -> Repeat:
    return Repeat(item, 0, 1)


def star(item) -> Repeat:
    return Repeat(item, 0, None)


@functools.cache
def _unicode_class(pattern: str) -> Ranges:
    """Code point ranges matched by a one-character `re` pattern like r'\\d' (Unicode mode)."""
    return tuple((m.start(), m.end() - 1) for m in re.finditer(pattern + "+", _every_char()))


def warm_unicode_classes() -> None:
    """Find the Unicode \\d, \\w and \\s classes now (a scan of every code point, ~25 ms
    each, once per process), so that no compile pays it: GrammarCompiler calls this."""
    for kind in _ASCII_CLASSES:
        _unicode_class("\\" + kind)


def _every_char() -> str:
    """Every code point in order, surrogates included (decoded in one call: a Python loop
    over chr() takes ten times longer)."""
    points = np.arange(MAX_CODEPOINT + 1, dtype="<u4").tobytes()
    return points.decode("utf-32-le", "surrogatepass")


_ASCII_CLASSES = {
    "d": ((48, 57),),
    "w": ((48, 57), (65, 90), (95, 95), (97, 122)),
    "s": ((9, 13), (32, 32)),
}


# Not an `re` flag (those stop at 256): JSON Schema's patterns are ECMA-262 regexes, whose
# \d and \w are the ASCII classes whatever the flags (\s stays `re`'s Unicode class).
_ECMA_CLASSES = 1 << 20


def _category(cat, flags: int) -> Ranges:
    name = str(cat).lower()
    kind = "d" if "digit" in name else "w" if "word" in name else "s"
    ascii_only = flags & re.ASCII or (flags & _ECMA_CLASSES and kind != "s")
    base = _ASCII_CLASSES[kind] if ascii_only else _unicode_class("\\" + kind)
    return complement(base) if "not" in name else base


def _fold_case(ranges: Ranges) -> Ranges:
    extra = []
    for lo, hi in ranges:
        if hi - lo > 5000:
            extra.extend(_fold_case(intersect(((lo, hi),), ((0, 0x24F),))))
            continue
        for cp in range(lo, hi + 1):
            c = chr(cp)
            for v in (c.lower(), c.upper()):
                if len(v) == 1:
                    extra.append((ord(v), ord(v)))
    return normalize(list(ranges) + extra)


def _in_ranges(items, flags: int) -> Ranges:
    out: list[tuple[int, int]] = []
    negate = False
    for op, av in items:
        if op is sre_c.NEGATE:
            negate = True
        elif op is sre_c.LITERAL:
            out.append((av, av))
        elif op is sre_c.RANGE:
            out.append(av)
        elif op is sre_c.CATEGORY:
            out.extend(_category(av, flags))
        else:
            raise ValueError(f"unsupported item in character class: {op}")
    ranges = normalize(out)
    if flags & re.IGNORECASE:
        ranges = _fold_case(ranges)
    return complement(ranges) if negate else ranges


def _set(ranges: Ranges, flags: int) -> Chars:
    if flags & re.IGNORECASE:
        ranges = _fold_case(ranges)
    return Chars(normalize(ranges))


_UNSUPPORTED = {
    "GROUPREF": "back-references",
    "GROUPREF_EXISTS": "conditional groups",
    "ASSERT": "look-ahead/look-behind assertions",
    "ASSERT_NOT": "negative look-ahead/look-behind assertions",
    "ATOMIC_GROUP": "atomic groups",
    "POSSESSIVE_REPEAT": "possessive repeats",
}


def _to_ir(items, flags: int):
    parts = []
    for op, av in items:
        name = str(op)
        if op is sre_c.LITERAL:
            parts.append(_set(((av, av),), flags))
        elif op is sre_c.NOT_LITERAL:
            parts.append(Chars(complement(_set(((av, av),), flags).ranges)))
        elif op is sre_c.ANY:
            parts.append(
                Chars(((0, MAX_CODEPOINT),) if flags & re.DOTALL else complement(((10, 10),)))
            )
        elif op is sre_c.IN:
            parts.append(Chars(_in_ranges(av, flags)))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            parts.append(Repeat(_to_ir(sub, flags), lo, None if hi == sre_c.MAXREPEAT else hi))
        elif op is sre_c.SUBPATTERN:
            _group, add, remove, sub = av
            parts.append(_to_ir(sub, (flags | add) & ~remove))
        elif op is sre_c.BRANCH:
            parts.append(Alt(tuple(_to_ir(b, flags) for b in av[1])))
        elif op is sre_c.AT:
            raise ValueError(f"anchor {av} is only supported at the start or end of a regex")
        elif name in _UNSUPPORTED:
            raise ValueError(f"regex uses {_UNSUPPORTED[name]}, which are not regular")
        else:
            raise ValueError(f"unsupported regex construct {name}")
    return parts[0] if len(parts) == 1 else Seq(tuple(parts))


_STARTS = ("AT_BEGINNING", "AT_BEGINNING_STRING")
_ENDS = ("AT_END", "AT_END_STRING")


def _strip_anchors(items: list) -> tuple[list, bool, bool]:
    """Remove a leading ^/\\A and a trailing $/\\Z; report which were present."""
    start = end = False
    if items and items[0][0] is sre_c.AT and str(items[0][1]) in _STARTS:
        items, start = items[1:], True
    if items and items[-1][0] is sre_c.AT and str(items[-1][1]) in _ENDS:
        items, end = items[:-1], True
    return items, start, end


# Schemas repeat patterns (formats, the same `pattern` in every item of a list) and IR is
# immutable, so a pattern's IR is parsed once and shared.
@functools.lru_cache(maxsize=1024)
def _parse(pattern: str, flags: int, search: bool):
    try:
        tree = sre_parse.parse(pattern, flags)
    except (re.error, OverflowError) as exc:  # OverflowError: a repeat count past 2**32 - 2
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    flags = tree.state.flags | (_ECMA_CLASSES if search else 0)
    items = list(tree)
    # A top-level alternation anchors each branch on its own.
    branches = (
        [list(b) for b in items[0][1][1]]
        if (len(items) == 1 and items[0][0] is sre_c.BRANCH)
        else [items]
    )
    anything = Repeat(Chars(((0, MAX_CODEPOINT),)), 0, None)
    out = []
    for branch in branches:
        branch, start, end = _strip_anchors(branch)
        node = _to_ir(branch, flags) if branch else EMPTY
        if search:
            node = Seq(((EMPTY if start else anything), node, (EMPTY if end else anything)))
        out.append(node)
    return out[0] if len(out) == 1 else Alt(tuple(out))


def parse_regex(pattern: str, flags: int = 0):
    """IR for strings that `re.fullmatch(pattern, s, flags)` accepts."""
    return _parse(pattern, flags, search=False)


def parse_search_regex(pattern: str, flags: int = 0):
    """IR for strings in which `re.search(pattern, s, flags)` finds a match (JSON Schema),
    with ECMA-262's ASCII \\d and \\w, as JSON Schema's patterns are ECMA-262 regexes."""
    return _parse(pattern, flags, search=True)


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
