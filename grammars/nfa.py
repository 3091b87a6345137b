"""Byte-level NFA built from the regex IR, and its lazily determinized DFA.

The NFA is built backwards (`add(node, next_state) -> start_state`): compiling the same IR node
with the same continuation twice reuses the first copy, so shared suffixes (JSON objects with
optional properties, array separators) stay linear in size. Edges carry byte ranges; a code
point set becomes its UTF-8 byte-range sequences, so a DFA state can sit in the middle of a
multi-byte character.

The DFA is built on demand: a state is an epsilon-closed set of NFA states from which an
accepting state is reachable (others are dropped), interned to an int; its 256-entry row of
successors (-1 = dead) is computed the first time someone asks for it.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from .regex_ir import Alt, Chars, Ref, Repeat, Seq, utf8_sequences


class CompileTimeout(TimeoutError):
    """Grammar compilation ran past its time limit."""


class Deadline:
    """A wall-clock limit checked at loop heads during compilation."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.end = None if seconds is None else time.perf_counter() + seconds

    def check(self) -> None:
        if self.end is not None and time.perf_counter() > self.end:
            raise CompileTimeout(f"grammar compilation exceeded its {self.seconds:.1f} s limit")


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
        self._seq_memo: dict[tuple, int] = {}
        self._deadline = deadline or Deadline(None)

    def new_state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def add(self, node, nxt: int) -> int:
        """Compile `node` so that it ends in state `nxt`; return its start state."""
        key = (id(node), nxt)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        if len(self.eps) & 1023 == 0:
            self._deadline.check()
        start = self._build(node, nxt)
        self._memo[key] = (node, start)
        return start

    def _build(self, node, nxt: int) -> int:
        if isinstance(node, Chars):
            return self._chars(node, nxt)
        if isinstance(node, Seq):
            for item in reversed(node.items):
                nxt = self.add(item, nxt)
            return nxt
        if isinstance(node, Alt):
            start = self.new_state()
            self.eps[start].extend(self.add(item, nxt) for item in node.items)
            return start
        if isinstance(node, Repeat):
            return self._repeat(node, nxt)
        if isinstance(node, Ref):
            raise ValueError(f"rule reference {node.name!r} inside a regular expression")
        raise TypeError(f"not a regex IR node: {node!r}")

    def _repeat(self, node: Repeat, nxt: int) -> int:
        if node.hi is None:
            loop = self.new_state()
            self.eps[loop].extend((self._build(node.item, loop), nxt))
            nxt = loop
        else:
            if node.hi < node.lo:
                raise ValueError(f"repeat with max {node.hi} < min {node.lo}")
            for _ in range(node.hi - node.lo):
                skip = self.new_state()
                self.eps[skip].extend((self._build(node.item, nxt), nxt))
                nxt = skip
        for _ in range(node.lo):
            nxt = self._build(node.item, nxt)
        return nxt

    def _chars(self, node: Chars, nxt: int) -> int:
        start = self.new_state()
        edges = self.edges[start]
        for ranges in _sequences(node.ranges):
            lo, hi = ranges[0]
            if len(ranges) == 1:
                edges.append((lo, hi, nxt))
                continue
            # The tail of a multi-byte sequence leads only to `nxt`: share it.
            key = (ranges[1:], nxt)
            target = self._seq_memo.get(key, -1)
            if target < 0:
                target = self._seq_memo[key] = self.new_state()
                self._tail(ranges[1:], target, nxt)
            edges.append((lo, hi, target))
        return start

    def _tail(self, ranges, cur: int, nxt: int) -> None:
        for i, (a, b) in enumerate(ranges):
            target = nxt if i == len(ranges) - 1 else self.new_state()
            self.edges[cur].append((a, b, target))
            cur = target

    def coreachable(self) -> np.ndarray:
        """States from which some accepting state is reachable."""
        n = len(self.eps)
        rev: list[list[int]] = [[] for _ in range(n)]
        for s in range(n):
            for t in self.eps[s]:
                rev[t].append(s)
            for _a, _b, t in self.edges[s]:
                rev[t].append(s)
        seen = np.zeros(n, dtype=bool)
        stack = list(self.tags)
        seen[stack] = True
        while stack:
            for p in rev[stack.pop()]:
                if not seen[p]:
                    seen[p] = True
                    stack.append(p)
        return seen


class LazyDFA:
    """Determinize an NFA on demand; states are ints, rows are int32[256] (-1 = dead)."""

    def __init__(self, nfa: NFA):
        self.nfa = nfa
        self._live = nfa.coreachable()
        self._closure: dict[int, frozenset[int]] = {}
        self.sets: list[frozenset[int]] = []
        self._ids: dict[frozenset[int], int] = {}
        self.table = np.full((16, 256), -1, dtype=np.int32)
        self.done = np.zeros(16, dtype=bool)

    def closure_of(self, state: int) -> frozenset[int]:
        got = self._closure.get(state)
        if got is None:
            seen = {state}
            stack = [state]
            eps = self.nfa.eps
            while stack:
                for t in eps[stack.pop()]:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            got = self._closure[state] = frozenset(s for s in seen if self._live[s])
        return got

    def intern(self, nfa_states) -> int:
        """DFA id of the closure of `nfa_states`; -1 when nothing there can still accept."""
        members: set[int] = set()
        for s in nfa_states:
            members |= self.closure_of(s)
        key = frozenset(members)
        if not key:
            return -1
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self.sets)
            self.sets.append(key)
            if got >= self.table.shape[0]:
                grow = self.table.shape[0]
                self.table = np.vstack([self.table, np.full((grow, 256), -1, dtype=np.int32)])
                self.done = np.concatenate([self.done, np.zeros(grow, dtype=bool)])
        return got

    def row(self, state: int) -> np.ndarray:
        if not self.done[state]:
            self._compute_row(state)
        return self.table[state]

    def _compute_row(self, state: int) -> None:
        edges = [e for s in self.sets[state] for e in self.nfa.edges[s]]
        points = sorted({e[0] for e in edges} | {e[1] + 1 for e in edges})
        row = np.full(256, -1, dtype=np.int32)
        for a, b in zip(points, points[1:], strict=False):
            targets = [t for lo, hi, t in edges if lo <= a <= hi]
            if targets:
                row[a:b] = self.intern(targets)
        self.table[state] = row  # after interning: interning may have reallocated the table
        self.done[state] = True

    def step_many(self, states: np.ndarray, data: np.ndarray) -> np.ndarray:
        """Successor of each (state, byte) pair."""
        todo = np.unique(states[~self.done[states]])
        for s in todo.tolist():
            self._compute_row(s)
        return self.table[states, data]

    def tags(self, state: int) -> list[int]:
        """Tags of the accepting NFA states in `state`."""
        tags = self.nfa.tags
        return [tags[s] for s in self.sets[state] if s in tags]
