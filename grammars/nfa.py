"""Byte-level NFA over the regex IR, built lazily, and its lazily determinized DFA.

An NFA state stands for a place in the IR and what follows it: `add(node, next_state)` makes
(or finds) the state that reads `node` and then goes on to `next_state`, without looking
inside `node`; the state's epsilon moves are made the first time the DFA asks for them
(`moves`). So what is built is what a walk visits, not the whole language: a large schema
whose generation touches a small part of its IR builds that part. Equal (node, continuation)
pairs are one state, so the IR's sharing (it is a DAG) carries over.

Bounded repeats are counters. A repeat's body is built once, ending in an end state of its
own; the state after k copies is (node, k, next), and the body's states at count k are
*lifted* states, (body state, end, count state): the body's moves and edges with the end
replaced by the count state, made when a walk reaches them. So `x{0,32767}` builds x once and
a few lifted states per count a walk reads, and no bound is ever unrolled. A body that
matches the empty word is replaced by its non-empty words first (`regex_facts`), so a count
moves only when a byte is read and a closure never runs through the counts. Past a counter's
minimum a smaller count allows everything a larger one does, so a DFA state keeps one lifted
state per place in the body (`prune`), however many counts an ambiguous body such as
`(a?b?){0,1000}` could be at. A `Dfa` node (regex_algebra's explicit DFAs) is walked the same
way, its (table state, code points read) as the count when its words have length bounds.

Edges carry byte ranges; a code point set becomes its UTF-8 byte-range sequences, so a DFA
state can sit in the middle of a multi-byte character. Every NFA state can reach an accepting
state: a node that matches nothing (an empty character set, an empty alternation, a sequence
holding one, a Dfa whose length bounds cannot be met) compiles to -1 and is left out of what
contains it, and a Dfa's (state, count) is made only while its bounds can still be met.

An NFA holds at most `MAX_NFA_STATES` states. Until compilation ends the compile deadline
bounds its work; once a LazyDFA uses it, what it builds is charged to the grammar's budget
as it is built and the budget's clock bounds the work.

The DFA is built on demand: a state is the set of NFA states with byte edges or tags in an
epsilon closure, interned to an int; its 256-entry row of successors (-1 = dead) is computed
the first time someone asks for it. A cached grammar holds hundreds of thousands of NFA
states, so their lists are cheap to keep, free and collect: an NFA state's moves and edges are
each one bytes object of packed C ints (`_packed`; until made, a state's key waits in their
place, the tuple its dict finds it by), DFA states are tuples of ints (which
Python's cyclic collector stops tracking). `dfa_rows.c` (see `native_rows`) runs the rows,
closures and interning and the NFA states they make in C over these same lists and dicts
(`_parts`); the code here is its twin. The C rows also give each state number one int object
that all their tuples and keys share (`_ints`), and take the lists of states, which hold
nothing a reference cycle could run through, out of the collector's sight. (One
module past 400 lines: the DFA's closure and the NFA's lazily made moves, lifts and pruning
are two halves of one construction.)
"""

from __future__ import annotations

import functools
import sys
import time
from array import array
from collections.abc import Iterable

import numpy as np

from .budget import GrammarBudget, GrammarBudgetExceeded
from .native_rows import dfa_rows
from .regex_facts import IrFacts
from .regex_ir import Alt, Chars, Dfa, Ranges, Ref, Repeat, Seq, shared_chars, utf8_sequences
from .states import DICT_ENTRY_BYTES, ROW_BYTES, StateRows, untracked

MAX_NFA_STATES = 500_000
_CHECK_EVERY = 256  # closure steps between clock checks

# Per NFA state: its two packed lists, its id, its key and dict entry (measured, roughly).
_NFA_STATE_BYTES = 2 * sys.getsizeof(b"") + 32 + 200
_MOVE_BYTES = array("i").itemsize  # a move: one packed int
_EDGE_BYTES = 3 * _MOVE_BYTES  # an edge: lo, hi, target
_TUPLE_BYTES = (sys.getsizeof(()), sys.getsizeof((0,)) - sys.getsizeof(()))  # base, per item


