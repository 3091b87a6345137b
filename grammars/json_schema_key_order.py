"""An object's members in any order (`GrammarLimits.json_key_order` "any"): a `Dfa` node whose
table is the set of properties written, made state by state as a walk reaches it.

JSON Schema leaves the order of an object's members free. In declared order an object is IR
linear in its properties (`json_schema_objects`); in any order the state after some members
is which declared properties were written, 2^n states for n properties. So that set is the
state of a `Dfa` node over symbols: one per declared property without a separator before it
(the first member) and one with, and the same two for an undeclared member. `MemberTable`
makes a state's moves when the NFA first reads them and spells each symbol as that member's
IR (its name, `:`, its value), so a walk builds one state per member it writes and each
member's IR once per state it is written from.

A state is `seen | extras << n`: the declared properties written (a bit each) and the
undeclared members written, counted up to what `minProperties`/`maxProperties` need (at
least 1, which tells whether a separator comes next). It accepts when every required
property is written and the count reaches `minProperties`; a move past `maxProperties`, or
into a state that can no longer accept, is never made (every state of a table can finish).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .regex_dfa import DfaTable
from .regex_ir import Chars, Dfa, Ranges, seq
from .regex_terms import NEVER

# Past this many declared properties an object keeps its declared order (a state number must
# stay a Python index: Dfa tables are sequences).
MAX_ANY_ORDER_PROPERTIES = 48


@dataclass(frozen=True)
class _Counts:
    """What decides an object's states: its declared properties and counts."""

    n: int  # declared properties
    required: int  # bits of the required ones
    extra: bool  # whether undeclared members may be written
    lo: int  # minProperties
    hi: int | None  # maxProperties
    cap: int  # undeclared members counted up to this

    def split(self, s: int) -> tuple[int, int, int]:
        """(seen bits, undeclared members counted, members counted) of state `s`."""
        seen, extras = s & ((1 << self.n) - 1), s >> self.n
        return seen, extras, seen.bit_count() + extras

    def missing(self, seen: int) -> int:
        return (self.required & ~seen).bit_count()

    def shortest(self, s: int) -> float:
        """Members still to write at least (`live` states only)."""
        seen, _, count = self.split(s)
        return max(self.missing(seen), self.lo - count)

    def longest(self, s: int) -> float:
        seen, _, count = self.split(s)
        more = math.inf if self.extra else self.n - seen.bit_count()
        return more if self.hi is None else min(more, self.hi - count)

    def live(self, s: int) -> bool:
        """Whether state `s` can still end in an accepted object."""
        return self.shortest(s) <= self.longest(s)

    def accepting(self, s: int) -> bool:
        seen, _, count = self.split(s)
        return self.missing(seen) == 0 and count >= self.lo

    def moves(self, s: int) -> tuple[tuple[Ranges, int], ...]:
        """(symbol, target) per member that may come next; symbols as `MemberSpelling` reads
        them."""
        seen, extras, count = self.split(s)
        if self.hi is not None and count >= self.hi:
            return ()
        later = self.n if s else 0  # symbols past n: a separator first
        out = []
        for i in range(self.n):
            if not seen >> i & 1:
                out.append((i + later, seen | 1 << i | extras << self.n))
        if self.extra:
            out.append((2 * self.n + (1 if s else 0), seen | min(extras + 1, self.cap) << self.n))
        return tuple((((sym, sym),), t) for sym, t in out if self.live(t))


class _Lazy:
    """A sequence of `size` items made by `make(index)` the first time each is read."""

    def __init__(self, make: Callable[[int], object], size: int):
        self._make, self._size, self._made = make, size, {}

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int):
        got = self._made.get(index)
        if got is None:
            if not 0 <= index < self._size:
                raise IndexError(index)
            got = self._made[index] = self._make(index)
        return got


class MemberTable(DfaTable):
    """The `Dfa` table of an object's members in any order (see the module docstring)."""

    def __init__(self, counts: _Counts):
        size = (counts.cap + 1) << counts.n
        lengths = (_Lazy(counts.shortest, size), _Lazy(counts.longest, size))
        super().__init__(_Lazy(counts.moves, size), _Lazy(counts.accepting, size), lengths)


@dataclass(frozen=True)
class MemberSpelling:
    """A `Dfa` spelling of member symbols: `items[symbol]` is that member's IR."""

    items: tuple

    def __call__(self, chars: Chars):
        ((symbol, _),) = chars.ranges
        return self.items[symbol]


def any_order_members(
    pairs: list[tuple[object, bool]], extra, sep, lo: int, hi: int | None
) -> object | None:
    """IR of an object's members (between its braces) in any order: `pairs` are the declared
    (`"name":value` IR, required) pairs, `extra` the IR of one undeclared pair (None: none may
    be written), `sep` the separator. None when the members cannot be written apart from
    the rest of the grammar (a pair holding a rule reference) or their states would not be
    Python indexes (past `MAX_ANY_ORDER_PROPERTIES`, or a huge `maxProperties` beside
    undeclared members): the caller keeps the declared order then."""
    irs = [pair for pair, _ in pairs] + ([] if extra is None else [extra])
    # A node knows its facts when no rule reference is under it (`regex_ir.set_facts`).
    if len(pairs) > MAX_ANY_ORDER_PROPERTIES or any(ir.facts is None for ir in irs):  # type: ignore[attr-defined]
        return None
    n = len(pairs)
    required = sum(1 << i for i, (_, req) in enumerate(pairs) if req)
    cap = (hi if hi is not None else max(lo, 1)) if extra is not None else 0
    if (cap + 1) << n > sys.maxsize:  # a huge maxProperties beside many properties
        return None
    counts = _Counts(n, required, extra is not None, lo, hi, cap)
    if not counts.live(0):
        return NEVER
    names = [pair for pair, _ in pairs]
    items = [*names, *(seq(sep, p) for p in names)]
    if extra is not None:
        items += [extra, seq(sep, extra)]
    return Dfa(MemberTable(counts), 0, spell=MemberSpelling(tuple(items)))
