"""The native trie walk: chosen or refused by the environment (its build once per machine:
`test_grammar_native_build`), a clear fallback to the numpy walk, and the same masks as the
per-token reference (tokens that share their bytes included)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from automaton_walk import allowed_tokens, without_lexer_pairs
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler, masks, native_build, native_rows, native_walk
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.budget import GrammarBudgetExceeded, GrammarLimits
from radixflow.grammars.cfg import GrammarAutomaton
from radixflow.grammars.json_schema import schema_to_ir
from radixflow.grammars.json_schema_resolve import canonical_schema
from radixflow.grammars.masks import WalkTable, compute_mask
from radixflow.grammars.nfa import Deadline
from radixflow.grammars.regex_parse import parse_regex
from radixflow.grammars.states import StateRows
from radixflow.grammars.tokenizer_index import _build_index


@pytest.fixture
def native():
    """Skips where masks do not walk in C."""
    if native_walk.trie_walk() is None:
        pytest.skip(
            "the native trie walk is not in use here (no C compiler, or RADIXFLOW_GRAMMAR_NATIVE=0)"
        )


@pytest.fixture(params=["C callback", "Python callback"])
def callback(request, monkeypatch, native):
    """The walk's row callback: in C (`dfa_rows`, where it is built) or the ctypes one."""
    if request.param == "C callback":
        if native_rows.dfa_rows() is None:
            pytest.skip("the C row callback needs the native lazy DFA rows, not built here")
    else:
        monkeypatch.setattr(native_walk, "dfa_rows", lambda: None)
    return request.param


@pytest.fixture
def fresh_walk(monkeypatch, tmp_path):
    """`trie_walk()` decided anew, building into an empty cache; decided anew after too."""
    native_rows.dfa_rows()  # the rows decided first, as this machine allows: not under a test's CC
    monkeypatch.setenv("RADIXFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(native_build.NATIVE_ENV, raising=False)
    native_walk.trie_walk.cache_clear()
    yield tmp_path / "grammar_native"
    native_walk.trie_walk.cache_clear()


@pytest.mark.parametrize("cc", ["false", "/nonexistent/cc"])
def test_failed_build_falls_back_to_the_numpy_walk(fresh_walk, monkeypatch, cc):
    monkeypatch.setenv("CC", cc)
    with pytest.warns(UserWarning, match="building the native grammar trie walk failed"):
        assert native_walk.trie_walk() is None
    assert native_walk.describe() == "numpy trie walk"
    assert not fresh_walk.exists() or not list(fresh_walk.iterdir())  # no half-built file
    index = _build_index([None, b"a", b"ab", b"b"], (0,))
    automaton = RegexAutomaton(parse_regex("ab?"))
    words = compute_mask(index, WalkTable(automaton), automaton.initial)
    assert np.unpackbits(words.view(np.uint8), bitorder="little")[:4].tolist() == [0, 1, 1, 0]


def test_environment_chooses_the_numpy_walk(fresh_walk, monkeypatch):
    monkeypatch.setenv(native_build.NATIVE_ENV, "0")
    assert native_walk.trie_walk() is None
    assert native_walk.describe() == "numpy trie walk"
    assert not fresh_walk.exists()


def test_tokens_with_the_same_bytes_and_rows_filled_during_the_walk(callback):
    """Vocabularies where several tokens spell the same bytes (byte-fallback pieces beside
    their characters), walked from fresh tables so rows are filled as the walk reaches them:
    the native walk, the numpy walk and the per-token reference allow the same tokens."""
    rng = np.random.default_rng(7)
    alphabet = b'ab{}":,0123456789 '
    tokens = {bytes([b]) for b in alphabet}
    while len(tokens) < 400:
        tokens.add(bytes(rng.choice(list(alphabet), size=int(rng.integers(2, 9)))))
    vocab = [None, *sorted(tokens)]
    vocab += [vocab[int(i)] for i in rng.integers(1, len(vocab), size=60)]  # same bytes again
    index = _build_index(vocab, (0,))
    assert index.same_bytes_token.size >= 50
    for pattern in (r'\{"a":[0-9]{1,4},"b":"[ab ]{0,12}"\}', r"(ab|ba)*[0-9]?", r"[^:]{2,30}"):
        automaton = RegexAutomaton(parse_regex(pattern))
        states, frontier = {automaton.initial}, [automaton.initial]
        while frontier and len(states) < 60:  # breadth-first over the reachable states
            row = automaton.row(frontier.pop(0))
            for s in set(row.tolist()) - {-1} - states:
                states.add(s)
                frontier.append(s)
        for state in sorted(states):
            native = masks.compute_mask(index, WalkTable(automaton), state)
            numpy = masks.numpy_mask(index, WalkTable(automaton), state)
            want = allowed_tokens(index, automaton, state)
            got = np.unpackbits(native.view(np.uint8), bitorder="little").astype(bool)
            assert (got == want).all(), (pattern, state)
            assert (native == numpy).all(), (pattern, state)


def _reachable(automaton, limit: int) -> list[int]:
    """Up to `limit` states reachable from the start, breadth-first."""
    states, frontier = {automaton.initial}, [automaton.initial]
    while frontier and len(states) < limit:
        row = automaton.row(frontier.pop(0))
        for s in set(row.tolist()) - {-1} - states:
            states.add(s)
            frontier.append(s)
    return sorted(states)


def _walk_and_reference(index, automaton, table: WalkTable, state: int):
    """The C walk's tokens at `state` (bool per mask bit) with its steps, and the per-token
    reference's, EOS left out (the walk leaves it to `compute_mask`)."""
    words, steps = native_walk.native_mask(
        native_walk.trie_walk(), index, automaton, table.native_text, state
    )
    want = allowed_tokens(index, automaton, state)
    want[list(index.eos_ids)] = False
    return np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool), steps, want


