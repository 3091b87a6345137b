"""The lazy DFA's rows in C: refused with a clear fallback (its build once per machine:
`test_grammar_native_build`), and the same automaton as the Python code (its states, their
numbers, every row) on regexes and JSON schemas; what a callback raises inside it (a budget,
the clock) comes through."""

import gc
import random
import weakref
from pathlib import Path

import numpy as np
import pytest
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler, native_build, native_rows, nfa
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.budget import GrammarBudgetExceeded, GrammarLimits
from radixflow.grammars.cfg import GrammarAutomaton, bnf_from_ebnf
from radixflow.grammars.json_schema import schema_to_ir
from radixflow.grammars.json_schema_memo import shared_memo
from radixflow.grammars.json_schema_resolve import canonical_schema
from radixflow.grammars.lark_import import lark_to_bnf
from radixflow.grammars.nfa import Deadline
from radixflow.grammars.regex_ir import Alt, Chars, Ref, Repeat, Seq
from radixflow.grammars.regex_parse import parse_regex


@pytest.fixture
def native():
    """Skips where rows are not computed in C."""
    if native_rows.dfa_rows() is None:
        pytest.skip(
            "the native lazy DFA rows are not in use here (no C compiler or Python headers, "
            "or RADIXFLOW_GRAMMAR_NATIVE=0)"
        )


