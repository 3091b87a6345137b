"""Boolean operations and length bounds on regex IR, through Brzozowski derivatives.

The regex IR has no intersection or complement, yet JSON Schema needs them: `pattern` together
with `minLength`/`maxLength`, property names that match a `patternProperties` pattern but are
not declared, names that match no pattern. Here an IR becomes an interned term, terms are
derived by one code point at a time (over a partition of the code points into classes that
derive alike; `regex_terms`), and the explored automaton is written back as IR.

`restrict_length` unrolls lengths into layers (acyclic, so no regex is rebuilt from cycles);
`combine` builds the product automaton of several terms and, where a state is just one of the
terms again, leaves that term as it was; the rest is turned back into IR by state elimination,
which is exact but grows quickly, so it is capped at `MAX_STATES` states.

`search` matches text against a pattern the same way, one derivative per character: linear
in the text, where Python's backtracking `re` can take exponential time on a request's pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .nfa import Deadline
from .regex_ir import (
    EMPTY,
    MAX_CODEPOINT,
    Alt,
    Chars,
    Ranges,
    Repeat,
    Seq,
    normalize,
    parse_search_regex,
)
from .regex_terms import NEVER, NEVER_TERM, Terms

MAX_STATES = 64
ANY_CHAR = ((0, MAX_CODEPOINT),)


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
    memo: dict[tuple[int, int], object] = {}

    def layer(t: int, n: int):
        key = (t, n)
        got = memo.get(key)
        if got is not None:
            return got
        terms.deadline.check()
        low, high = max(lo - n, 0), None if hi is None else hi - n
        short, long_ = terms.lengths(t)
        node = terms.node(t)
        if long_ < low or (high is not None and short > high):
            got = NEVER
        elif short >= low and (high is None or long_ <= high):
            got = terms.ir(t)
        elif node[0] == "r" and terms.node(node[1])[0] == "c":
            caps = [v for v in (node[3], high) if v is not None]
            top, bottom = (min(caps) if caps else None), max(node[2], low)
            bad = top is not None and top < bottom
            got = NEVER if bad else Repeat(terms.ir(node[1]), bottom, top)
        else:
            by_target: dict[int, Ranges] = {}
            for block in terms.classes([t], with_rest=False):
                d = terms.deriv(t, block[0][0])
                if d != NEVER_TERM:
                    by_target[d] = normalize(by_target.get(d, ()) + block)
            options = [EMPTY] if terms.nullable(t) and low == 0 else []
            for d, ranges in by_target.items():
                nxt = layer(d, n + 1)
                if nxt is not NEVER:
                    options.append(Seq((Chars(ranges), nxt)))
            got = Alt(tuple(options))
        memo[key] = got
        return got

    return layer(start, 0)


def exclude_words(ir, words: Sequence[str], deadline: Deadline | None = None):
    """IR for the words of `ir` other than `words`."""
    if not words:
        return ir
    terms = Terms(deadline)
    trie: list[dict] = [{}]
    ends: set[int] = set()
    for word in words:
        node = 0
        for ch in word:
            nxt = trie[node].get(ord(ch))
            if nxt is None:
                nxt = trie[node][ord(ch)] = len(trie)
                trie.append({})
            node = nxt
        ends.add(node)
    memo: dict[tuple[int, int], object] = {}

    def walk(t: int, node: int):
        key = (t, node)
        got = memo.get(key)
        if got is not None:
            return got
        terms.deadline.check()
        children = trie[node]
        by_target: dict[tuple[int, int], Ranges] = {}
        singles = [((cp, cp),) for cp in children]
        for block in terms.classes([t], with_rest=False, extra=singles):
            cp = block[0][0]
            d = terms.deriv(t, cp)
            if d == NEVER_TERM:
                continue
            target = (d, children[cp] if block == ((cp, cp),) and cp in children else -1)
            by_target[target] = normalize(by_target.get(target, ()) + block)
        options = [EMPTY] if terms.nullable(t) and node not in ends else []
        for (d, child), ranges in by_target.items():
            nxt = terms.ir(d) if child < 0 else walk(d, child)
            if nxt is not NEVER:
                options.append(Seq((Chars(ranges), nxt)))
        got = memo[key] = Alt(tuple(options))
        return got

    out = walk(terms.term(ir), 0)
    return NEVER if terms.term(out) == NEVER_TERM else out


def combine(
    irs: Sequence, accept: Callable[[tuple[bool, ...]], bool], deadline: Deadline | None = None
):
    """IR for the words w for which `accept((w in irs[0], w in irs[1], ...))` holds.

    Raises ValueError when the product automaton needs more than `MAX_STATES` states to be
    written back as IR.
    """
    terms = Terms(deadline)
    start = tuple(terms.term(ir) for ir in irs)
    dead_accepts = accept(tuple(False for _ in irs))
    anything = Repeat(Chars(ANY_CHAR), 0, None)
    index: dict[tuple[int, ...], int] = {}
    states: list[tuple[int, ...]] = []
    eqs: list[tuple[dict, list]] = []  # per state: ({state: IR coefficient}, [IR constants])

    def leaf(state: tuple[int, ...]):
        """IR for `state` when it needs no automaton of its own, else None."""
        live = [i for i, t in enumerate(state) if t != NEVER_TERM]
        if not live:
            return anything if dead_accepts else NEVER
        if len(live) == 1:
            only = tuple(i == live[0] for i in range(len(state)))
            if accept(only) and not dead_accepts:
                return terms.ir(state[live[0]])
        return None

    def visit(state: tuple[int, ...]):
        got = leaf(state)
        if got is not None:
            return got
        if state not in index:
            if len(states) >= MAX_STATES:
                raise ValueError(
                    f"the combined regular expression needs more than {MAX_STATES} states"
                )
            index[state] = len(states)
            states.append(state)
            eqs.append(({}, []))
        return index[state]

    whole = leaf(start)
    if whole is not None:
        return whole
    visit(start)
    i = 0
    while i < len(states):
        terms.deadline.check()
        state = states[i]
        coeffs, consts = eqs[i]
        if accept(tuple(terms.nullable(t) for t in state)):
            consts.append(EMPTY)
        by_target: dict[object, Ranges] = {}
        for block in terms.classes([t for t in state if t != NEVER_TERM], with_rest=dead_accepts):
            nxt = tuple(terms.deriv(t, block[0][0]) for t in state)
            target = visit(nxt)
            if target is NEVER:
                continue
            key = target if isinstance(target, int) else id(target)
            prev = by_target.get(key, (target, ()))
            by_target[key] = (target, normalize(prev[1] + block))
        for target, ranges in by_target.values():
            if isinstance(target, int):
                coeffs[target] = Chars(ranges)
            else:
                consts.append(Seq((Chars(ranges), target)))
        i += 1
    out = _eliminate(eqs)
    return NEVER if terms.term(out) == NEVER_TERM else out


def _eliminate(eqs: list[tuple[dict, list]]):
    """Solve X_i = sum_j C_ij X_j + K_i for X_0 (Arden's rule, last state first)."""
    for k in range(len(eqs) - 1, 0, -1):
        coeffs, consts = eqs[k]
        loop = coeffs.pop(k, None)
        prefix = EMPTY if loop is None else Repeat(loop, 0, None)
        for i in range(k):
            ci, ki = eqs[i]
            c = ci.pop(k, None)
            if c is None:
                continue
            head = Seq((c, prefix))
            for j, cj in coeffs.items():
                term = Seq((head, cj))
                ci[j] = term if j not in ci else Alt((ci[j], term))
            if consts:
                ki.append(Seq((head, Alt(tuple(consts)))))
    coeffs, consts = eqs[0]
    loop = coeffs.pop(0, None)
    body = Alt(tuple(consts))
    return body if loop is None else Seq((Repeat(loop, 0, None), body))