@pytest.mark.parametrize("kept", [True, False])
def test_text_subtrees_are_taken_whole_and_match_the_reference(callback, kept, monkeypatch):
    """Free JSON string content and object names beside declared ones: the C walk takes the
    text under a state that reads text whole (its tokens or-ed in, or set one by one) and
    walks only the nodes that are not text (quotes, escapes, control bytes, broken UTF-8),
    from the state each UTF-8 phase leads to. Same masks as the numpy walk and the per-token
    reference, from fresh tables and again from the states the first walks learnt (or, with
    no room kept for them, worked out again each time), in far fewer steps than the trie has
    nodes."""
    if not kept:
        monkeypatch.setattr(native_walk.TextStates, "reserve", lambda self, *args: None)
    rng = np.random.default_rng(11)
    pieces = [b"a", b"b", b"ab", b"x", b" ", b'"', b"\\", b"\n", b":", b"{", b"\xc3\xa9",
              "€".encode(), b"\xc3", b"\xe2\x82", b"\xa9", b"\xff", b"\x01", b"n"]  # fmt: skip
    tokens = set(pieces)
    while len(tokens) < 600:
        tokens.add(b"".join(pieces[int(i)] for i in rng.integers(0, len(pieces), size=4))[:8])
    index = _build_index([None, *sorted(tokens)], (0,))
    patterns = (
        r'"([^"\\\x00-\x1f]|\\n)*"',  # free string content
        r'\{"(ab(x|n)|ba)":1|\{"[^"\\\x00-\x1f]*":2',  # names beside declared ones
        r'[^"\\\x00-\x1f]{0,6}"',  # counted: reads text but never back to itself
    )
    shortcut = 0
    for pattern in patterns:
        automaton = RegexAutomaton(parse_regex(pattern))
        table = WalkTable(automaton)
        for again in (False, True):
            for state in _reachable(automaton, 40):
                got, steps, want = _walk_and_reference(index, automaton, table, state)
                assert (got == want).all(), (pattern, state, again)
                numpy = masks.numpy_mask(index, WalkTable(automaton), state)
                assert (compute_mask(index, table, state) == numpy).all(), (pattern, state)
                shortcut += steps * 4 < index.num_nodes
    assert shortcut >= 10


def _open_object() -> RegexAutomaton:
    """An object with three declared names and any others beside them (JSON string names)."""
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in ("ab", "abx", "ba")}}
    ir, _rules = schema_to_ir(canonical_schema(schema), None, Deadline(None))
    return RegexAutomaton(ir)