@pytest.fixture
def fresh_rows(monkeypatch, tmp_path):
    """`dfa_rows()` decided anew, building into an empty cache; decided anew after too."""
    monkeypatch.setenv("RADIXFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(native_build.NATIVE_ENV, raising=False)
    native_rows.dfa_rows.cache_clear()
    yield tmp_path / "grammar_native"
    native_rows.dfa_rows.cache_clear()


def explored(automaton, limit: int = 400) -> list[np.ndarray]:
    """Rows of the states reachable from the initial one, breadth-first, at most `limit`."""
    rows, frontier, seen = [], [automaton.initial], {automaton.initial}
    while frontier and len(rows) < limit:
        row = automaton.row(frontier.pop(0))
        rows.append(row)
        for s in dict.fromkeys(row.tolist()):
            if s >= 0 and s not in seen:
                seen.add(s)
                frontier.append(s)
    return rows


def both(make, monkeypatch):
    """`make()` with rows in C, then with the Python code."""
    with_c = make()
    assert with_c.dfa._native is not None
    with monkeypatch.context() as m:
        m.setattr(nfa, "dfa_rows", lambda: None)
        twin = make()
    assert twin.dfa._native is None
    return with_c, twin


def schema_automaton(schema, key_order: str = "declared"):
    ir, defs = schema_to_ir(canonical_schema(schema), None, Deadline(None), key_order=key_order)
    assert not defs
    return RegexAutomaton(ir)


PATTERNS = [
    r"[a-z]{0,300}x",  # a counter: lifted states, pruned
    r"(a?b?){0,50}c",  # an ambiguous counted body
    r"(ab|a|b{2,7}|[0-9]+)*;",
    r"[^\"\\]{1,40}|\\u[0-9a-f]{4}",  # multi-byte UTF-8 tails
    r"(alpha|beta|gamma|delta|epsilon|alphabet|betamax)+",  # literal runs sharing prefixes
    r"[\u0400-\u04ff\u4e00-\u4eff]{2,9}[^a-z]?",
]
SCHEMAS = [
    {
        "type": "object",
        "properties": {"metadata": {"type": "string"}, "meta": {"type": "integer"}},
        "required": ["meta"],
    },  # "any other name" automata beside declared names
    {"type": "array", "items": {"type": "string", "maxLength": 12, "pattern": "^[a-c]+$"}},
    {"enum": ["red", "green", "greenish", 17, None]},
    {"type": "integer", "minimum": -125, "maximum": 99999},
]


@pytest.mark.parametrize("make", [*PATTERNS, *range(len(SCHEMAS))])
def test_the_same_automaton_as_the_python_code(native, monkeypatch, make):
    build = (
        (lambda: RegexAutomaton(parse_regex(make)))
        if isinstance(make, str)
        else (lambda: schema_automaton(SCHEMAS[make]))
    )
    assert_same(*both(build, monkeypatch))


def test_members_in_any_order_build_the_same_automaton_as_the_python_code(native, monkeypatch):
    schema = {**SCHEMAS[0], "maxProperties": 2}  # a lazily made Dfa table, undeclared names
    assert_same(*both(lambda: schema_automaton(schema, "any"), monkeypatch))


def made(lists: list) -> list:
    """An NFA's moves or edges, each not made yet (its key: node, arg, next) told by its node's
    kind (the two automata compared were built from IR of their own)."""
    return [(type(x[0]).__name__, *x[1:]) if type(x) is tuple else x for x in lists]


def assert_same(with_c, twin) -> None:
    rows_c, rows_twin = explored(with_c), explored(twin)
    assert len(rows_c) == len(rows_twin) > 5
    for a, b in zip(rows_c, rows_twin, strict=True):
        assert np.array_equal(a, b)
    assert with_c.dfa.sets == twin.dfa.sets  # the same NFA states, made as far, numbered alike
    nfa_c, nfa_twin = with_c.dfa.nfa, twin.dfa.nfa
    assert made(nfa_c._eps) == made(nfa_twin._eps)
    assert made(nfa_c._edges) == made(nfa_twin._edges)
    assert nfa_c.nbytes == nfa_twin.nbytes and with_c.budget.nbytes == twin.budget.nbytes


def test_state_lists_are_left_out_of_the_cyclic_collector_and_still_freed(native):
    """The lists of states the C rows fill hold no reference cycles, so the cyclic collector
    does not walk them (in a cache of walked grammars each full collection would walk
    hundreds of thousands of items); an automaton no longer used is freed all the same."""
    automaton = schema_automaton(SCHEMAS[0])
    explored(automaton, limit=20)
    dfa = automaton.dfa
    lists = (dfa.nfa._eps, dfa.nfa._edges, dfa.nfa._ints, dfa.sets, dfa.states._rows, dfa._ints)
    assert all(len(lst) > 5 and not gc.is_tracked(lst) for lst in lists)
    # A full collection leaves the dicts keyed by tuples of ints; the keys C adds later keep
    # them so (a key Python made would track its dict again, to be walked by the next ones).
    gc.collect()
    dicts = (dfa.nfa._ids, dfa.nfa._runs, dfa.nfa._shared, dfa._by_targets, dfa.states._ids)
    sizes = [len(d) for d in dicts]
    explored(automaton)
    assert [len(d) for d in dicts] > sizes and not any(gc.is_tracked(d) for d in dicts)
    gone = weakref.ref(dfa.nfa)
    del automaton, dfa, lists, dicts
    gc.collect()
    assert gone() is None


def _ir_nodes(node) -> list:
    """The IR nodes reachable from `node` (items and repeated items)."""
    out, stack, seen = [], [node], set()
    while stack:
        x = stack.pop()
        if id(x) in seen or not hasattr(x, "facts"):
            continue
        seen.add(id(x))
        out.append(x)
        stack.extend(getattr(x, "items", ()))
        if hasattr(x, "item"):
            stack.append(x.item)
    return out


def test_the_ir_a_grammar_reads_is_left_out_of_the_cyclic_collector_and_still_freed(native):
    """A schema's IR, which its grammar keeps for the NFA it grows, is immutable and built
    from its leaves up (no reference cycle runs through it): C takes it, the item tuples and
    the NFA's waiting entries that name its nodes out of the cyclic collector's sight, so that
    full collections do not walk a cache of grammars' IR; an automaton no longer used frees
    its IR all the same."""
    ir, _defs = schema_to_ir(canonical_schema(SCHEMAS[0]), None, Deadline(None))
    automaton = RegexAutomaton(ir)
    explored(automaton, limit=60)
    nodes = _ir_nodes(ir)  # (counts compared below: an IR's repr repeats shared subtrees)
    counts = (
        len(nodes),
        sum(map(gc.is_tracked, nodes)),
        sum(gc.is_tracked(n.items) for n in nodes if hasattr(n, "items")),
        sum(hasattr(n, "__dict__") for n in nodes if isinstance(n, (Seq, Alt, Repeat))),
    )
    assert counts[0] > 20 and counts[1:] == (0, 0, 0)  # slotted nodes: no dict to untrack
    nfa = automaton.dfa.nfa
    waiting = [x for x in (*nfa._eps, *nfa._edges) if type(x) is tuple]  # keys, not made yet
    counts = (len(waiting), sum(map(gc.is_tracked, waiting)))
    assert counts[0] > 5 and counts[1] == 0
    gone = weakref.ref(ir)
    del automaton, ir, nodes, nfa, waiting
    gc.collect()
    assert gone() is None


RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name"],
        }
    },
    "$ref": "#/$defs/node",
}


