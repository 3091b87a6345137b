"""Boolean operations and length bounds on regex IR, through Brzozowski derivatives.

The regex IR has no intersection or complement, yet JSON Schema needs them: `pattern` together
with `minLength`/`maxLength`, property names that match a `patternProperties` pattern but are
not declared, names that match no pattern. Here an IR becomes an interned term, terms are
derived by one code point at a time (over a partition of the code points into classes that
derive alike; `regex_terms`), and the explored product automaton is handed on as a `Dfa` IR
node (`regex_dfa`), which the NFA walks lazily, length bounds as a count of code points. The
exploration is a worklist, so no input can exhaust the stack, and its size is bounded by
`max_states` like any automaton of the grammar.

`search` matches text against a pattern the same way, one derivative per character: linear
in the text, where Python's backtracking `re` can take exponential time on a request's pattern.
"""

from __future__ import annotations

import functools
import math
import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from .budget import GrammarLimits
from .native_rows import dfa_rows
from .nfa import Deadline
from .regex_dfa import DfaTable
from .regex_ir import (
    MAX_CODEPOINT,
    Alt,
    Chars,
    Dfa,
    Ranges,
    Repeat,
    literal,
    normalize,
)
from .regex_parse import parse_search_regex
from .regex_terms import NEVER, NEVER_TERM, Terms, regex_derivs

ANY_CHAR = ((0, MAX_CODEPOINT),)
MAX_STATES = GrammarLimits().max_states  # the default of the grammar_max_states knob


def search(pattern: str, text: str, deadline: Deadline | None = None) -> bool:
    """Whether `re.search(pattern, text)` finds a match (ValueError if `pattern` is not regular)."""
    return matches(parse_search_regex(pattern), text, deadline)


def matches(ir, text: str, deadline: Deadline | None = None) -> bool:
    """Whether `text` (code points) is a word of `ir`, in time linear in the text."""
    terms = Terms(deadline)
    t = terms.term(ir)
    for ch in text:
        terms.deadline.check()
        t = terms.deriv(t, ord(ch))
        if t == NEVER_TERM:
            return False
    return terms.nullable(t)


def restrict_length(ir, lo: int, hi: int | None, deadline: Deadline | None = None):
    """IR for the words of `ir` whose length in code points is in [lo, hi] (hi None: no cap)."""
    terms = Terms(deadline)
    start = terms.term(ir)
    shortest, longest = terms.lengths(start)
    if shortest >= lo and (hi is None or longest <= hi):
        return ir
    if longest < lo or (hi is not None and shortest > hi):
        return NEVER
    kind, *fields = terms.node(start)
    if kind == "r" and terms.node(fields[0])[0] == "c":  # a class repeated: bound the count
        item, r_lo, r_hi = fields
        caps = [v for v in (r_hi, hi) if v is not None]
        return Repeat(Chars(terms.node(item)[1]), max(r_lo, lo), min(caps) if caps else None)
    table = explore(terms, (start,), lambda got: got[0])
    if table is None or not table.live(0, 0, lo, hi, terms.deadline.check):
        return NEVER
    return Dfa(table, 0, lo, hi)


def exclude_words(ir, words: Sequence[str], deadline: Deadline | None = None):
    """IR for the words of `ir` other than `words`.

    When `ir` is any string or an unbounded explicit DFA (an object's names, those of its
    `patternProperties`), the result is that DFA walked beside a trie of `words`: one state
    per trie node and per DFA state, built in time linear in both. Other IR goes through the
    generic product of derivatives (`combine`).
    """
    if not words:
        return ir
    table = _as_table(ir)
    if table is None:
        banned = Alt(tuple(literal(w) for w in dict.fromkeys(words)))
        return combine([ir, banned], lambda got: got[0] and not got[1], deadline)
    deadline = deadline or Deadline(None)
    if table[0] is _ANY_TABLE:
        return Dfa(_all_but(tuple(dict.fromkeys(words))), 0)
    kids, ends = _trie(words, deadline)
    out = _without_trie(table[0], table[1], kids, ends, deadline)
    return NEVER if out is None else Dfa(out, 0)


