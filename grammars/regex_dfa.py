"""Explicit code point DFAs (the `Dfa` IR node's table) and which (state, length) pairs can finish.

`regex_algebra` explores intersections, differences and length bounds of regexes as a DFA
over code point classes and hands it on as it is, where writing it back as a regex would grow
without bound; the NFA walks it lazily, with a count of the code points read when its words
have length bounds. Every state of a table can reach an accepting state (the builder trims
the rest), so a state is alive unless a length bound rules it out, which `live` decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .regex_ir import Ranges

Moves = tuple[tuple[Ranges, int], ...]  # (code point ranges, target state) per class


class DfaTable:
    """States 0..n-1 with `moves[s]` and `accepting[s]`; all of them can reach acceptance."""

    def __init__(
        self,
        moves: Sequence[Moves],
        accepting: Sequence[bool],
        lengths: tuple[Sequence[float], Sequence[float]] | None = None,
        covers_text: bool = False,
    ):
        self.moves = moves  # any sequence: a builder may make each row when it is first read
        self.accepting = accepting
        # whether every state has a move on every code point (so every string can be read
        # from each: the trie walk takes the text tokens whole there, `Dfa.reads_any_text`);
        # False where the builder does not know
        self.covers_text = covers_text
        # per state: the shortest accepted suffix, and the longest one (inf past a cycle);
        # `lengths` gives both when the builder knows them (so no row is read here)
        self.shortest, self.longest = lengths or (self._shortest(), self._longest())
        self._lengths: dict[int, list[int]] = {}  # bits: accepted suffix lengths, by width

    def __len__(self) -> int:
        return len(self.moves)

    def _predecessors(self) -> list[list[int]]:
        preds: list[list[int]] = [[] for _ in self.moves]
        for s, moves in enumerate(self.moves):
            for _ranges, t in moves:
                preds[t].append(s)
        return preds

    def _shortest(self) -> list[float]:
        """Breadth-first from the accepting states over reversed moves."""
        preds = self._predecessors()
        dist: list[float] = [0 if a else math.inf for a in self.accepting]
        frontier = [s for s, a in enumerate(self.accepting) if a]
        depth = 0
        while frontier:
            depth += 1
            nxt = []
            for t in frontier:
                for s in preds[t]:
                    if dist[s] == math.inf:
                        dist[s] = depth
                        nxt.append(s)
            frontier = nxt
        return dist

    def _longest(self) -> list[float]:
        """Peel off states whose successors are all done; what remains reaches a cycle."""
        preds = self._predecessors()
        out_degree = [len({t for _r, t in moves}) for moves in self.moves]
        longest: list[float] = [math.inf] * len(self.moves)
        ready = [s for s, d in enumerate(out_degree) if d == 0]
        while ready:
            s = ready.pop()
            targets = {t for _r, t in self.moves[s]}
            best = 0 if self.accepting[s] else -math.inf
            longest[s] = max([best] + [longest[t] + 1 for t in targets])
            for p in set(preds[s]):
                out_degree[p] -= 1
                if out_degree[p] == 0:
                    ready.append(p)
        return longest

    def live(
        self, s: int, count: int, lo: int, hi: int | None, check: Callable[[], None] | None = None
    ) -> bool:
        """Whether state `s`, `count` code points in, has an accepted suffix that ends the word
        with a length in [lo, hi]."""
        got = self.known_live(s, count, lo, hi)
        if got is None:
            got = self._window(self._suffix_lengths(lo + len(self), check)[s], count, lo, hi)
        return got

    def known_live(self, s: int, count: int, lo: int, hi: int | None) -> bool | None:
        """`live` when it needs no suffix lengths that are not computed yet, else None."""
        if hi is not None and count + self.shortest[s] > hi:
            return False
        if count >= lo:
            return True
        need = lo - count
        if self.longest[s] < need:
            return False
        # A suffix of length >= need exists, so one of length < need + len(self) does
        # (cut a cycle out of a longer one); only narrower windows need the exact lengths.
        if hi is None or hi - count >= need + len(self):
            return True
        got = self._lengths.get(lo + len(self))
        return None if got is None else self._window(got[s], count, lo, hi)

    @staticmethod
    def _window(bits: int, count: int, lo: int, hi: int) -> bool:
        """Whether a suffix length in `bits` ends the word with a length in [lo, hi]."""
        need = lo - count
        return bool(bits & (((1 << (hi - count - need + 1)) - 1) << need))

    def _suffix_lengths(self, width: int, check: Callable[[], None] | None) -> list[int]:
        """Per state, bit k set when it has an accepted suffix of length k (k < width)."""
        got = self._lengths.get(width)
        if got is None:
            preds = self._predecessors()
            got = [0] * len(self.moves)
            layer = {s for s, a in enumerate(self.accepting) if a}
            for k in range(width):
                if check is not None and k & 1023 == 0:
                    check()
                for s in layer:
                    got[s] |= 1 << k
                layer = {p for t in layer for p in preds[t]}
                if not layer:
                    break
            self._lengths[width] = got
        return got