def test_names_beside_declared_ones_take_text_tokens_whole(callback):
    """At an object's name where undeclared names are allowed too, every text token is alive
    whatever declared name its letters start: the walk takes them whole and steps only down to
    the tokens that leave the name (a quote, an escape), making no row for the prefixes of
    declared names that no such token passes through."""
    text = [b"a", b"ab", b"abx", b"abxy", b"b", b"ba", b"bab", b"q", b"\xc3\xa9", b"a\xc3\xa9"]
    index = _build_index([None, *text, b'"', b'":', b'q"', b"q\\n", b"\\"], (0,))
    automaton = _open_object()
    name = automaton.initial
    for b in b'{"':
        name = int(automaton.row(name)[b])
    flags = automaton.any_text(automaton.row_pointers().shape[0])
    assert flags[name] == 1  # any name may follow the quote
    words, _steps = native_walk.native_mask(
        native_walk.trie_walk(), index, automaton, WalkTable(automaton).native_text, name
    )
    got = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    first = automaton.row(name)  # made by the walk: the quote and the escape start there
    made = automaton.row_pointers()
    assert made[first[ord("a")]] == 0 and made[first[ord("b")]] == 0
    assert made[first[ord("q")]] != 0  # stepped through: 'q"' and 'q\\n' leave the name
    want = allowed_tokens(index, automaton, name)  # the reference reads every row it meets
    want[list(index.eos_ids)] = False
    after_a = int(automaton.row(first[ord("a")])[ord('"')])
    assert automaton.any_text(after_a + 1)[after_a] == 0  # the name "a" written: no more text
    assert (got == want).all()
    assert got[1 : len(text) + 1].all()  # every text token
    assert got[len(text) + 1 : len(text) + 6].tolist() == [True, True, True, True, True]


def test_names_beside_declared_ones_mask_as_the_reference(callback):
    """Random tokens (text, quotes, escapes, control bytes, broken UTF-8) at every state of an
    object with names beside its declared ones: the same tokens as the per-token reference."""
    rng = np.random.default_rng(5)
    pieces = [b"a", b"b", b"ab", b"x", b"ba", b" ", b'"', b"\\", b"\n", b":", b"1", b"\xc3\xa9",
              "\u20ac".encode(), b"\xc3", b"\xa9", b"\x01", b"}", b","]  # fmt: skip
    tokens = set(pieces)
    while len(tokens) < 500:
        tokens.add(b"".join(pieces[int(i)] for i in rng.integers(0, len(pieces), size=4))[:8])
    index = _build_index([None, *sorted(tokens)], (0,))
    automaton = _open_object()
    table = WalkTable(automaton)
    for again in (False, True):
        for state in _reachable(automaton, 60):
            got, _steps, want = _walk_and_reference(index, automaton, table, state)
            assert (got == want).all(), (state, again)


def test_a_walk_reads_the_any_text_flags_it_was_handed_while_they_grow(callback):
    """States the walk makes past the flags' room are walked as any other (their flags are
    read from the next walk on), and the flags a walk was handed stay readable while the
    automaton grows a new array."""
    index = _build_index([None, b'"', b"a", b"ab", b"abc", b"b", b"ba", b'a"', b"x"], (0,))
    automaton = _open_object()
    states = automaton.dfa.states
    states.any_text = np.zeros(1, dtype=np.uint8)  # no room: every new flag grows the array
    table = WalkTable(automaton)
    for state in _reachable(automaton, 40):
        got, _steps, want = _walk_and_reference(index, automaton, table, state)
        assert (got == want).all(), state
    assert states.any_text.shape[0] > 1 and states.any_text.any()


def test_an_automaton_that_does_not_publish_its_rows_fails_instead_of_hanging(callback):
    """A row the callback computes but `row_pointers()` never shows stops the walk with an
    error (the walk would otherwise ask for it forever)."""

    class Hidden:
        native_rows = None  # its rows come from `row`, which the walk calls back

        def __init__(self, automaton):
            self.row, self.is_accepting = automaton.row, automaton.is_accepting

        def row_pointers(self):
            return np.zeros(4, dtype=np.int64)

        def any_text(self, num_states):
            return None

    index = _build_index([None, b"a", b"ab", b"b"], (0,))
    automaton = RegexAutomaton(parse_regex("ab?"))
    with pytest.raises(RuntimeError, match="did not make"):
        native_walk.native_mask(
            native_walk.trie_walk(), index, Hidden(automaton), native_walk.TextStates(), 0
        )