_ANY_TABLE = DfaTable([((ANY_CHAR, 0),)], [True], covers_text=True)


def _as_table(ir) -> tuple[DfaTable, int] | None:
    """(table, start) of `ir` when it is any string or a `Dfa` without bounds or spelling."""
    if isinstance(ir, Dfa) and ir.lo == 0 and ir.hi is None and ir.spell is None:
        return ir.table, ir.start
    if (
        isinstance(ir, Repeat)
        and (ir.lo, ir.hi) == (0, None)
        and isinstance(ir.item, Chars)
        and ir.item.ranges == ANY_CHAR
    ):
        return _ANY_TABLE, 0
    return None


Trie = tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[bool, ...]]


def _trie(words: Sequence[str], deadline: Deadline) -> Trie:
    """The trie of `words`: per node (0 the root) its (code point, child)s in code point
    order, and whether a word ends there. Built from the words sorted, so that each node's
    children come in order and each word starts from the nodes of the one before it (in C
    where `regex_derivs` is built, in time linear in the words' length)."""
    native = regex_derivs()
    if native is not None:
        return native.trie(sorted(words))
    kids: list[list[tuple[int, int]]] = [[]]
    ends = [False]
    path = [0]  # the nodes along the word before, from the root
    before = ""
    for i, word in enumerate(sorted(words)):
        if i % 256 == 0:
            deadline.check()
        common = 0
        for a, b in zip(before, word, strict=False):
            if a != b:
                break
            common += 1
        del path[common + 1 :]
        node = path[common]
        for ch in word[common:]:
            child = len(kids)
            kids[node].append((ord(ch), child))
            kids.append([])
            ends.append(False)
            path.append(child)
            node = child
        ends[node] = True
        before = word
    return tuple(map(tuple, kids)), tuple(ends)


@functools.lru_cache(maxsize=1024)
def _all_but(words: tuple[str, ...]) -> DfaTable:
    """Every string but `words`: the nodes of their trie, then one state past the trie (every
    node has a code point that leaves the trie, so each can reach acceptance). Each node's
    row is made when a walk first reads it; tables are shared by the requests that exclude
    the same names (an object's declared names, often the same across schemas)."""
    moves, ends = _trie(words, Deadline(None))
    past = len(moves)
    # Tuples of ints and floats: Python's cyclic collector stops tracking them, where each list
    # (or dict) would be scanned, item by item, by every full collection for as long as the
    # table is cached (hundreds of tables, thousands of trie nodes).
    shortest = (*map(int, ends), 0)
    accepting = (*map(operator.not_, ends), True)
    lengths = (shortest, (math.inf,) * (past + 1))
    return DfaTable(_AllButRows(moves, past), accepting, lengths, covers_text=True)


class _AllButRows(list):
    """The rows of `_all_but`'s table, each made on first use: a list of the rows made so far
    (None for the others) that makes a missing one when indexed, so that the C rows read a made
    one in place (`dfa_rows.c_dfa_moves`). It holds tuples of ints and None only, and is kept
    out of the cyclic collector's sight (`untrack_lists`) for as long as the table is cached."""

    def __init__(self, kids: tuple[tuple[tuple[int, int], ...], ...], past: int):
        super().__init__([None] * past)
        self.append(((ANY_CHAR, past),))
        native = dfa_rows()
        # per trie node, its (code point, child)s in code point order (tuples of ints)
        self._kids = kids if native is None else native.untracked(kids)
        if native is not None:
            native.untrack_lists(self)

    def __getitem__(self, s):  # an int, as DfaTable's readers index it
        row = super().__getitem__(s)
        if row is None:
            children = self._kids[s]
            out = [(((cp, cp),), child) for cp, child in children]
            out.append((_punch(ANY_CHAR, [cp for cp, _ in children]), len(self) - 1))
            row = tuple(out)
            self[s] = row
        return row

    def __iter__(self):
        return (self[s] for s in range(len(self)))


