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

from collections.abc import Callable, Sequence

from .budget import GrammarLimits
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
    parse_search_regex,
)
from .regex_terms import NEVER, NEVER_TERM, Terms

ANY_CHAR = ((0, MAX_CODEPOINT),)
MAX_STATES = GrammarLimits().max_states  # the default of the grammar_max_states knob


def search(pattern: str, text: str, deadline: Deadline | None = None) -> bool:
    """Whether `re.search(pattern, text)` finds a match (ValueError if `pattern` is not regular)."""
    terms = Terms(deadline)
    t = terms.term(parse_search_regex(pattern))
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
    """IR for the words of `ir` other than `words`."""
    if not words:
        return ir
    banned = Alt(tuple(literal(w) for w in dict.fromkeys(words)))
    return combine([ir, banned], lambda got: got[0] and not got[1], deadline)


def combine(
    irs: Sequence, accept: Callable[[tuple[bool, ...]], bool], deadline: Deadline | None = None
):
    """IR for the words w for which `accept((w in irs[0], w in irs[1], ...))` holds."""
    terms = Terms(deadline)
    start = tuple(terms.term(ir) for ir in irs)
    live = [i for i, t in enumerate(start) if t != NEVER_TERM]
    if len(live) == 1 and not accept((False,) * len(irs)):
        only = tuple(i == live[0] for i in range(len(irs)))
        return irs[live[0]] if accept(only) else NEVER
    table = explore(terms, start, accept)
    return NEVER if table is None else Dfa(table, 0)


def explore(
    terms: Terms, start: tuple[int, ...], accept: Callable[[tuple[bool, ...]], bool]
) -> DfaTable | None:
    """The product DFA of `start`'s terms, trimmed to states that can reach acceptance (None
    when the start cannot); raises past `MAX_STATES` states."""
    rest = accept((False,) * len(start))  # words in none of the languages are accepted
    index = {start: 0}
    states = [start]
    moves: list[list[tuple[Ranges, int]]] = []
    accepting: list[bool] = []
    while len(moves) < len(states):
        terms.deadline.check()
        state = states[len(moves)]
        accepting.append(accept(tuple(terms.nullable(t) for t in state)))
        by_target: dict[int, Ranges] = {}
        for block in terms.classes([t for t in state if t != NEVER_TERM], with_rest=rest):
            nxt = tuple(terms.deriv(t, block[0][0]) for t in state)
            if not rest and all(t == NEVER_TERM for t in nxt):
                continue
            j = index.get(nxt)
            if j is None:
                if len(states) >= MAX_STATES:
                    raise ValueError(
                        f"the combined regular expression needs more than {MAX_STATES} states "
                        "(the default of grammar_max_states)"
                    )
                j = index[nxt] = len(states)
                states.append(nxt)
            by_target[j] = by_target.get(j, ()) + block
        moves.append([(normalize(ranges), j) for j, ranges in by_target.items()])
    return _trim(moves, accepting)


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
