"""Interned regex terms and their Brzozowski derivatives, the engine under `regex_algebra`.

An IR node becomes a hashable tuple named by an int id (equal terms share one id), so derived
terms can be compared and used as automaton states; `classes` partitions the code points into
blocks that every given term derives alike, so an automaton steps per block, not per code point.
A `Dfa` node (without length bounds or spelling) is one term per state of its table.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .native_build import load_extension
from .nfa import Deadline
from .regex_ir import (
    MAX_CODEPOINT,
    Alt,
    Chars,
    Dfa,
    Ranges,
    Ref,
    Repeat,
    Seq,
    complement,
    normalize,
)

NEVER = Alt(())  # the IR of the empty language
EMPTY_TERM, NEVER_TERM = 0, 1  # term ids of the empty string and the empty language
DERIVS_SOURCE = Path(__file__).with_name("regex_derivs.c")


@functools.cache
def regex_derivs() -> ModuleType | None:
    """The C module for `Terms.deriv`, `step` and `nullable` (`regex_derivs.c`), or None (the
    Python methods) with the reason logged or warned once."""
    return load_extension(
        "regex derivatives", "regex algebra uses the slower Python code", DERIVS_SOURCE
    )


def _contains(ranges: Ranges, cp: int) -> bool:
    i = bisect.bisect_right(ranges, (cp, MAX_CODEPOINT + 1)) - 1
    return i >= 0 and ranges[i][0] <= cp <= ranges[i][1]


class Terms:
    """Interned regex terms (hashable tuples named by int ids) and their derivatives."""

    def __init__(self, deadline: Deadline | None = None):
        self.deadline = deadline or Deadline(None)
        self._nodes: list[tuple] = []
        self._ids: dict[tuple, int] = {}
        self._from_ir: dict[int, tuple[object, int]] = {}
        self._nullable: dict[int, bool] = {}
        self._lengths: dict[int, tuple[float, float]] = {}
        self._firsts: dict[int, frozenset] = {}
        self._derivs: dict[tuple[int, int], int] = {}
        self._classes: dict[tuple[frozenset, bool], tuple[Ranges, ...]] = {}
        self._intern(("e",))
        self._intern(("n",))
        # The C module (None: the Python methods below), with what it reads: this object's
        # own list and dicts (so C and Python make the same terms with the same ids) and, for
        # `regex_algebra.explore`, the first-sets and classes memos, `_sweep` and the clock.
        self.native = native = regex_derivs()
        self.parts = (self._nodes, self._ids, self._nullable, self._derivs)
        self.more = (self._firsts, self._classes, self._sweep, self.deadline.check)
        if native is not None:  # C stands in for three methods (a partial holds no cycle)
            for name in ("deriv", "step", "nullable"):
                setattr(self, name, functools.partial(getattr(native, name), self.parts))

    def _intern(self, node: tuple) -> int:
        got = self._ids.get(node)
        if got is None:
            got = self._ids[node] = len(self._nodes)
            self._nodes.append(node)
        return got

    def node(self, t: int) -> tuple:
        """The interned tuple of term `t`: its kind ("e", "n", "c", "s", "a", "r") and fields."""
        return self._nodes[t]

    # ---- smart constructors --------------------------------------------------------------
    def chars(self, ranges: Ranges) -> int:
        return self._intern(("c", ranges)) if ranges else NEVER_TERM

    def seq(self, a: int, b: int) -> int:
        if a == NEVER_TERM or b == NEVER_TERM:
            return NEVER_TERM
        if a == EMPTY_TERM:
            return b
        if b == EMPTY_TERM:
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
            elif t != NEVER_TERM:
                flat.add(t)
        if not flat:
            return NEVER_TERM
        if len(flat) == 1:
            return next(iter(flat))
        return self._intern(("a", frozenset(flat)))

    def rep(self, x: int, lo: int, hi: int | None) -> int:
        if hi == 0 or x == EMPTY_TERM:
            return EMPTY_TERM
        if x == NEVER_TERM:
            return EMPTY_TERM if lo == 0 else NEVER_TERM
        if lo == 1 and hi == 1:
            return x
        return self._intern(("r", x, lo, hi))

    # ---- from IR -------------------------------------------------------------------------
    def term(self, ir) -> int:
        """The term of an IR node (no `Ref`s)."""
        hit = self._from_ir.get(id(ir))
        if hit is not None:
            return hit[1]
        if isinstance(ir, Chars):
            out = self.chars(normalize(ir.ranges))
        elif isinstance(ir, Seq):
            out = EMPTY_TERM
            for item in reversed(ir.items):
                out = self.seq(self.term(item), out)
        elif isinstance(ir, Alt):
            out = self.alt([self.term(i) for i in ir.items])
        elif isinstance(ir, Repeat):
            out = self.rep(self.term(ir.item), ir.lo, ir.hi)
        elif isinstance(ir, Dfa):
            if ir.lo or ir.hi is not None or ir.spell is not None:
                raise TypeError("a Dfa with length bounds or spelling is not a regex term")
            out = self._intern(("d", ir.table, ir.start))
        elif isinstance(ir, Ref):
            raise ValueError(f"rule reference {ir.name!r} inside a regular expression")
        else:
            raise TypeError(f"not a regex IR node: {ir!r}")
        self._from_ir[id(ir)] = (ir, out)
        return out

    # ---- properties ----------------------------------------------------------------------
    def holds_all(self, t: int, anything: int) -> bool:
        """Whether `t` is, or has as an alternative, the term `anything` (every word): a
        sufficient test that `t` accepts every continuation."""
        node = self._nodes[t]
        return t == anything or (node[0] == "a" and anything in node[1])

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
            elif kind == "d":
                got = node[1].accepting[node[2]]
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
            elif kind == "d":
                got = (node[1].shortest[node[2]], node[1].longest[node[2]])
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
            elif kind == "d":
                got = frozenset(ranges for ranges, _t in node[1].moves[node[2]])
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
            got = NEVER_TERM
        elif kind == "c":
            got = EMPTY_TERM if _contains(node[1], cp) else NEVER_TERM
        elif kind == "s":
            got = self.seq(self.deriv(node[1], cp), node[2])
            if self.nullable(node[1]):
                got = self.alt((got, self.deriv(node[2], cp)))
        elif kind == "a":
            got = self.alt([self.deriv(i, cp) for i in node[1]])
        elif kind == "d":
            got = NEVER_TERM
            for ranges, target in node[1].moves[node[2]]:
                if _contains(ranges, cp):
                    got = self._intern(("d", node[1], target))
                    break
        else:
            x, lo, hi = node[1], node[2], node[3]
            rest = self.rep(x, max(lo - 1, 0), None if hi is None else hi - 1)
            got = self.seq(self.deriv(x, cp), rest)
        self._derivs[key] = got
        return got

    def step(self, terms: tuple[int, ...], cp: int) -> tuple[int, ...]:
        """Each term's derivative by `cp`: a product automaton's move (`regex_algebra`)."""
        derivs = self._derivs
        out = []
        for t in terms:
            got = derivs.get((t, cp))
            out.append(self.deriv(t, cp) if got is None else got)
        return tuple(out)

    def classes(self, terms: Sequence[int], with_rest: bool) -> tuple[Ranges, ...]:
        """Code point classes on which every term in `terms` derives alike. With `with_rest`,
        the class of code points no term can start with is included.

        Kept by the set of first-character sets they come from: the states of a product
        automaton (`regex_algebra.explore`) mostly share a few such sets."""
        firsts = frozenset().union(*(self.firsts(t) for t in terms))
        key = (firsts, with_rest)
        got = self._classes.get(key)
        if got is None:
            got = self._classes[key] = self._sweep(firsts, with_rest)
        return got

    @staticmethod
    def _sweep(sets: frozenset, with_rest: bool) -> tuple[Ranges, ...]:
        # A sweep over the sets' bounds: between two bounds every code point is in the same
        # sets, named by one bit each (toggled where a set's range starts and after it ends).
        toggles: dict[int, int] = {}
        bit = 1
        for ranges in sets:
            for lo, hi in normalize(ranges):
                toggles[lo] = toggles.get(lo, 0) ^ bit
                toggles[hi + 1] = toggles.get(hi + 1, 0) ^ bit
            bit <<= 1
        spans: dict[int, list[tuple[int, int]]] = {}  # the code points of each set of sets
        inside, start = 0, 0
        for cp in sorted(toggles):
            if inside:
                spans.setdefault(inside, []).append((start, cp - 1))
            inside ^= toggles[cp]
            start = cp
        blocks = [normalize(tuple(ranges)) for ranges in spans.values()]
        if with_rest:
            rest = complement(tuple(r for ranges in blocks for r in ranges))
            if rest:
                blocks.append(rest)
        return tuple(blocks)