def _without_trie(
    table: DfaTable,
    start: int,
    kids: tuple[tuple[tuple[int, int], ...], ...],
    ends: tuple[bool, ...],
    deadline: Deadline,
) -> DfaTable | None:
    """`table`'s words from `start` other than the trie's (None when none is left): the
    product of the table with the trie, whose states past the trie (-1) are the table's."""
    firsts = {}  # table state -> the low code points of its moves, for bisect
    index = {(start, 0): 0}
    states = [(start, 0)]
    moves: list[list[tuple[Ranges, int]]] = []
    accepting: list[bool] = []

    what = f"excluding {sum(ends)} names"

    def target(key: tuple[int, int]) -> int:
        return _state_number(index, states, key, what)

    while len(moves) < len(states):
        if len(moves) % 256 == 0:
            deadline.check()
        t, node = states[len(moves)]
        accepting.append(table.accepting[t] and not (node >= 0 and ends[node]))
        row = table.moves[t]
        hits: dict[int, list[int]] = {}  # move index -> the trie's code points inside it
        out: list[tuple[Ranges, int]] = []
        if node >= 0 and kids[node]:
            starts = firsts.get(t)
            if starts is None:
                starts = firsts[t] = [[lo for lo, _hi in ranges] for ranges, _t in row]
            for cp, child in kids[node]:
                for m, (ranges, t2) in enumerate(row):
                    i = bisect_right(starts[m], cp) - 1
                    if i >= 0 and ranges[i][1] >= cp:
                        hits.setdefault(m, []).append(cp)
                        out.append((((cp, cp),), target((t2, child))))
                        break
        for m, (ranges, t2) in enumerate(row):
            rest = _punch(ranges, hits[m]) if m in hits else ranges
            if rest:
                out.append((rest, target((t2, -1))))
        moves.append(out)
    return _trim(moves, accepting)


def combine(
    irs: Sequence,
    accept: Callable[[tuple[bool, ...]], bool],
    deadline: Deadline | None = None,
    at_most_one: bool = False,
):
    """IR for the words w for which `accept((w in irs[0], w in irs[1], ...))` holds.

    With `at_most_one` (an `accept` false wherever w is in two of them, "exactly one"), a
    state where two of the languages already hold every continuation is dead and not
    explored (searches for two patterns that both matched)."""
    terms = Terms(deadline)
    start = tuple(terms.term(ir) for ir in irs)
    live = [i for i, t in enumerate(start) if t != NEVER_TERM]
    if len(live) == 1 and not accept((False,) * len(irs)):
        only = tuple(i == live[0] for i in range(len(irs)))
        return irs[live[0]] if accept(only) else NEVER
    dead = None
    if at_most_one:
        anything = terms.rep(terms.chars(ANY_CHAR), 0, None)
        dead = lambda state: sum(terms.holds_all(t, anything) for t in state) >= 2  # noqa: E731
    table = explore(terms, start, accept, dead)
    return NEVER if table is None else Dfa(table, 0)


def overlaps(terms: Terms, starts: Sequence[int]) -> bool:
    """Whether some word is in the language of every term in `starts`: `combine(..., all) is
    not NEVER` without building the product automaton. A depth-first search of the product
    that stops at the first such word and drops a product state as soon as one of its terms
    is the empty language (patterns that exclude each other, the usual case, end on their
    first character); raises past `MAX_STATES` states, as `explore` would."""
    start = tuple(starts)
    if NEVER_TERM in start:
        return False
    seen = {start}
    stack = [start]
    while stack:
        terms.deadline.check()
        state = stack.pop()
        if all(terms.nullable(t) for t in state):
            return True
        for block in terms.classes(state, with_rest=False):
            nxt = terms.step(state, block[0][0])
            if NEVER_TERM in nxt or nxt in seen:
                continue
            if len(seen) >= MAX_STATES:
                raise ValueError(
                    f"the combined regular expression needs more than {MAX_STATES} states "
                    "(the default of grammar_max_states)"
                )
            seen.add(nxt)
            stack.append(nxt)
    return False