class CompileTimeout(ValueError):
    """Grammar compilation ran past its time limit (a ValueError: the input is at fault)."""


class EmptyLanguage(ValueError):
    """The grammar matches no text at all (an unsatisfiable schema, say)."""


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


def _packed(ints: Iterable[int]) -> bytes:
    """A state's moves, or its edges' (lo, hi, target) flattened, as the NFA keeps them: C ints
    in a bytes object (one object per list, no int objects in it; what `dfa_rows.c` reads)."""
    return array("i", ints).tobytes()


def _unpacked(packed: bytes) -> list[int]:
    return memoryview(packed).cast("i").tolist()


def _triples(packed: bytes) -> list[tuple[int, int, int]]:
    ints = _unpacked(packed)
    return list(zip(ints[0::3], ints[1::3], ints[2::3], strict=True))


@functools.lru_cache(maxsize=4096)
def _sequences(ranges: tuple) -> tuple:
    """The UTF-8 byte-range sequences of the code points `ranges`, each a tuple of (lo, hi)."""
    out: list[tuple] = []
    for lo, hi in ranges:
        if lo <= 0x7F:  # one byte each: no splitting to do
            out.append(((lo, min(hi, 0x7F)),))
        if hi > 0x7F:
            out.extend(_multibyte_sequences(max(lo, 0x80), hi))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _multibyte_sequences(lo: int, hi: int) -> tuple:
    """`_sequences` of lo..hi (past ASCII), kept apart: classes that differ in their ASCII
    characters (an explicit DFA's classes, state by state) share their non-ASCII part."""
    return tuple(tuple(seq) for seq in utf8_sequences(lo, hi))


@functools.lru_cache(maxsize=8192)
def _spelled(spell, ranges: Ranges):
    """What a Dfa with this `spell` reads for one code point of `ranges`: one IR node per pair,
    shared by the grammars whose explicit DFAs read the class (the names excluded by many
    schemas' objects); the C rows call the cache itself, so a class spelled before costs them
    no Python frame."""
    chars = shared_chars(ranges)
    return chars if spell is None else spell(chars)