GRAMMARS_DIR = Path(nfa.__file__).parent
CFG_SOURCES = {
    "recursive schema": RECURSIVE,
    "recursive schema, free names": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "idx": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "additionalProperties": {"type": "number"},
            }
        },
        "$ref": "#/$defs/node",
    },
    "json.lark": "json.lark",
    "arithmetic.lark": "arithmetic.lark",
}


def cfg_automaton(source) -> GrammarAutomaton:
    if isinstance(source, str):
        return GrammarAutomaton(lark_to_bnf((GRAMMARS_DIR / source).read_text()))
    ir, defs = schema_to_ir(canonical_schema(source), None, Deadline(None))
    assert defs  # recursive: rules, not one regex
    return GrammarAutomaton(bnf_from_ebnf({"start": ir, **defs}, "start"))


def cfg_both(name: str, monkeypatch) -> tuple[GrammarAutomaton, GrammarAutomaton]:
    """`cfg_automaton` of `CFG_SOURCES[name]` with rows in C, then with the Python code."""
    with_c = cfg_automaton(CFG_SOURCES[name])
    with monkeypatch.context() as m:
        m.setattr(nfa, "dfa_rows", lambda: None)
        twin = cfg_automaton(CFG_SOURCES[name])
    assert with_c.lexer.native is not None and twin.lexer.native is None
    return with_c, twin


@pytest.mark.parametrize("name", CFG_SOURCES)
def test_parser_rows_in_c_are_the_python_codes(native, monkeypatch, name):
    """A context-free grammar's parser rows (`cfg_row`: lexer targets in the same Earley set,
    terminals that end and start anew, states of several elements) have the same parser
    states, numbered alike, and the same bytes charged as the Python code's."""
    with_c, twin = cfg_both(name, monkeypatch)
    rows_c, rows_twin = explored(with_c), explored(twin)
    assert len(rows_c) == len(rows_twin) > 20
    for a, b in zip(rows_c, rows_twin, strict=True):
        assert np.array_equal(a, b)
    assert with_c.sets == twin.sets
    assert max(map(len, with_c.sets)) > 1  # states of several elements were made
    assert with_c.budget.nbytes == twin.budget.nbytes


def test_a_recursive_grammar_stays_out_of_the_cyclic_collector(native):
    """A recursive schema's rules (IR with `Ref`s, which the sub-schema memo keeps), the
    lexer's waiting entries Python made while compiling, its parser states, their rows, the
    dicts that find them and the Earley chart (its lists, dicts and item tuples) stay out of
    the collector's sight as masks walk the grammar, so that full collections do not walk a
    cache of them."""
    gc.disable()  # a full collection would untrack the dicts itself
    try:
        grammar = GrammarCompiler(tiny_tokenizer()).compile_json_schema(RECURSIVE)
        lexer = grammar.automaton.lexer.nfa  # each terminal's entry, made by Python
        waiting = [x for x in (*lexer._eps, *lexer._edges) if type(x) is tuple]
        assert len(waiting) > 5 and not any(map(gc.is_tracked, waiting))
        matcher = grammar.matcher()
        for b in b'{"name":"a","kids":[{"name":"b","kids":[]}]}':
            matcher.next_token_mask()
            assert matcher.accept(grammar.index.token_bytes.index(bytes([b])))
        automaton = grammar.automaton
        assert isinstance(automaton, GrammarAutomaton)
        states, parser = automaton.states, automaton.parser
        chart = [parser.waiting, parser.expected, parser.accepting, parser.next]
        kept = [states.sets, states._rows, states._ids, automaton._expand, parser._interned]
        assert [len(c) > 3 for c in kept + chart] == [True] * 9
        assert [gc.is_tracked(c) for c in kept + chart] == [False] * 9
        waits = [x for wait in parser.waiting for x in (wait, *wait.values())]
        assert not any(map(gc.is_tracked, waits + parser.expected + parser.next))
        gc.collect(0)  # the young collection that stops tracking tuples of ints, not lists
        rules = automaton.parser.by_lhs
        assert rules and not any(map(gc.is_tracked, rules.values()))
        _ir, defs = schema_to_ir(
            canonical_schema(RECURSIVE), None, Deadline(None), memo=shared_memo()
        )
        nodes = [n for node in defs.values() for n in _ir_nodes(node)]
        refs = [r for n in nodes for r in getattr(n, "items", ()) if isinstance(r, Ref)]
        assert refs and len(nodes) > 20  # the memo's IR, the compile's own
        assert sum(map(gc.is_tracked, nodes + refs)) == 0
    finally:
        gc.enable()


