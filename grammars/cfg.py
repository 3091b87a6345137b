"""Context-free grammars: BNF form, an incremental Earley parser, and the byte automaton over both.

Semantics: terminals are regular languages (regex IR) substituted into the context-free
rules, and the text may be split into terminals in any way the rules allow (no longest-match
lexing, no terminal priorities); `%ignore` terminals may appear between any two terminals.
This is Lark's Earley parser with `lexer='dynamic_complete'`. Ambiguous grammars are fine.

The byte automaton's state is a set of (Earley set, lexer DFA state, at_boundary) triples:
reading a byte steps every lexer state; when a lexer state accepts a terminal the parser
may scan it, which starts a fresh lexeme restricted to the terminals the new Earley set
expects. Sets are interned to ints, so the trie walk in `masks` works unchanged, and rows
are built lazily like the regex DFA's (in C where the native rows are built: `dfa_rows.cfg_row`,
which the C trie walk calls for a missing row; `_compute_row` is its twin).

    Earley set: items (rule, dot, origin set); `waiting[symbol]` -> the items that wait for
                that symbol, with the dot already moved past it (what a scan or completion adds)
    root --scan(t1)--> set1 --scan(t2)--> set2 ...   (each scan cached on the set)

Earley sets are named by their number in the parser's `sets`, and the automaton's states are
sorted tuples, so what a cached grammar keeps (items, waiting lists, states) is tuples of ints,
which Python's cyclic collector stops tracking: a full collection would otherwise walk every
item of every cached grammar.

EBNF is lowered to BNF without recursion (deep schemas nest their IR hundreds of levels).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from .budget import GrammarBudget
from .native_rows import dfa_rows
from .nfa import NFA, Deadline, EmptyLanguage, LazyDFA, byte_groups, configured_rows, nfa_nbytes
from .regex_ir import Alt, Chars, Dfa, Ref, Repeat, Seq, fold
from .states import DICT_ENTRY_BYTES, StateRows, untracked

_ITEM_BYTES = sys.getsizeof((0, 0, 0)) + 8  # an item tuple and its slot
_SET_BYTES = 4 * DICT_ENTRY_BYTES  # a set's entries in the chart's lists, its dicts, its key
_CHECK_EVERY = 4096  # agenda items between clock checks in a closure


@dataclass
class BNF:
    """Rules over terminals (regex IR, by index) and nonterminals (by name)."""

    terminals: list = field(default_factory=list)
    rules: list[tuple[str, tuple]] = field(default_factory=list)  # (lhs, symbols)
    start: str = "start"
    ignore: list[int] = field(default_factory=list)


def _nullable(node, kids: list[bool]) -> bool:
    if isinstance(node, Seq):
        return all(kids)
    if isinstance(node, Alt):
        return any(kids)
    if isinstance(node, Repeat):
        return node.lo == 0 or kids[0]
    if isinstance(node, Dfa):
        return node.nullable
    if isinstance(node, Chars):
        return False
    raise ValueError(f"not a regex IR node: {node!r}")


def _known_nullable(node) -> bool | None:
    facts = getattr(node, "facts", None)  # (dead, nullable), set when the node was made
    return None if facts is None else facts[1]


def _known_ref_free(node) -> bool | None:
    # A node knows its facts only when every node below it does, and a Ref never does.
    return None if getattr(node, "facts", None) is None else False


def nullable_ir(node, memo: dict | None = None) -> bool:
    """Whether a Ref-free IR node matches the empty word (`memo`: by node id, across calls)."""
    return fold(node, {} if memo is None else memo, _nullable, known=_known_nullable)


def _holds_ref(node, kids: list) -> bool:
    return isinstance(node, Ref) or any(kids)


def _has_ref(node, memo: dict, native) -> bool:
    """Whether IR `node` holds a `Ref` (`memo`: by node id, for the nodes without facts; the
    fold in C with `native`, the configured C rows: `dfa_rows.holds_ref`)."""
    if getattr(node, "facts", None) is not None:  # most nodes: no fold needed
        return False
    got = memo.get(id(node))  # asked again for most nodes that hold one (no fold call then)
    if got is not None:
        return got
    if native is not None:
        return native.holds_ref(node, memo)
    return fold(node, memo, _holds_ref, known=_known_ref_free)


class _EbnfLowering:
    def __init__(self, bnf: BNF, deadline: Deadline):
        self.bnf = bnf
        self.deadline = deadline
        self.memo: dict = {}  # id(node) -> whether it holds a Ref
        self.native = configured_rows()
        self.nullable: dict = {}  # id(node) -> whether it matches the empty word
        self.symbols: dict[int, object] = {}
        self.keep: list = []
        self.pending: list[tuple[str, object]] = []  # (symbol, IR) whose rules are not made
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"__aux{self.count}"

    def terminal(self, node) -> object:
        """A symbol for a Ref-free IR node (nullable ones get an epsilon alternative)."""
        index = len(self.bnf.terminals)
        self.bnf.terminals.append(node)
        if not nullable_ir(node, self.nullable):
            return index
        name = self.fresh()
        self.bnf.rules += [(name, ()), (name, (index,))]
        return name

    def symbol(self, node) -> object:
        key = id(node)
        if key in self.symbols:
            return self.symbols[key]
        self.keep.append(node)
        if isinstance(node, Ref):
            sym = node.name
        elif not _has_ref(node, self.memo, self.native):
            sym = self.terminal(node)
        else:
            sym = self.fresh()
            self.pending.append((sym, node))  # its rules wait: no recursion into deep IR
        self.symbols[key] = sym
        return sym

    def rules(self, name: str, node) -> None:
        """Rules for `name` -> `node`, and for every symbol they name, until none waits."""
        self.pending.append((name, node))
        while self.pending:
            lhs, item = self.pending.pop()
            if _has_ref(item, self.memo, self.native):
                self.bnf.rules += [(lhs, syms) for syms in self.alternatives(item)]
            else:
                self.bnf.rules.append((lhs, (self.symbol(item),)))

    def sequence(self, items) -> tuple:
        out, run = [], []
        memo, native = self.memo, self.native
        for item in items:
            if getattr(item, "facts", None) is None and _has_ref(item, memo, native):
                if run:
                    out.append(
                        self.symbol(Seq(tuple(run))) if len(run) > 1 else self.symbol(run[0])
                    )
                    run = []
                out.append(self.symbol(item))
            else:
                run.append(item)
        if run:
            out.append(self.symbol(Seq(tuple(run))) if len(run) > 1 else self.symbol(run[0]))
        return tuple(out)

    def alternatives(self, node) -> list[tuple]:
        self.deadline.check()
        if isinstance(node, Alt):  # each item alone: its own symbol, a terminal or a rule's
            return [(self.symbol(i),) for i in node.items]
        if isinstance(node, Seq):
            return [self.sequence(node.items)]
        if isinstance(node, Repeat):
            item = self.symbol(node.item)
            if node.hi is None:
                loop = self.fresh()
                self.bnf.rules += [(loop, ()), (loop, (loop, item))]
                return [(item,) * node.lo + (loop,)]
            return [(item,) * node.lo + self.optional_chain(item, node.hi - node.lo)]
        return [(self.symbol(node),)]

    def optional_chain(self, item: object, n: int) -> tuple:
        """Up to n more `item`s as right-linear rules, each one item and the rest optional
        (linear in n, where one alternative per count would be quadratic)."""
        rest: tuple = ()
        for _ in range(n):
            self.deadline.check()
            name = self.fresh()
            self.bnf.rules += [(name, ()), (name, (item, *rest))]
            rest = (name,)
        return rest


def bnf_from_ebnf(defs: dict, start: str, deadline: Deadline | None = None) -> BNF:
    """Lower {name: IR with Refs} to BNF; maximal Ref-free subtrees become terminals."""
    bnf = BNF(start=start)
    low = _EbnfLowering(bnf, deadline or Deadline(None))
    for name, node in defs.items():
        low.rules(name, node)
    return bnf


def _derivable(rules: list[tuple[int, tuple]], num_terminals: int, by_terminals: bool) -> set[int]:
    """The left-hand sides that have a rule whose every symbol is one of them or, where
    `by_terminals`, a terminal (symbols below `num_terminals`): the productive nonterminals,
    or without terminals the nullable ones. A worklist, each rule's count of missing symbols
    going down as they join, so linear in the grammar's size (in C where the native rows are
    built: `dfa_rows.derivable`)."""
    native = dfa_rows()
    if native is not None:
        return native.derivable(rules, num_terminals, by_terminals)
    missing = []
    users: dict[int, list[int]] = {}
    ready = []
    for i, (lhs, rhs) in enumerate(rules):
        if by_terminals:
            need = [s for s in rhs if s >= num_terminals]
        elif rhs and min(rhs) < num_terminals:
            missing.append(-1)  # a terminal: this rule never derives the empty word
            continue
        else:
            need = rhs
        missing.append(len(need))
        for s in need:
            users.setdefault(s, []).append(i)
        if not need:
            ready.append(lhs)
    out: set[int] = set()
    while ready:
        lhs = ready.pop()
        if lhs in out:
            continue
        out.add(lhs)
        for i in users.get(lhs, ()):
            missing[i] -= 1
            if missing[i] == 0:
                ready.append(rules[i][0])
    return out


_THIS_SET = -1  # a seed item's origin: the set being built


class EarleyParser:
    """Rules as ints: terminals 0..T-1, nonterminals T.. ; rule 0 is `S' -> start`.

    The chart holds each interned Earley set (by number, its items' origins numbers too) in
    parallel lists: the items waiting for each symbol (`waiting`, symbol -> items advanced
    past it), the terminals it expects (`expected`, sorted), whether it accepts, and the set
    after each terminal scanned so far (`next`, -1: none). Dicts of ints and tuples of ints
    in lists: no object per set, nothing a full collection of the cyclic collector walks
    (a cache of walked grammars holds their charts). The chart counts against `budget`: items
    per set, items in all sets, their bytes, and the clock while a closure runs.
    """

    def __init__(self, bnf: BNF, num_terminals: int, budget: GrammarBudget):
        names = dict.fromkeys([bnf.start] + [lhs for lhs, _ in bnf.rules])
        nt = {n: num_terminals + i for i, n in enumerate(names)}
        # terminals are ints, never keys of `nt`: they map to themselves
        rules = [(nt[lhs], tuple(map(nt.get, syms, syms))) for lhs, syms in bnf.rules]
        for _lhs, rhs in rules:
            for s in rhs:
                if type(s) is str:
                    raise ValueError(f"grammar uses undefined rule {s!r}")
        self.T = num_terminals
        rules = self._productive(rules, len(nt))
        if not any(lhs == nt[bnf.start] for lhs, _ in rules):
            raise ValueError(f"start rule {bnf.start!r} derives no finite text")
        self.rules = ((-1, (nt[bnf.start],)), *rules)  # a tuple, as `by_lhs`'s below
        by_lhs: dict[int, list[int]] = {}
        for i, (lhs, _) in enumerate(self.rules):
            by_lhs.setdefault(lhs, []).append(i)
        # tuples: the collector stops tracking a tuple of ints once it has seen it, never a list
        self.by_lhs = {lhs: tuple(rules) for lhs, rules in by_lhs.items()}
        self.nullable = self._nullable()
        self.budget = budget
        self.chart_items = 0  # items kept by the interned sets
        self.waiting: list[dict[int, tuple[tuple[int, int, int], ...]]] = []
        self.expected: list[tuple[int, ...]] = []
        self.accepting: list[bool] = []
        self.next: list[dict[int, int]] = []
        self._native = native = dfa_rows()
        if native is not None:  # dicts and tuples of ints, untracked as they are made
            native.untrack_lists(self.waiting, self.expected, self.accepting, self.next)
        self._interned: dict[tuple, int] = {}  # sorted seed items -> set number
        self.root = self._closure([(0, 0, _THIS_SET)])

    def containers(self) -> list:
        """The chart's lists and dict, which this parser alone holds (see `reaper`)."""
        return [self.waiting, self.expected, self.accepting, self.next, self._interned]

    def _productive(self, rules: list, num_nonterminals: int) -> list:
        good = _derivable(rules, self.T, True)
        if len(good) == num_nonterminals:  # most grammars: every rule is kept
            return rules
        T = self.T
        return [(lhs, rhs) for lhs, rhs in rules if all(s < T or s in good for s in rhs)]

    def _nullable(self) -> set[int]:
        return _derivable(list(self.rules), self.T, False)

    def _closure(self, seeds) -> int:
        """The number of the Earley set that `seeds` (items) start."""
        # Sets are interned by their seed items: different lexings that reach the same
        # items (e.g. NAME+ split anywhere) share one set, so the state space stays small.
        key = tuple(sorted(set(seeds)))
        got = self._interned.get(key)
        if got is not None:
            return got
        me = len(self.waiting)  # this set's number once kept
        if self._native is not None:  # the same set, in C (`dfa_rows.earley_closure`)
            kept, expected, accepting = self._native.earley_closure(
                key, me, self.rules, self.by_lhs, self.nullable, self.T, self.waiting,
                int(min(self.budget.limit("max_earley_items"), sys.maxsize)), self.budget,
            )  # fmt: skip
            return self._keep(key, kept, expected, accepting)
        seen: set[tuple] = set()
        completed: set[tuple] = set()  # (lhs, origin) pairs already completed
        agenda = [(r, d, me if o == _THIS_SET else o) for r, d, o in key]
        rules, by_lhs, nullable, T = self.rules, self.by_lhs, self.nullable, self.T
        budget = self.budget
        max_items = budget.limit("max_earley_items")
        waiting: dict[int, list[tuple[int, int, int]]] = {}
        expected = set()
        accepting = False
        popped = 0
        while agenda:
            item = agenda.pop()
            popped += 1
            if popped % _CHECK_EVERY == 0:
                budget.check_time()
            if item in seen:
                continue
            seen.add(item)
            if len(seen) > max_items:
                budget.check("max_earley_items", len(seen), "items in one Earley set")
            r, d, origin = item
            rhs = rules[r][1]
            if d < len(rhs):
                sym = rhs[d]
                waiting.setdefault(sym, []).append((r, d + 1, origin))
                if sym < T:
                    expected.add(sym)
                else:
                    agenda.extend((r2, 0, me) for r2 in by_lhs.get(sym, ()))
                    if sym in nullable:
                        agenda.append((r, d + 1, origin))
            elif r == 0:
                accepting = True
            elif origin != me and (rules[r][0], origin) not in completed:
                # Every rule of lhs completed from `origin` advances the same items there.
                lhs = rules[r][0]
                completed.add((lhs, origin))
                agenda.extend(self.waiting[origin].get(lhs, ()))
        kept = {sym: untracked(tuple(items)) for sym, items in waiting.items()}
        return self._keep(key, kept, untracked(tuple(sorted(expected))), accepting)

    def _keep(self, key: tuple, waiting: dict, expected: tuple[int, ...], accepting: bool) -> int:
        """Intern a finished set, within the chart's budget; its number."""
        items = sum(map(len, waiting.values()))
        self.budget.check("max_chart_items", self.chart_items + items, "items in the Earley chart")
        self.budget.charge(items * _ITEM_BYTES + len(key) * _ITEM_BYTES + _SET_BYTES)
        self.chart_items += items
        got = self._interned[untracked(key)] = len(self.waiting)
        self.waiting.append(waiting)
        self.expected.append(expected)
        self.accepting.append(accepting)
        self.next.append({})
        return got

    def scan(self, at: int, terminal: int) -> int:
        """The number of the Earley set after `terminal` from set `at`; -1 when the parser
        cannot take it."""
        after = self.next[at]
        got = after.get(terminal)
        if got is not None:
            return got
        items = self.waiting[at].get(terminal)
        nxt = self._closure(items) if items else -1
        if nxt >= 0 and not self.expected[nxt] and not self.accepting[nxt]:
            nxt = -1
        after[terminal] = nxt
        return nxt


class GrammarAutomaton:
    """Lazy byte automaton of a BNF grammar (see module docstring); its lexer DFA, parser
    chart and states count against one budget."""

    def __init__(self, bnf: BNF, deadline: Deadline | None = None):
        deadline = deadline or Deadline(None)
        nfa = NFA(deadline)
        self._starts = []
        for t, node in enumerate(bnf.terminals):
            final = nfa.new_state()
            nfa.tags[final] = t
            self._starts.append(nfa.add(node, final))
        self.budget = GrammarBudget()
        self.budget.charge(nfa_nbytes(nfa))
        self.lexer = LazyDFA(nfa, self.budget)
        self.lexer.untrack_ir(*bnf.terminals)
        self.parser = EarleyParser(bnf, len(bnf.terminals), self.budget)
        self.ignore = frozenset(bnf.ignore)
        self._lex_start: dict[tuple[int, ...], int] = {}  # by the terminals a set expects
        self._expand: dict[tuple[int, int], tuple] = {}
        # by lexer state; the C rows keep their own inverse, a uint8[256] as bytes (`dfa_rows.c`)
        self._groups: dict[int, tuple[tuple[int, ...], np.ndarray | bytes, bool]] = {}
        self.states = StateRows(self.budget, "parser positions")
        self.sets = self.states.sets
        self._ints: list[int] = []  # the C rows' int object of each state number, shared
        # what the C rows (`dfa_rows.cfg_row`) read of the parser states, in `LazyDFA._parts`'
        # layout (no target sets: None)
        self._parts = (None, self.states._ids, self.sets, self.states._rows, self.states,
                       self.budget, self._ints)  # fmt: skip
        self.lock = threading.RLock()
        self.initial = self._intern(self._fresh(self.parser.root))
        if self.initial < 0:
            raise EmptyLanguage("the grammar matches no text")

    def lex_start(self, node: int) -> int:
        """The lexer state that starts a lexeme after Earley set `node` (its number)."""
        expected = self.parser.expected[node]
        got = self._lex_start.get(expected)
        if got is None:
            terminals = self.ignore.union(expected)
            got = self._lex_start[expected] = self.lexer.intern(
                [self._starts[t] for t in terminals]
            )
        return got

    def _fresh(self, node: int) -> tuple:
        lex = self.lex_start(node)
        if lex < 0 and not self.parser.accepting[node]:
            return ()
        return ((node, lex, True),)

    def _intern(self, elems: tuple) -> int:
        """The number of the parser state of `elems` (distinct elements, sorted); it reads any
        text where one element's lexer state does (a lexeme that any text continues keeps its
        element alive)."""
        if not elems:
            return -1
        flags = self.lexer.states.any_text
        any_text = any(0 <= lex < flags.shape[0] and flags[lex] for _node, lex, _fresh in elems)
        return self.states.intern(elems, bool(any_text))

    def _successors(self, node: int, lex: int) -> tuple:
        """Elements (sorted) after the lexer reached `lex` (live) from `node`'s lexeme start."""
        key = (node, lex)
        got = self._expand.get(key)
        if got is None:
            out = {(node, lex, False)}
            for t in self.lexer.tags(lex):
                if t in self.ignore:
                    out.update(self._fresh(node))
                if t in self.parser.expected[node]:
                    nxt = self.parser.scan(node, t)
                    if nxt >= 0:
                        out.update(self._fresh(nxt))
            got = tuple(sorted(out))
            self.budget.charge(sys.getsizeof(got) + len(out) * _ITEM_BYTES + DICT_ENTRY_BYTES)
            self._expand[untracked(key)] = untracked(got)
        return got

    def _lex_groups(self, lex: int) -> tuple[tuple[int, ...], np.ndarray, bool]:
        """The live states of lexer row `lex`, per byte the index of its target among them
        (-1: dead), and whether none of them ends a terminal; computed once per lexer state,
        which many parser states share."""
        got = self._groups.get(lex)
        if got is None:
            live, inverse = self.lexer.byte_groups(lex)
            inside = not any(self.lexer.tags(v) for v in live)
            got = self._groups[lex] = (live, inverse, inside)
            self.budget.charge(inverse.size * 4 + len(live) * 8 + DICT_ENTRY_BYTES)
        return got

    def _compute_row(self, state: int, row: np.ndarray) -> None:
        native = self.lexer.native
        if native is not None:  # the same steps in C (`dfa_rows.cfg_row`)
            native.cfg_row(self, state, row)
            return
        # Each element's lexer row names, per byte, a code into `succ_sets` (its live target's
        # index plus the element's offset; -1: dead); the bytes whose columns of codes are
        # equal go to one interned state, the union of the sets they name.
        codes, succ_sets = [], []
        for node, lex, _ in self.sets[state]:
            if lex < 0:
                continue
            live, inverse, inside = self._lex_groups(lex)
            if not live:
                continue
            offset = len(succ_sets)
            if inside:  # no target ends a terminal: the same Earley set goes on reading
                succ_sets.extend(((node, v, False),) for v in live)
            else:
                succ_sets.extend(self._successors(node, v) for v in live)
            codes.append(np.where(inverse >= 0, inverse + offset, -1) if offset else inverse)
        if not codes:
            return  # all dead, as the row starts
        if len(codes) == 1:  # one element (the common case): a state per live lexer target
            ids = [self._intern(succ) for succ in succ_sets] + [-1]
            np.asarray(ids, dtype=np.int32).take(codes[0], out=row)  # -1 reads the last
            return
        # A group id per byte, equal where the columns are (renumbered densely, in increasing
        # order of key, after each element, so the mixed-radix key stays small), then one
        # state per group (in increasing order of column), read from one byte of it.
        group = codes[0]
        for more in codes[1:]:
            key = (group + 1) * (len(succ_sets) + 1) + (more + 1)  # all >= 0
            live, group = byte_groups(key.astype(np.int32))
        some_byte = np.empty(len(live), dtype=np.intp)
        some_byte[group] = np.arange(256)
        ids = [
            self._intern(tuple(sorted(set().union(*(succ_sets[c] for c in column if c >= 0)))))
            for column in np.stack(codes).take(some_byte, axis=1).T.tolist()
        ]
        np.asarray(ids, dtype=np.int32).take(group, out=row)

    def row(self, state: int) -> np.ndarray:
        return self.states.row(state, self._compute_row)

    def row_pointers(self) -> np.ndarray:
        return self.states.pointers

    def any_text(self, num_states: int) -> np.ndarray:
        return self.states.reserve_any_text(num_states)

    @property
    def native_rows(self) -> GrammarAutomaton | None:
        return self if self.lexer.native is not None else None

    def containers(self) -> list:
        return [self._expand, self._groups, self._lex_start, self._ints, *self.states.containers(),
                *self.parser.containers(), *self.lexer.containers()]  # fmt: skip

    def is_accepting(self, state: int) -> bool:
        accepting = self.parser.accepting
        return any(fresh and accepting[node] for node, _lex, fresh in self.sets[state])