class NFA:
    """Lazy byte-range NFA; `tags[state]` marks accepting states (terminal id for lexers, 0 else)."""

    def __init__(self, deadline: Deadline | None = None):
        self.tags: dict[int, int] = {}
        self.deadline = deadline or Deadline(None)
        self.budget: GrammarBudget | None = None  # set by the LazyDFA that walks it
        self.nbytes = 0
        self.facts = IrFacts(self.check)
        # Packed (`_packed`), or not made yet and made on first use: a node state's moves are
        # its key (node, arg, next) until then, a literal run's edges its key (Seq, i, next),
        # a lifted state's moves and edges None
        self._eps: list[bytes | tuple | None] = []
        self._edges: list[bytes | tuple | None] = []
        self._runs: dict[tuple, int] = {}  # (Seq, i, next) -> state
        self._ids: dict[tuple, int] = {}  # (node, arg, next) -> state
        self._shared: dict[tuple, int] = {}  # character states by ranges and continuation
        self._ends: dict[int, int] = {}  # id(counted node) -> the end state of its body
        self._body_irs: dict[tuple, object] = {}  # (id(node), ranges) -> IR of one count
        self._bodies: dict[tuple, int] = {}  # (id(node), ranges) -> start, ending in node's end
        self._lifts: dict[tuple[int, int, int], int] = {}  # (state, end, target) -> lifted
        self._lifted: dict[int, tuple[int, int, int]] = {}  # lifted -> (state, end, target)
        self._order: dict[int, tuple[tuple, int]] = {}  # counter -> (its counter, its count)
        # the C rows' int object of each state number, shared
        self._ints: list[int] = []
        # the states of Dfas that read any text (`Dfa.reads_any_text`): a DFA state whose
        # closure passes through one reads every string of text
        self.any_text: set[int] = set()
        # what the C rows (`dfa_rows.c`) read and write, in one attribute
        self._parts = (self._eps, self._edges, self._runs, self._ids, self._shared, self._lifts,
                       self._lifted, self._order, self.tags, self._ends, self._bodies,
                       self._body_irs, self.facts._counted, self._ints, self.any_text)  # fmt: skip

    def __len__(self) -> int:
        return len(self._eps)

    def containers(self) -> list:
        """The lists and dicts this NFA alone holds (see `reaper`)."""
        return [*self._parts, *self.facts.containers()]

    def check(self) -> None:
        """The compile deadline while compiling, the budget's clock after."""
        if self.budget is None or self.budget.limits is None:
            self.deadline.check()
        else:
            self.budget.check_time()

    def _charge(self, nbytes: int) -> None:
        if self.budget is not None:
            self.budget.charge(nbytes)
        self.nbytes += nbytes

    def new_state(
        self, moves: bytes | tuple | None = b"", edges: bytes | tuple | None = b""
    ) -> int:
        """A state with packed `moves` and `edges` (a key or None: made on first use)."""
        if len(self._eps) >= MAX_NFA_STATES:
            raise GrammarBudgetExceeded(
                "MAX_NFA_STATES", f"more than {MAX_NFA_STATES} NFA states, the limit per grammar"
            )
        self._charge(_NFA_STATE_BYTES)
        self._eps.append(moves)
        self._edges.append(edges)
        return len(self._eps) - 1

    def add(self, node, nxt: int) -> int:
        """A state that reads `node`, then goes on to `nxt`; -1 if `node` matches nothing."""
        if self.facts.dead(node):
            return -1
        if isinstance(node, Chars):
            return self._chars(node.ranges, nxt)
        if isinstance(node, Seq):
            # A sequence is its first item, then the rest: no state of its own waits before the
            # first item (a loop, however deep sequences that start with one nest).
            while node.items and isinstance(node.items[0], Seq):
                nxt = self._rest(node, 1, nxt)
                node = node.items[0]
            if not node.items or isinstance(node.items[0], Chars):
                return self._rest(node, 0, nxt)
            return self.add(node.items[0], self._rest(node, 1, nxt))
        if isinstance(node, Dfa):
            return self._counter(node, (node.start, 0), nxt)
        return (
            self._counter(node, 0, nxt) if isinstance(node, Repeat) else self._state(node, 0, nxt)
        )

    def moves(self, state: int) -> list[int]:
        """The epsilon moves of `state`, made now if they were not yet."""
        eps = self._eps[state]
        if type(eps) is tuple:
            eps = self._node_moves(state, eps)
        elif eps is None:
            eps = self._unwrap(state, True)
        return _unpacked(eps)

    def edges(self, state: int) -> list[tuple[int, int, int]]:
        """The byte edges (lo, hi, target) of `state`, made now if they were not yet."""
        edges = self._edges[state]
        if type(edges) is tuple:
            edges = self._run_edges(state, edges)
        elif edges is None:
            edges = self._unwrap(state, False)
        return _triples(edges)

    def has_edges(self, state: int) -> bool:
        """Whether `state` has byte edges (without making a lifted state's or a run's)."""
        while state in self._lifted:
            state = self._lifted[state][0]
        edges = self._edges[state]
        return bool(edges)  # a key: a literal run's, which are never empty

    def prune(self, states: list[int]) -> list[int]:
        """`states` less the lifted ones that another one subsumes: the same place in the same
        counted body, one count further past the counter's minimum (a smaller count allows every
        word a larger one does, so the set's language stays the same while its size stops
        growing with the counts an ambiguous body like `(a?b?){0,1000}` can be at)."""
        best: dict[tuple, tuple[int, int]] = {}
        out = []
        for s in states:
            lift = self._lifted.get(s)
            order = None if lift is None else self._order.get(lift[2])
            if order is None:
                out.append(s)
                continue
            key = (lift[0], lift[1], order[0])
            got = best.get(key)
            if got is None or order[1] < got[1]:
                best[key] = (s, order[1])
        out.extend(s for s, _count in best.values())
        return out

    def _node_moves(self, state: int, key: tuple[object, object, int]) -> bytes:
        node, arg, nxt = key
        if isinstance(node, Seq):
            out = [self.add(node.items[arg], self._rest(node, arg + 1, nxt))]
        elif isinstance(node, Alt):
            out = [self.add(item, nxt) for item in node.items]
        elif isinstance(node, Repeat):
            out = self._repeat_moves(node, arg, nxt)
        else:
            out = self._dfa_moves(node, arg, nxt)
        live = [t for t in out if t >= 0]
        self._charge(_MOVE_BYTES * len(live))
        packed = self._eps[state] = _packed(live)
        return packed

    def _unwrap(self, state: int, moves: bool) -> bytes:
        """Packed moves (or edges) of a lifted state: down its lifts (a loop, however deep they
        nest) to a state whose list is made, then back up, lifting the list once per level."""
        lists = self._eps if moves else self._edges
        chain = []
        while lists[state] is None and state in self._lifted:  # else: made, or a key
            chain.append(state)
            state = self._lifted[state][0]
        inner = self.moves(state) if moves else [x for e in self.edges(state) for x in e]
        step = 1 if moves else 3  # a target every `step` ints
        packed = b""
        for lifted in reversed(chain):
            _x, end, target = self._lifted[lifted]
            inner = [t if j % step != step - 1 else target if t == end else self._lift(t, end, target)
                     for j, t in enumerate(inner)]  # fmt: skip
            packed = lists[lifted] = _packed(inner)
            self._charge((_MOVE_BYTES if moves else _EDGE_BYTES) * (len(inner) // step))
        return packed

    def _lift(self, state: int, end: int, target: int) -> int:
        """`state` of a counted body built once to end in `end`, going on to `target` instead:
        the body's states are shared by every count, a lifted state per place and count is
        made only when a walk reaches it."""
        if state == end:
            return target
        key = (state, end, target)
        got = self._lifts.get(key)
        if got is None:
            got = self._lifts[key] = self.new_state(None, None)
            self._lifted[got] = key
        return got

    def _state(self, node, arg: object, nxt: int) -> int:
        key = (node, arg, nxt)  # nodes compare by identity
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = self.new_state(moves=key)
        return got

    def _counter(self, node: Repeat | Dfa, arg: object, nxt: int) -> int:
        """The state of a counted node: `arg` is the count of a Repeat, (table state, count) of
        a Dfa. Past the node's minimum count, `prune` may drop it for a smaller count."""
        made = len(self._eps)
        got = self._state(node, arg, nxt)
        if got < made:  # found: marked when it was made
            return got
        if isinstance(node, Repeat):
            if arg >= self.facts.counted(node)[1]:
                self._order[got] = ((id(node), nxt), arg)
            return got
        if node.reads_any_text:
            self.any_text.add(got)
        if arg[1] >= node.lo:
            self._order[got] = ((id(node), arg[0], nxt), arg[1])
        return got

    def _rest(self, node: Seq, i: int, nxt: int) -> int:
        """State reading `node.items[i:]`, then going on to `nxt`.

        Characters followed by characters (a literal) are a run state whose edges, to the run
        state of the next position, are made when a row first reads them: a walk that reads
        two letters of a property name builds two states, not the name. The last character of
        a run is a shared character state; the item after the run waits in a state of its own.
        """
        items = node.items
        if i + 1 < len(items) and isinstance(items[i], Chars) and isinstance(items[i + 1], Chars):
            key = (node, i, nxt)
            got = self._runs.get(key)
            if got is None:
                got = self._runs[key] = self.new_state(edges=key)
            return got
        if i < len(items) and isinstance(items[i], Chars):
            target = nxt if i + 1 == len(items) else self._state(node, i + 1, nxt)
            return self._chars(items[i].ranges, target)
        return nxt if i == len(items) else self._state(node, i, nxt)

    def _run_edges(self, state: int, run: tuple[Seq, int, int]) -> bytes:
        """The packed edges of a literal run's state: its character, to the rest of the run."""
        node, i, nxt = run
        edges = self._edges[state] = self._char_edges(
            node.items[i].ranges, self._rest(node, i + 1, nxt)
        )
        self._charge(len(edges))  # packed: _EDGE_BYTES an edge
        return edges

    def _end(self, node) -> int:
        got = self._ends.get(id(node))
        if got is None:
            got = self._ends[id(node)] = self.new_state()
        return got

    def _body_ir(self, node: Repeat | Dfa, ranges: Ranges | None):
        """IR of what `node` reads for one count: a Repeat's body (`ranges` None), what a Dfa
        reads for the code points `ranges`; made once, so that its NFA states are shared."""
        key = (id(node), ranges)
        got = self._body_irs.get(key)
        if got is None:
            got = self.facts.counted(node)[0] if ranges is None else _spelled(node.spell, ranges)
            self._body_irs[key] = got
        return got

    def _copy(self, node: Repeat | Dfa, ranges: Ranges | None, target: int) -> int:
        """State reading one count of `node` (see `_body_ir`), then going on to `target`; -1 if
        it matches nothing.

        Where counts run past 1 (a bounded repeat such as `x{0,300}`), the body is built once,
        ending in `node`'s end state, and lifted to each count's target. Where they do not
        (`x*`, `x+` and unbounded Dfas stop counting at their minimum; `x?` counts to 1), each
        target is reached from few places, and building the body straight into it saves the
        lifting, which nested repeats (free JSON values) would otherwise stack level on level.
        """
        if node.hi is None or node.hi <= 1:
            return self.add(self._body_ir(node, ranges), target)
        key = (id(node), ranges)
        start = self._bodies.get(key)
        if start is None:
            start = self._bodies[key] = self.add(self._body_ir(node, ranges), self._end(node))
        return -1 if start < 0 else self._lift(start, self._end(node), target)

    def _repeat_moves(self, node: Repeat, k: int, nxt: int) -> list[int]:
        """Moves after k copies: out when k is enough, into one more copy when allowed."""
        body, lo, hi = self.facts.counted(node)
        out = [nxt] if k >= lo else []
        if body is not None and (hi is None or k < hi):
            more = k + 1 if hi is not None or k < lo else k  # unbounded: count only to lo
            start = self._copy(node, None, self._counter(node, more, nxt))
            if start >= 0:
                out.append(start)
        return out

    def _dfa_moves(self, node: Dfa, arg: tuple[int, int], nxt: int) -> list[int]:
        """Moves of a Dfa state `arg` = (table state, code points read)."""
        table, (s, count) = node.table, arg
        out = [nxt] if table.accepting[s] and count >= node.lo else []
        more = count + 1 if node.hi is not None or count < node.lo else count
        for ranges, t in table.moves[s]:
            if table.live(t, more, node.lo, node.hi, self.check):
                start = self._copy(node, ranges, self._counter(node, (t, more), nxt))
                if start >= 0:
                    out.append(start)
        return out

    def _chars(self, ranges: Ranges, nxt: int) -> int:
        key = (ranges, nxt)
        got = self._shared.get(key)
        if got is not None:
            return got
        if not _sequences(ranges):
            self._shared[key] = -1
            return -1
        edges = self._char_edges(ranges, nxt)
        start = self._shared[key] = self.new_state(edges=edges)
        self._charge(len(edges) + DICT_ENTRY_BYTES)
        return start

    def _char_edges(self, ranges: Ranges, nxt: int) -> bytes:
        """Packed edges reading one code point of `ranges` (its UTF-8 bytes), then `nxt`."""
        return _packed(
            x
            for seq in _sequences(ranges)
            for x in (seq[0][0], seq[0][1], nxt if len(seq) == 1 else self._tail(seq[1:], nxt))
        )

    def _tail(self, ranges: tuple, nxt: int) -> int:
        """State reading the byte ranges of a multi-byte sequence's tail, then going to `nxt`."""
        key = ("tail", ranges, nxt)
        got = self._shared.get(key)
        if got is None:
            target = nxt if len(ranges) == 1 else self._tail(ranges[1:], nxt)
            got = self._shared[key] = self.new_state(edges=_packed((*ranges[0], target)))
            self._charge(_EDGE_BYTES + DICT_ENTRY_BYTES)
        return got


def configured_rows():
    """The C rows (`native_rows.dfa_rows`) told what they read of the IR and the NFA, or
    None."""
    native = dfa_rows()
    if native is not None:
        _configure(native)
    return native


@functools.cache
def _configure(native) -> None:
    """Tell the C rows, once, the IR classes, helpers and costs they read."""
    native.configure(Chars, Seq, Alt, Repeat, Dfa, Ref, _sequences, _spelled,
                     MAX_NFA_STATES, _NFA_STATE_BYTES, _EDGE_BYTES, DICT_ENTRY_BYTES,
                     *_TUPLE_BYTES, ROW_BYTES)  # fmt: skip


def byte_groups(values: np.ndarray, native=None) -> tuple[tuple[int, ...], np.ndarray]:
    """The distinct values of `values` (int32[256]) in increasing order, less the least when
    it is negative (a dead target), and per byte the index of its value among them (int32;
    -1 for that one): the C module's count (`native`, when given), else numpy's `unique`."""
    inverse = np.empty(256, dtype=np.int32)
    if native is not None:
        return native.byte_groups(values, inverse), inverse
    distinct, where = np.unique(values, return_inverse=True)
    inverse[:] = where.reshape(-1)
    live = tuple(distinct.tolist())
    if live[0] < 0:
        return live[1:], inverse - 1
    return live, inverse


def untrack_ir(*nodes) -> None:
    """Take the IR graphs from `nodes` out of the cyclic collector's sight, where the C rows
    are built: no reference cycle runs through IR (it is immutable and built from its leaves
    up; a `Ref` names its rule), and IR a cached grammar or the sub-schema memo keeps would
    otherwise be walked by every full collection."""
    native = configured_rows()
    if native is not None:
        for node in nodes:
            native.untrack_ir(node)


class LazyDFA:
    """Determinize an NFA on demand; states are ints, rows are int32[256] (-1 = dead).

    Work and memory count against `budget`: the NFA states built from now on, DFA states and
    the target sets that lead to them are charged, the number of states and the NFA states
    in one are limited.
    """

    def __init__(self, nfa: NFA, budget: GrammarBudget | None = None):
        self.nfa = nfa
        self.budget = budget or GrammarBudget()
        nfa.budget = self.budget
        self._by_targets: dict[int | tuple[int, ...], int] = {}  # a single target: its int
        self._tags: dict[int, tuple[int, ...]] = {}
        self.states = StateRows(self.budget, "NFA states")
        self.sets = self.states.sets
        self._native = (
            configured_rows()
        )  # the C twin of `closure`, `_compute_row` and what they make
        self._ints: list[int] = []  # the C rows' int object of each DFA state number, shared
        # what the C rows read of this DFA, in one attribute
        self._parts = (self._by_targets, self.states._ids, self.sets, self.states._rows,
                       self.states, self.budget, self._ints)  # fmt: skip

    @property
    def native(self):
        """The C rows (`dfa_rows.c`) where they compute this DFA's rows, else None."""
        return self._native

    def containers(self) -> list:
        """The lists and dicts this DFA and its NFA alone hold (see `reaper`)."""
        return [self._by_targets, self._tags, self._ints, *self.states.containers(),
                *self.nfa.containers()]  # fmt: skip

    def untrack_ir(self, *nodes) -> None:
        """`untrack_ir` of the IR the NFA reads as it grows (`nodes`), then of what the NFA's
        Python code made of it while the grammar compiled (its waiting states' entries), which
        a cached grammar would otherwise keep in every full collection's sight."""
        untrack_ir(*nodes)
        if self._native is not None:
            self._native.untrack_made(self.nfa)

    def closure(self, states: tuple[int, ...]) -> tuple[int, ...]:
        """NFA states with byte edges or tags reachable from `states` by epsilon moves, less
        the counted ones another subsumes (`NFA.prune`)."""
        return self._closure(states)[0]

    def _closure(self, states: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """`closure`, and whether it passes through a state that reads any text
        (`NFA.any_text`)."""
        self.budget.check_time()
        if self._native is not None:
            return self._native.closure(self.nfa, self.budget, states, True)
        nfa = self.nfa
        if len(states) == 1 and nfa._eps[states[0]] == b"":  # a state with no moves: itself
            alone = nfa.has_edges(states[0]) or states[0] in nfa.tags
            return states if alone else (), False
        # One search from all of them: closures of single states overlap (nested optional
        # repeats), and keeping each one would cost their summed sizes.
        seen = set(states)
        stack = list(states)
        steps = 0
        while stack:
            steps += 1
            if steps % _CHECK_EVERY == 0:
                nfa.check()
            for t in nfa.moves(stack.pop()):
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        tags = nfa.tags
        closed = tuple(sorted(nfa.prune([s for s in seen if nfa.has_edges(s) or s in tags])))
        return closed, not nfa.any_text.isdisjoint(seen)

    def intern(self, nfa_states) -> int:
        """DFA id of the closure of `nfa_states` (negative ones ignored); -1 when empty."""
        return self._target_id(tuple(sorted({s for s in nfa_states if s >= 0})))

    def _target_id(self, targets: tuple[int, ...]) -> int:
        """DFA id of the closure of `targets` (sorted, distinct, none negative); kept by the
        one target's int (most are one: no tuple), else by the tuple."""
        single = len(targets) == 1
        key = targets[0] if single else targets
        got = self._by_targets.get(key)
        if got is not None:
            return got
        closed, any_text = self._closure(targets)
        got = self.states.intern(closed, any_text) if closed else -1
        self.budget.charge(DICT_ENTRY_BYTES + (0 if single else sys.getsizeof(targets)))
        self._by_targets[key] = got
        return got

    def row(self, state: int) -> np.ndarray:
        return self.states.row(state, self._compute_row)

    def _compute_row(self, state: int, row: np.ndarray) -> None:
        if self._native is not None:
            self._native.fill_row(self, self.nfa, self.sets[state], row)
            return
        nfa = self.nfa
        edges = []
        for s in self.sets[state]:
            edges.extend(nfa.edges(s))
        edges.sort()
        by_targets = self._by_targets
        if all(e[1] < f[0] for e, f in zip(edges, edges[1:], strict=False)):
            # No two edges share a byte (a literal, a character class): one target each.
            for lo, hi, t in edges:
                got = by_targets.get(t)
                row[lo : hi + 1] = self._target_id((t,)) if got is None else got
            return
        # Sweep the byte axis: targets enter at an edge's low byte and leave after its high one.
        events: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, t in edges:
            events.setdefault(lo, []).append((t, 1))
            events.setdefault(hi + 1, []).append((t, -1))
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
                key = tuple(sorted(active))
                got = by_targets.get(key)
                row[a:b] = self._target_id(key) if got is None else got

    def byte_groups(self, state: int) -> tuple[tuple[int, ...], np.ndarray]:
        """The live targets of `state`'s row, in increasing order, and per byte the index of
        its target among them (int32; -1: dead)."""
        return byte_groups(self.row(state), self._native)

    def tags(self, state: int) -> tuple[int, ...]:
        """Tags of the accepting NFA states in `state` (kept: parser states share lexer states)."""
        got = self._tags.get(state)
        if got is None:
            tags = self.nfa.tags
            got = self._tags[state] = untracked(
                tuple(tags[s] for s in self.sets[state] if s in tags)
            )
            self.budget.charge(sys.getsizeof(got) + DICT_ENTRY_BYTES)
        return got


def nfa_nbytes(nfa: NFA) -> int:
    """Bytes the NFA has built so far: states, epsilon moves, byte edges."""
    return nfa.nbytes