def test_an_error_in_a_row_callback_fails_that_mask_only(callback):
    """A budget passed while the walk computes a row reaches the caller; the next walk, on
    another automaton, is not touched by it."""
    index = _build_index([None, b"a", b"ab", b"b", b"ba", b"abab"], (0,))
    small = RegexAutomaton(parse_regex("(ab|ba){0,20}"))
    small.budget.bind(GrammarLimits(max_states=2))
    with pytest.raises(GrammarBudgetExceeded, match="max_states"):
        compute_mask(index, WalkTable(small), small.initial)
    fine = RegexAutomaton(parse_regex("(ab|ba){0,20}"))
    words = compute_mask(index, WalkTable(fine), fine.initial)
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:6]
    assert allowed.tolist() == [1, 1, 1, 1, 1, 1]  # EOS too: the empty text matches


def test_an_index_dropped_drops_its_native_view(native):
    index = _build_index([None, b"x", b"xy"], (0,))
    automaton = RegexAutomaton(parse_regex("xy"))
    compute_mask(index, WalkTable(automaton), automaton.initial)
    key = id(index)
    assert key in native_walk._TRIES
    del index
    assert key not in native_walk._TRIES


def test_a_compiler_makes_the_walk_before_its_first_mask(native):
    """A new GrammarCompiler has the walk's trie of its tokenizer ready: the first request's
    mask does not wait for it."""
    compiler = GrammarCompiler(tiny_tokenizer())
    assert id(compiler.index) in native_walk._TRIES


def test_threads_walking_grammars_of_one_index_at_once(callback):
    """Threads filling masks of several grammars over one tokenizer index at once (each
    grammar's rows built as they go; the walk's per-thread state in C) get the masks one
    thread gets alone."""
    rng = np.random.default_rng(3)
    alphabet = b'ab{}":,0123456789 '
    tokens = {bytes([b]) for b in alphabet}
    while len(tokens) < 3000:
        tokens.add(bytes(rng.choice(list(alphabet), size=int(rng.integers(2, 12)))))
    index = _build_index([None, *sorted(tokens)], (0,))
    patterns = [r'\{"a":[0-9]{1,6}\}', r"[ab ]{0,40}", r'"[0-9:]*"', r"(ab|b{2,5}|[0-9])*,"]

    def masks_of(pattern: str) -> list[np.ndarray]:
        automaton = RegexAutomaton(parse_regex(pattern))
        table, out, frontier, seen = WalkTable(automaton), [], [automaton.initial], set()
        while frontier and len(out) < 40:
            state = frontier.pop(0)
            if state in seen:
                continue
            seen.add(state)
            out.append(compute_mask(index, table, state))
            frontier.extend(s for s in automaton.row(state).tolist() if s >= 0)
        return out

    alone = [masks_of(p) for p in patterns]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(masks_of, patterns * 3))
    for i, got in enumerate(together):
        want = alone[i % len(patterns)]
        assert len(got) == len(want) and all((a == b).all() for a, b in zip(got, want, strict=True))


def test_rows_the_c_walk_makes_are_the_rows_row_makes(native, monkeypatch):
    """Where C computes a regex automaton's rows, the C walk makes a missing row itself (no
    Python frame per row): the same states, rows, masks and bytes charged as when it asks the
    automaton's `row`, and the rows read back through `row` afterwards."""
    if native_rows.dfa_rows() is None:
        pytest.skip("the walk makes rows in C only with the native lazy DFA rows")
    tok = tiny_tokenizer()
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }

    def walked(c_rows: bool):
        with monkeypatch.context() as m:
            if not c_rows:
                m.setattr(RegexAutomaton, "native_rows", property(lambda self: None))
            grammar = GrammarCompiler(tok).compile_json_schema(schema)
            assert (grammar.automaton.native_rows is not None) == c_rows
            matcher, got = grammar.matcher(), []
            for b in b'{"id":12,"tags":["a","bc"]}':
                got.append(matcher.next_token_mask().copy())
                assert matcher.accept(grammar.index.token_bytes.index(bytes([b])))
        return grammar.automaton, got

    (in_c, masks_c), (asked, masks_asked) = walked(True), walked(False)
    assert [m.tolist() for m in masks_c] == [m.tolist() for m in masks_asked]
    assert in_c.dfa.sets == asked.dfa.sets and len(in_c.dfa.sets) > 20
    assert in_c.budget.nbytes == asked.budget.nbytes
    # rows the C walk made are kept as (block, index) until `row` first reads them
    assert sum(type(r) is tuple for r in in_c.dfa.states._rows) > 10
    assert not any(type(r) is tuple for r in asked.dfa.states._rows)
    made = [s for s in range(len(in_c.dfa.sets)) if in_c.row_pointers()[s]]
    assert made == [s for s in range(len(asked.dfa.sets)) if asked.row_pointers()[s]]
    assert all(np.array_equal(in_c.row(s), asked.row(s)) for s in made)