def test_byte_groups_in_c_match_numpy_unique(native, monkeypatch):
    """A row's live targets (sorted) and each byte's index among them, which the CFG's rows
    read per lexer state: the C count equals numpy's `unique` (the twin) on real rows and on
    rows with many targets, a dead byte or none."""
    with_c, twin = both(lambda: schema_automaton(SCHEMAS[0]), monkeypatch)
    for state in range(len(explored(with_c, limit=40))):
        assert twin.row(state).tolist() == with_c.row(state).tolist()
        (live_c, inverse_c), (live_py, inverse_py) = (
            with_c.dfa.byte_groups(state), twin.dfa.byte_groups(state))  # fmt: skip
        assert live_c == live_py and inverse_c.tolist() == inverse_py.tolist()
    rng = np.random.default_rng(0)
    for row in (rng.integers(-1, 9, 256), rng.integers(0, 10**6, 256), np.full(256, 7)):
        row = row.astype(np.int32)
        inverse = np.empty(256, dtype=np.int32)
        live = native_rows.dfa_rows().byte_groups(row, inverse)
        expected = sorted(set(row.tolist()) - {-1})
        assert list(live) == expected
        assert [live[i] if i >= 0 else -1 for i in inverse.tolist()] == row.tolist()


def test_the_dicts_of_state_numbers_stay_out_of_the_cyclic_collector(native):
    """The NFA's and DFA's dicts that map keys of ints to state numbers hold nothing a
    reference cycle can run through: they stay out of the collector's sight as rows grow
    them (Python would walk each of them at the next full collection, then untrack it)."""
    gc.disable()  # a full collection would untrack them itself
    try:
        automaton = schema_automaton(SCHEMAS[0])
        explored(automaton, limit=60)
        dfa = automaton.dfa
        numbered = [dfa._by_targets, dfa.states._ids, dfa.nfa._ids, dfa.nfa._runs, dfa.nfa._shared]
        assert [len(d) > 3 for d in numbered] == [True] * 5
        assert [gc.is_tracked(d) for d in numbered] == [False] * 5
    finally:
        gc.enable()


def test_a_budget_raised_inside_comes_through(native, monkeypatch):
    """`max_states` is checked by Python code the C row calls back into: its error reaches
    the caller, and the automaton goes on answering within the rows already made."""
    with_c, twin = both(lambda: RegexAutomaton(parse_regex(r"[a-z]{0,300}x")), monkeypatch)
    for automaton in (with_c, twin):
        automaton.budget.bind(GrammarLimits(max_states=40))
        with pytest.raises(GrammarBudgetExceeded, match="max_states"):
            explored(automaton)
        assert len(automaton.dfa.sets) <= 40
    assert with_c.dfa.sets == twin.dfa.sets
    assert np.array_equal(with_c.row(with_c.initial), twin.row(twin.initial))


def test_a_parser_state_limit_raised_inside_comes_through(native, monkeypatch):
    """`max_states` reached while C makes a grammar's parser row (`cfg_row`) raises from the
    Python code it calls back into, as the Python code raises it, with the same states made."""
    with_c, twin = cfg_both("recursive schema, free names", monkeypatch)
    for automaton in (with_c, twin):
        automaton.budget.bind(GrammarLimits(max_states=30))
        with pytest.raises(GrammarBudgetExceeded, match=r"30 automaton states \(max_states\)"):
            explored(automaton)
        assert 20 < len(automaton.sets) <= 30
    assert with_c.sets == twin.sets


def test_the_bytes_a_row_builds_count_against_the_budget(native, monkeypatch):
    """C charges a call's bytes when it ends (and at its clock checks): a grammar that grows
    past `max_mb` fails as the Python code does, with what was built counted."""
    with_c, twin = both(lambda: schema_automaton(SCHEMAS[0]), monkeypatch)
    caps = []
    for automaton in (with_c, twin):
        automaton.budget.bind(GrammarLimits(max_mb=0.05))
        caps.append(automaton.budget.nbytes + 0.05 * 2**20)
        with pytest.raises(GrammarBudgetExceeded, match="max_mb"):
            explored(automaton, limit=10_000)
    assert with_c.budget.nbytes > caps[0]  # C built the failing call's states: counted
    assert twin.budget.nbytes <= caps[1]  # the Python code charges before it builds


