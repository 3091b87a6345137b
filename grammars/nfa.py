"""Byte-level NFA built from the regex IR, and its lazily determinized DFA.

The NFA is built backwards (`add(node, next_state) -> start_state`): compiling the same IR node
with the same continuation twice reuses the first copy, so shared suffixes (JSON objects with
optional properties, array separators) stay linear in size. Edges carry byte ranges; a code
point set becomes its UTF-8 byte-range sequences, so a DFA state can sit in the middle of a
multi-byte character.

Every NFA state can reach an accepting state: a node that matches nothing (an empty
character set, an empty alternation, or a sequence holding one) compiles to -1 and is left out
of what contains it. States with equal edges are built once (a character set is keyed by its
ranges and continuation, an alternation by its branches), and a bounded repeat `x{0,n}` is
nested as `(x(x(...)?)?)?`, so the closure of a state inside it stays small.

An NFA holds at most `MAX_NFA_STATES` states: a repeat is copied once per repetition, so
after its first copy the builder knows what the rest will take and fails at once, naming
the limit, rather than running into the compile deadline.

The DFA is built on demand: a state is the set of NFA states with byte edges or tags in an
epsilon closure, interned to an int; its 256-entry row of successors (-1 = dead) is computed
the first time someone asks for it.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np

from .budget import GrammarBudget
from .regex_ir import Alt, Chars, Ref, Repeat, Seq, utf8_sequences
from .states import DICT_ENTRY_BYTES, StateRows

MAX_NFA_STATES = 500_000


class CompileTimeout(ValueError):
    """Grammar compilation ran past its time limit (a ValueError: the input is at fault)."""


class Deadline:
    """A wall-clock limit checked at loop heads during compilation."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.end = None if seconds is None else time.perf_counter() + seconds

    def check(self) -> None:
        if self.end is not None and time.perf_counter() > self.end:
            raise CompileTimeout(
                f"grammar compilation exceeded its time limit of {self.seconds:g} s "
                "(grammar_compile_timeout)"
            )


def _too_many_states(what: str) -> ValueError:
    return ValueError(
        f"{what} needs more than {MAX_NFA_STATES} NFA states, the limit per grammar "
        "(MAX_NFA_STATES)"
    )


@functools.lru_cache(maxsize=4096)
def _sequences(ranges: tuple) -> tuple:
    return tuple(tuple(seq) for lo, hi in ranges for seq in utf8_sequences(lo, hi))


class NFA:
    """Byte-range NFA; `tags[state]` marks accepting states (terminal id for lexers, 0 else)."""

    def __init__(self, deadline: Deadline | None = None):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.tags: dict[int, int] = {}
        self._memo: dict[tuple[int, int], tuple[object, int]] = {}
        self._shared: dict[tuple, int] = {}
        self._deadline = deadline or Deadline(None)

    def new_state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise _too_many_states("the grammar")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def add(self, node, nxt: int) -> int:
        """Compile `node` so that it ends in state `nxt`; its start state, -1 if it matches nothing."""
        key = (id(node), nxt)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        if len(self._memo) & 1023 == 0:
            self._deadline.check()
        start = self._build(node, nxt)
        self._memo[key] = (node, start)
        return start

    def _build(self, node, nxt: int) -> int:
        if isinstance(node, Chars):
            return self._chars(node.ranges, nxt)
        if isinstance(node, Seq):
            for item in reversed(node.items):
                nxt = self.add(item, nxt)
                if nxt < 0:
                    return -1
            return nxt
        if isinstance(node, Alt):
            return self._alt([self.add(item, nxt) for item in node.items])
        if isinstance(node, Repeat):
            return self._repeat(node, nxt)
        if isinstance(node, Ref):
            raise ValueError(f"rule reference {node.name!r} inside a regular expression")
        raise TypeError(f"not a regex IR node: {node!r}")

    def _alt(self, starts: list[int]) -> int:
        live = tuple(sorted({s for s in starts if s >= 0}))
        if len(live) <= 1:
            return live[0] if live else -1
        key = ("alt", live)
        got = self._shared.get(key)
        if got is None:
            got = self._shared[key] = self.new_state()
            self.eps[got].extend(live)
        return got

    def _repeat(self, node: Repeat, nxt: int) -> int:
        if node.hi is not None and node.hi < node.lo:
            raise ValueError(f"repeat with max {node.hi} < min {node.lo}")
        left = node.lo + (1 if node.hi is None else node.hi - node.lo)  # copies to build
        if node.hi is None:
            loop = self.new_state()
            left -= 1
            body = self._copy(node, loop, left)
            self.eps[loop].extend((body, nxt) if body >= 0 else (nxt,))
            nxt = loop
        else:
            # x{0,n} as (x(x(...)?)?)?: each optional copy skips straight to the end.
            end = nxt
            for _ in range(node.hi - node.lo):
                left -= 1
                body = self._copy(node, nxt, left, skip_to=end)
                if body < 0:
                    break
                nxt = body
        for _ in range(node.lo):
            left -= 1
            nxt = self._copy(node, nxt, left)
            if nxt < 0:
                return -1
        return nxt

    def _copy(self, node: Repeat, nxt: int, left: int, skip_to: int | None = None) -> int:
        """One copy of a repeated item (optional, skipping to `skip_to`, when that is given).

        Fails fast when `left` more copies of the same size would pass `MAX_NFA_STATES`.
        """
        self._deadline.check()
        before = len(self.eps)
        start = self._build(node.item, nxt)
        if skip_to is not None and start >= 0:
            start = self._alt([start, skip_to])
        if len(self.eps) + max(len(self.eps) - before, 1) * left > MAX_NFA_STATES:
            hi = "" if node.hi is None else node.hi
            raise _too_many_states(f"the repeat {{{node.lo},{hi}}}")
        return start

    def _chars(self, ranges: tuple, nxt: int) -> int:
        key = (ranges, nxt)
        got = self._shared.get(key)
        if got is not None:
            return got
        sequences = _sequences(ranges)
        if not sequences:
            self._shared[key] = -1
            return -1
        start = self._shared[key] = self.new_state()
        edges = self.edges[start]
        for seq in sequences:
            lo, hi = seq[0]
            target = nxt if len(seq) == 1 else self._tail(seq[1:], nxt)
            edges.append((lo, hi, target))
        return start

    def _tail(self, ranges: tuple, nxt: int) -> int:
        """State reading the byte ranges of a multi-byte sequence's tail, then going to `nxt`."""
        key = ("tail", ranges, nxt)
        got = self._shared.get(key)
        if got is None:
            target = nxt if len(ranges) == 1 else self._tail(ranges[1:], nxt)
            got = self._shared[key] = self.new_state()
            self.edges[got].append((ranges[0][0], ranges[0][1], target))
        return got