def explore(
    terms: Terms,
    start: tuple[int, ...],
    accept: Callable[[tuple[bool, ...]], bool],
    dead: Callable[[tuple[int, ...]], bool] | None = None,
) -> DfaTable | None:
    """The product DFA of `start`'s terms, trimmed to states that can reach acceptance (None
    when the start cannot); states `dead` says cannot are not entered. Raises past
    `MAX_STATES` states."""
    rest = accept((False,) * len(start))  # words in none of the languages are accepted
    what = "the combined regular expression"
    if terms.native is not None:  # the loop below in C (regex_derivs.c)
        moves, accepting = terms.native.explore(
            terms.parts, terms.more, start, accept, dead, rest, normalize, MAX_STATES, what
        )
        return _trim(moves, accepting)
    index = {start: 0}
    states = [start]
    refused: set[tuple[int, ...]] = set()  # successors found dead, not entered
    moves: list[list[tuple[Ranges, int]]] = []
    accepting: list[bool] = []
    while len(moves) < len(states):
        terms.deadline.check()
        state = states[len(moves)]
        accepting.append(accept(tuple(terms.nullable(t) for t in state)))
        by_target: dict[int, Ranges] = {}
        for block in terms.classes([t for t in state if t != NEVER_TERM], with_rest=rest):
            nxt = terms.step(state, block[0][0])
            j = index.get(nxt)
            if j is None:
                if nxt in refused:
                    continue
                if (not rest and all(t == NEVER_TERM for t in nxt)) or (dead and dead(nxt)):
                    refused.add(nxt)
                    continue
                j = _state_number(index, states, nxt, what)
            by_target[j] = by_target.get(j, ()) + block
        moves.append([(normalize(ranges), j) for j, ranges in by_target.items()])
    return _trim(moves, accepting)


def _state_number(index: dict[Any, int], states: list[Any], key: Any, what: str) -> int:
    """The number of state `key`, appended when new; a ValueError naming `what` past
    MAX_STATES."""
    j = index.get(key)
    if j is None:
        if len(states) >= MAX_STATES:
            raise ValueError(
                f"{what} needs more than {MAX_STATES} states (the default of grammar_max_states)"
            )
        j = index[key] = len(states)
        states.append(key)
    return j


def _punch(ranges: Ranges, points: list[int]) -> Ranges:
    """`ranges` less the code points `points` (sorted, each inside `ranges`)."""
    out, i = [], 0
    for lo, hi in ranges:
        while i < len(points) and points[i] <= hi:
            if points[i] > lo:
                out.append((lo, points[i] - 1))
            lo = points[i] + 1
            i += 1
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)


def _trim(moves: list[list[tuple[Ranges, int]]], accepting: list[bool]) -> DfaTable | None:
    """Drop the states that cannot reach an accepting one and renumber the rest (start 0)."""
    preds: list[list[int]] = [[] for _ in moves]
    for s, out in enumerate(moves):
        for _ranges, t in out:
            preds[t].append(s)
    alive = {s for s, a in enumerate(accepting) if a}
    stack = list(alive)
    while stack:
        for p in preds[stack.pop()]:
            if p not in alive:
                alive.add(p)
                stack.append(p)
    if 0 not in alive:
        return None
    new = {s: i for i, s in enumerate(sorted(alive))}
    kept = [tuple((ranges, new[t]) for ranges, t in moves[s] if t in new) for s in sorted(alive)]
    return DfaTable(kept, [accepting[s] for s in sorted(alive)])