@pytest.mark.parametrize("cc", ["false", "/nonexistent/cc"])
def test_failed_build_falls_back_to_the_python_code(fresh_rows, monkeypatch, cc):
    monkeypatch.setenv("CC", cc)
    with pytest.warns(UserWarning, match="building the native lazy DFA rows failed"):
        assert native_rows.dfa_rows() is None
    assert native_rows.describe() == "Python rows"
    assert not fresh_rows.exists() or not list(fresh_rows.iterdir())  # no half-built file
    automaton = RegexAutomaton(parse_regex("ab?"))
    assert automaton.dfa._native is None
    assert automaton.is_accepting(int(automaton.row(automaton.initial)[ord("a")]))


def test_environment_chooses_the_python_code(fresh_rows, monkeypatch):
    monkeypatch.setenv(native_build.NATIVE_ENV, "0")
    assert native_rows.dfa_rows() is None
    assert native_rows.describe() == "Python rows"
    assert not fresh_rows.exists()


class _UnknownLeaf:
    """A leaf that does not know its facts and holds no Ref, as a `Dfa` of unknown liveness."""

    facts = None


def _random_ir(rng: random.Random, size: int) -> list:
    """IR nodes built bottom-up, sharing earlier ones: Refs, leaves with and without facts."""
    nodes: list = [Ref("a"), Ref("b"), Chars(((97, 97),)), Chars(((98, 122),)), _UnknownLeaf()]
    for _ in range(size):
        kids = tuple(rng.choice(nodes[-12:] if rng.random() < 0.7 else nodes) for _ in range(3))
        kind = rng.randrange(3)
        node = (
            Seq(kids[: rng.randrange(4)])
            if kind == 0
            else Alt(kids[: 1 + rng.randrange(3)])
            if kind == 1
            else Repeat(kids[0], rng.randrange(2), rng.choice([None, 3]))
        )
        nodes.append(node)
    return nodes


@pytest.mark.parametrize("seed", range(8))
def test_the_ref_fold_in_c_is_the_python_codes(native, seed):
    """`holds_ref` (C) answers as `cfg._has_ref`'s Python fold for every node of a random IR
    DAG (shared nodes, Refs, leaves without facts), however the memo was filled before, and
    leaves the same answer in the memo for each node without facts."""
    from radixflow.grammars.cfg import _has_ref

    rng = random.Random(seed)
    nodes = _random_ir(rng, 300)
    rows = nfa.configured_rows()
    order = nodes[:]
    rng.shuffle(order)
    memo_c: dict = {}
    memo_py: dict = {}
    for node in order:
        assert _has_ref(node, memo_c, rows) == _has_ref(node, memo_py, None)
    assert any(_has_ref(n, memo_c, rows) for n in nodes)
    assert not all(_has_ref(n, memo_c, rows) for n in nodes[2:])
    for node in nodes:
        if getattr(node, "facts", None) is None:
            assert memo_c[id(node)] == memo_py[id(node)]


def test_the_ref_fold_in_c_takes_deep_ir_and_refuses_a_bad_memo(native):
    """A Ref under 50,000 nested nodes is found without recursion; a memo that is not a dict
    is a TypeError."""
    node: object = Ref("deep")
    for i in range(50_000):
        node = Seq((Chars(((97, 97),)), node)) if i % 2 else Alt((node, Chars(((98, 98),))))
    rows = nfa.configured_rows()
    assert rows.holds_ref(node, {}) is True
    assert rows.holds_ref(Seq((Chars(((97, 97),)),)), {}) is False  # facts known: no walk
    with pytest.raises(TypeError, match="memo: dict"):
        rows.holds_ref(node, [])


def test_the_derivable_worklist_in_c_refuses_malformed_rules(native):
    """`derivable` answers for well-formed rules and names what is wrong with the others."""
    rows = native_rows.dfa_rows()
    rules = [(-1, (3,)), (3, (0, 4)), (4, ()), (5, (5, 1))]  # terminals 0..2
    assert rows.derivable(rules, 3, True) == {-1, 3, 4}
    assert rows.derivable(rules, 3, False) == {4}
    with pytest.raises(TypeError, match="lhs, tuple of symbols"):
        rows.derivable([(3, [0])], 3, True)
    with pytest.raises(ValueError, match="out of range"):
        rows.derivable([(3, (-2,))], 3, True)