class LazyDFA:
    """Determinize an NFA on demand; states are ints, rows are int32[256] (-1 = dead).

    Work and memory count against `budget`: DFA states and the target sets that lead to them
    are charged, the number of states and the NFA states in one are limited.
    """

    def __init__(self, nfa: NFA, budget: GrammarBudget | None = None):
        self.nfa = nfa
        self.budget = budget or GrammarBudget()
        self._by_targets: dict[frozenset[int], int] = {}
        self.states = StateRows(self.budget, "NFA states")
        self.sets = self.states.sets

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        """NFA states with byte edges or tags reachable from `states` by epsilon moves."""
        # One search from all of them: closures of single states overlap (nested optional
        # repeats), and keeping each one would cost their summed sizes.
        self.budget.check_time()
        seen = set(states)
        stack = list(states)
        eps = self.nfa.eps
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        edges, tags = self.nfa.edges, self.nfa.tags
        return frozenset(s for s in seen if edges[s] or s in tags)

    def intern(self, nfa_states) -> int:
        """DFA id of the closure of `nfa_states` (negative ones ignored); -1 when empty."""
        targets = frozenset(s for s in nfa_states if s >= 0)
        got = self._by_targets.get(targets)
        if got is not None:
            return got
        key = self.closure(targets)
        got = self.states.intern(key) if key else -1
        self.budget.charge(sys.getsizeof(targets) + DICT_ENTRY_BYTES)
        self._by_targets[targets] = got
        return got

    def row(self, state: int) -> np.ndarray:
        return self.states.row(state, self._compute_row)

    def _compute_row(self, state: int) -> np.ndarray:
        # Sweep the byte axis: targets enter at an edge's low byte and leave after its high one.
        events: dict[int, list[tuple[int, int]]] = {}
        for s in self.sets[state]:
            for lo, hi, t in self.nfa.edges[s]:
                events.setdefault(lo, []).append((t, 1))
                events.setdefault(hi + 1, []).append((t, -1))
        row = np.full(256, -1, dtype=np.int32)
        active: dict[int, int] = {}
        points = sorted(events)
        for a, b in zip(points, points[1:], strict=False):
            for t, delta in events[a]:
                n = active.get(t, 0) + delta
                if n:
                    active[t] = n
                else:
                    del active[t]
            if active:
                row[a:b] = self.intern(active)
        return row

    def tags(self, state: int) -> list[int]:
        """Tags of the accepting NFA states in `state`."""
        tags = self.nfa.tags
        return [tags[s] for s in self.sets[state] if s in tags]


# Per NFA state: its two lists, its id (an int object) and its build memo entries (measured).
_NFA_STATE_BYTES = 2 * sys.getsizeof([]) + 32 + 200
_EDGE_BYTES = sys.getsizeof((0, 0, 0)) + 8  # a (lo, hi, target) tuple and its list slot


def nfa_nbytes(nfa: NFA) -> int:
    """Rough bytes an NFA holds: states, epsilon moves, byte edges, tags."""
    moves = sum(map(len, nfa.eps))
    edges = sum(map(len, nfa.edges))
    return (
        len(nfa.eps) * _NFA_STATE_BYTES
        + 8 * moves
        + edges * _EDGE_BYTES
        + len(nfa.tags) * DICT_ENTRY_BYTES
    )
