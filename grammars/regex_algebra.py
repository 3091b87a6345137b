"""Boolean operations and length bounds on regex IR, through Brzozowski derivatives.

The regex IR has no intersection or complement, yet JSON Schema needs them: `pattern` together
with `minLength`/`maxLength`, property names that match a `patternProperties` pattern but are
not declared, names that match no pattern. Here an IR becomes an interned term, terms are
derived by one code point at a time (over a partition of the code points into classes that
derive alike), and the explored automaton is written back as IR.

`restrict_length` unrolls lengths into layers (acyclic, so no regex is rebuilt from cycles);
`combine` builds the product automaton of several terms and, where a state is just one of the
terms again, leaves that term as it was; the rest is turned back into IR by state elimination,
which is exact but grows quickly, so it is capped at `MAX_STATES` states.

`search` matches text against a pattern the same way, one derivative per character: linear
in the text, where Python's backtracking `re` can take exponential time on a request's pattern.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

from .nfa import Deadline
from .regex_ir import (
    EMPTY,
    MAX_CODEPOINT,
    Alt,
    Chars,
    Ranges,
    Ref,
    Repeat,
    Seq,
    complement,
    intersect,
    normalize,
    parse_search_regex,
    subtract,
)

NEVER = Alt(())
MAX_STATES = 64
ANY_CHAR = ((0, MAX_CODEPOINT),)

_E, _N = 0, 1  # term ids of the empty string and the empty language


class Terms:
    """Interned regex terms (hashable tuples named by int ids) and their derivatives."""

    def __init__(self, deadline: Deadline | None = None):
        self.deadline = deadline or Deadline(None)
        self._nodes: list[tuple] = []
        self._ids: dict[tuple, int] = {}
        self._from_ir: dict[int, tuple[object, int]] = {}
        self._to_ir: dict[int, object] = {}
        self._nullable: dict[int, bool] = {}
        self._lengths: dict[int, tuple[float, float]] = {}
        self._firsts: dict[int, frozenset] = {}
        self._derivs: dict[tuple[int, int], int] = {}
        self._intern(("e",))
        self._intern(("n",))

    def _intern(self, node: tuple) -> int:
        got = self._ids.get(node)
        if got is None:
            got = self._ids[node] = len(self._nodes)
            self._nodes.append(node)
        return got

    # ---- smart constructors --------------------------------------------------------------
    def chars(self, ranges: Ranges) -> int:
        return self._intern(("c", ranges)) if ranges else _N

    def seq(self, a: int, b: int) -> int:
        if a == _N or b == _N:
            return _N
        if a == _E:
            return b
        if b == _E:
            return a
        node = self._nodes[a]
        if node[0] == "s":
            return self.seq(node[1], self.seq(node[2], b))
        return self._intern(("s", a, b))

    def alt(self, items) -> int:
        flat: set[int] = set()
        for t in items:
            node = self._nodes[t]
            if node[0] == "a":
                flat |= node[1]
            elif t != _N:
                flat.add(t)
        if not flat:
            return _N
        if len(flat) == 1:
            return next(iter(flat))
        return self._intern(("a", frozenset(flat)))

    def rep(self, x: int, lo: int, hi: int | None) -> int:
        if hi == 0 or x == _E:
            return _E
        if x == _N:
            return _E if lo == 0 else _N
        if lo == 1 and hi == 1:
            return x
        return self._intern(("r", x, lo, hi))

    # ---- IR conversion -------------------------------------------------------------------
    def term(self, ir) -> int:
        """The term of an IR node (no `Ref`s)."""
        hit = self._from_ir.get(id(ir))
        if hit is not None:
            return hit[1]
        if isinstance(ir, Chars):
            out = self.chars(normalize(ir.ranges))
        elif isinstance(ir, Seq):
            out = _E
            for item in reversed(ir.items):
                out = self.seq(self.term(item), out)
        elif isinstance(ir, Alt):
            out = self.alt([self.term(i) for i in ir.items])
        elif isinstance(ir, Repeat):
            out = self.rep(self.term(ir.item), ir.lo, ir.hi)
        elif isinstance(ir, Ref):
            raise ValueError(f"rule reference {ir.name!r} inside a regular expression")
        else:
            raise TypeError(f"not a regex IR node: {ir!r}")
        self._from_ir[id(ir)] = (ir, out)
        return out

    def ir(self, t: int):
        """IR for term `t` (shared subterms give shared IR nodes)."""
        got = self._to_ir.get(t)
        if got is not None:
            return got
        node = self._nodes[t]
        kind = node[0]
        if kind == "e":
            out = EMPTY
        elif kind == "n":
            out = NEVER
        elif kind == "c":
            out = Chars(node[1])
        elif kind == "s":
            parts, rest = [], t
            while self._nodes[rest][0] == "s":
                parts.append(self.ir(self._nodes[rest][1]))
                rest = self._nodes[rest][2]
            out = Seq((*parts, self.ir(rest)))
        elif kind == "a":
            out = Alt(tuple(self.ir(i) for i in sorted(node[1])))
        else:
            out = Repeat(self.ir(node[1]), node[2], node[3])
        self._to_ir[t] = out
        return out

    # ---- properties ----------------------------------------------------------------------
    def nullable(self, t: int) -> bool:
        got = self._nullable.get(t)
        if got is None:
            node = self._nodes[t]
            kind = node[0]
            if kind in ("e", "n", "c"):
                got = kind == "e"
            elif kind == "s":
                got = self.nullable(node[1]) and self.nullable(node[2])
            elif kind == "a":
                got = any(self.nullable(i) for i in node[1])
            else:
                got = node[2] == 0 or self.nullable(node[1])
            self._nullable[t] = got
        return got

    def lengths(self, t: int) -> tuple[float, float]:
        """(shortest, longest) word length; (inf, -1) for the empty language."""
        got = self._lengths.get(t)
        if got is None:
            node = self._nodes[t]
            kind = node[0]
            if kind == "e":
                got = (0, 0)
            elif kind == "n":
                got = (math.inf, -1)
            elif kind == "c":
                got = (1, 1)
            elif kind == "s":
                (a0, a1), (b0, b1) = self.lengths(node[1]), self.lengths(node[2])
                got = (a0 + b0, a1 + b1) if a1 >= 0 and b1 >= 0 else (math.inf, -1)
            elif kind == "a":
                spans = [self.lengths(i) for i in node[1]]
                got = (min(s[0] for s in spans), max(s[1] for s in spans))
            else:
                x0, x1 = self.lengths(node[1])
                hi = node[3]
                if x1 < 0:
                    got = (0, 0)
                else:
                    top = (math.inf if x1 > 0 else 0) if hi is None else hi * x1
                    got = (node[2] * x0, top)
            self._lengths[t] = got
        return got

    def firsts(self, t: int) -> frozenset:
        """Code point sets (Ranges) that a word of `t` may start with."""
        got = self._firsts.get(t)
        if got is None:
            node = self._nodes[t]
            kind = node[0]
            if kind in ("e", "n"):
                got = frozenset()
            elif kind == "c":
                got = frozenset((node[1],))
            elif kind == "s":
                got = self.firsts(node[1])
                if self.nullable(node[1]):
                    got = got | self.firsts(node[2])
            elif kind == "a":
                got = frozenset().union(*(self.firsts(i) for i in node[1]))
            else:
                got = self.firsts(node[1])
            self._firsts[t] = got
        return got

    def deriv(self, t: int, cp: int) -> int:
        """The words w such that chr(cp) + w is a word of `t`."""
        key = (t, cp)
        got = self._derivs.get(key)
        if got is not None:
            return got
        node = self._nodes[t]
        kind = node[0]
        if kind in ("e", "n"):
            got = _N
        elif kind == "c":
            ranges = node[1]
            i = bisect.bisect_right(ranges, (cp, MAX_CODEPOINT + 1)) - 1
            got = _E if i >= 0 and ranges[i][0] <= cp <= ranges[i][1] else _N
        elif kind == "s":
            got = self.seq(self.deriv(node[1], cp), node[2])
            if self.nullable(node[1]):
                got = self.alt((got, self.deriv(node[2], cp)))
        elif kind == "a":
            got = self.alt([self.deriv(i, cp) for i in node[1]])
        else:
            x, lo, hi = node[1], node[2], node[3]
            rest = self.rep(x, max(lo - 1, 0), None if hi is None else hi - 1)
            got = self.seq(self.deriv(x, cp), rest)
        self._derivs[key] = got
        return got

    def classes(self, terms: Sequence[int], with_rest: bool, extra: Sequence = ()) -> list[Ranges]:
        """Code point classes on which every term in `terms` derives alike.

        Each set in `extra` is a union of classes too. With `with_rest`, the class of code
        points no term can start with is included.
        """
        blocks: list[Ranges] = []
        covered: Ranges = ()
        sets = [r for t in terms for r in self.firsts(t)] + list(extra)
        for ranges in sets:
            if ranges:
                fresh = subtract(ranges, covered)
                out = []
                for b in blocks:
                    inside, outside = intersect(b, ranges), subtract(b, ranges)
                    out += [r for r in (inside, outside) if r]
                blocks = out + ([fresh] if fresh else [])
                covered = normalize(covered + ranges)
        if with_rest:
            rest = complement(covered)
            if rest:
                blocks.append(rest)
        return blocks


def search(pattern: str, text: str, deadline: Deadline | None = None) -> bool:
    """Whether `re.search(pattern, text)` finds a match (ValueError if `pattern` is not regular)."""
    terms = Terms(deadline)
    t = terms.term(parse_search_regex(pattern))
    for ch in text:
        terms.deadline.check()
        t = terms.deriv(t, ord(ch))
        if t == _N:
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
        node = terms._nodes[t]
        if long_ < low or (high is not None and short > high):
            got = NEVER
        elif short >= low and (high is None or long_ <= high):
            got = terms.ir(t)
        elif node[0] == "r" and terms._nodes[node[1]][0] == "c":
            caps = [v for v in (node[3], high) if v is not None]
            top, bottom = (min(caps) if caps else None), max(node[2], low)
            bad = top is not None and top < bottom
            got = NEVER if bad else Repeat(terms.ir(node[1]), bottom, top)
        else:
            by_target: dict[int, Ranges] = {}
            for block in terms.classes([t], with_rest=False):
                d = terms.deriv(t, block[0][0])
                if d != _N:
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
            if d == _N:
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
    return NEVER if terms.term(out) == _N else out


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
        live = [i for i, t in enumerate(state) if t != _N]
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
        for block in terms.classes([t for t in state if t != _N], with_rest=dead_accepts):
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
    return NEVER if terms.term(out) == _N else out


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