@pytest.mark.parametrize("others", [False, True], ids=["declared-names", "any-names"])
def test_parser_rows_the_c_walk_makes_are_the_rows_row_makes(native, monkeypatch, others):
    """A recursive schema's grammar automaton: the C walk makes its missing parser rows itself
    (`dfa_rows.cfg_row`'s steps, no Python frame per row), with the same parser states, rows,
    masks, bytes charged and states that read any text (an object's names beside its declared
    ones) as when it asks the automaton's `row` (both without the lexer's pairs)."""
    if native_rows.dfa_rows() is None:
        pytest.skip("the walk makes rows in C only with the native lazy DFA rows")
    without_lexer_pairs(monkeypatch)
    tok = tiny_tokenizer()
    linked_list = {
        "$defs": {
            "cell": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "next": {"anyOf": [{"$ref": "#/$defs/cell"}, {"type": "null"}]},
                },
                "required": ["value"],
                "additionalProperties": others,
            }
        },
        "$ref": "#/$defs/cell",
    }
    text = b'{"value":1,"next":{"value":-22,"next":{"value":3}}}'

    def walked(c_rows: bool):
        with monkeypatch.context() as m:
            if not c_rows:
                m.setattr(GrammarAutomaton, "native_rows", property(lambda self: None))
            grammar = GrammarCompiler(tok).compile_json_schema(linked_list)
            assert isinstance(grammar.automaton, GrammarAutomaton)
            assert (grammar.automaton.native_rows is not None) == c_rows
            matcher, got, by_walks = grammar.matcher(), [], 0
            for b in text:
                before = np.count_nonzero(grammar.automaton.row_pointers())
                got.append(matcher.next_token_mask().copy())
                by_walks += np.count_nonzero(grammar.automaton.row_pointers()) - before
                assert matcher.accept(grammar.index.token_bytes.index(bytes([b])))
        return grammar.automaton, got, by_walks

    (in_c, masks_c, by_walks), (asked, masks_asked, _) = walked(True), walked(False)
    assert [m.tolist() for m in masks_c] == [m.tolist() for m in masks_asked]
    assert in_c.sets == asked.sets and len(in_c.sets) > 20
    assert in_c.budget.nbytes == asked.budget.nbytes
    flags = in_c.any_text(len(in_c.sets))[: len(in_c.sets)]
    assert flags.tolist() == asked.any_text(len(asked.sets))[: len(asked.sets)].tolist()
    assert flags.any() == others  # the names after each brace
    assert by_walks > 10
    made = [s for s in range(len(in_c.sets)) if in_c.row_pointers()[s]]
    assert made == [s for s in range(len(asked.sets)) if asked.row_pointers()[s]]
    assert all(np.array_equal(in_c.row(s), asked.row(s)) for s in made)


@pytest.mark.parametrize("c_rows", [True, False], ids=["c-rows", "python-rows"])
def test_rows_are_right_in_blocks_left_as_allocated(native, monkeypatch, c_rows):
    """Row blocks are not cleared when allocated (pages of rows never taken stay untouched):
    each row is set to -1s as it is taken, by C or by Python, so memory a freed grammar left
    behind never shows through as transitions."""
    if c_rows and native_rows.dfa_rows() is None:
        pytest.skip("the walk makes rows in C only with the native lazy DFA rows")
    tok = tiny_tokenizer()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}}
    text = b'{"name":"ab"}'

    def walked(dirty: bool):
        with monkeypatch.context() as m:
            if not c_rows:
                m.setattr(RegexAutomaton, "native_rows", property(lambda self: None))
            if dirty:
                new_block = StateRows._new_block

                def dirty_block(self):
                    new_block(self)
                    self._block.fill(3)  # a live-looking state id everywhere

                m.setattr(StateRows, "_new_block", dirty_block)
            grammar = GrammarCompiler(tok).compile_json_schema(schema)
            matcher, got = grammar.matcher(), []
            for b in text:
                got.append(matcher.next_token_mask().copy())
                assert matcher.accept(grammar.index.token_bytes.index(bytes([b])))
            assert matcher.is_terminated() or matcher.accept(tok.eos_token_id)
        return got

    clean, dirty = walked(False), walked(True)
    assert [m.tolist() for m in dirty] == [m.tolist() for m in clean]
