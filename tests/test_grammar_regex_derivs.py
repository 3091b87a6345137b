"""Regex derivatives and the product automaton in C (`regex_derivs.c`): the same terms with the
same ids, the same derivative memo and the same product DFA as the Python code, on made-up
regexes and on every `pattern` of the JSONSchemaBench subsets; limits and the clock raise as
they do there (its build once per machine: `test_grammar_native_build`)."""

import json
import random
import re
from pathlib import Path

import pytest

from radixflow.grammars import regex_algebra, regex_terms
from radixflow.grammars.json_schema_strings import FORMATS
from radixflow.grammars.nfa import CompileTimeout, Deadline
from radixflow.grammars.regex_algebra import combine, exclude_words, explore
from radixflow.grammars.regex_parse import parse_regex, parse_search_regex
from radixflow.grammars.regex_terms import Terms

BENCH = Path(__file__).resolve().parents[2] / "shared/peer-data/jsonschemabench"

PAIRS = [
    (r"(ab|a)*c?[0-9]{2,4}", r"a*b*c*[0-9]+"),
    (r"[a-z]+(-[a-z]+)*", r"[a-f-]{3,}"),
    (r"(\d{3}-)?\d{4}", r"\d+(-\d+)?"),
    (r"x*", r"(xx)*"),
    (FORMATS["date-time"], r".+T[^Z+\-]+"),
    (FORMATS["email"], r"[^@]+@example\.com"),
]


@pytest.fixture
def native():
    """Skips where the C module is not in use."""
    if regex_terms.regex_derivs() is None:
        pytest.skip(
            "the native regex derivatives are not in use here (no C compiler or Python "
            "headers, or RADIXFLOW_GRAMMAR_NATIVE=0)"
        )


def product(irs, accept, dead=None):
    """The trimmed product table of `irs` and what the terms made on the way."""
    terms = Terms()
    table = explore(terms, tuple(terms.term(ir) for ir in irs), accept, dead)
    made = None if table is None else ([list(m) for m in table.moves], list(table.accepting))
    return made, list(terms.node(t) for t in range(len(terms._nodes))), dict(terms._derivs)


def with_python(monkeypatch, make, *args):
    """`make(*args)` with the Python methods."""
    with monkeypatch.context() as m:
        m.setattr(regex_terms, "regex_derivs", lambda: None)
        return make(*args)


def with_python_trie(monkeypatch, words):
    with monkeypatch.context() as m:
        m.setattr(regex_algebra, "regex_derivs", lambda: None)
        return regex_algebra._trie(words, Deadline(None))


def both_ways(monkeypatch, irs, accept, dead=None):
    with_c = product(irs, accept, dead)
    assert with_c == with_python(monkeypatch, product, irs, accept, dead)
    return with_c


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_products_are_the_python_codes(native, monkeypatch, first, second):
    a, b = parse_regex(first), parse_regex(second)
    table, _nodes, _derivs = both_ways(monkeypatch, [a, b], lambda got: got[0] and not got[1])
    both_ways(monkeypatch, [a, b], all)
    both_ways(monkeypatch, [a], lambda got: got[0])
    both_ways(monkeypatch, [a, b], lambda got: not any(got))  # words in neither: the rest
    if table is not None:  # a shortest word of the difference checks out
        word = shortest_word(*table)
        assert re.fullmatch(first, word) and not re.fullmatch(second, word)


def shortest_word(moves, accepting) -> str:
    """A shortest word a trimmed table accepts (breadth-first, each class's lowest code point)."""
    words, frontier = {0: ""}, [0]
    while not any(accepting[s] for s in frontier):
        reached = []
        for s in frontier:
            for ranges, t in moves[s]:
                if t not in words:
                    words[t] = words[s] + chr(ranges[0][0])
                    reached.append(t)
        frontier = reached
    return words[next(s for s in frontier if accepting[s])]


def exactly_one(patterns):
    """`combine`'s table for names matching exactly one of `patterns` (dead states refused:
    where two patterns already hold every continuation)."""
    irs = [parse_search_regex(p) for p in patterns]
    table = combine(irs, lambda got: sum(got) == 1, at_most_one=True).table
    return [list(m) for m in table.moves], list(table.accepting)


def test_dead_states_are_refused_as_in_python(native, monkeypatch):
    patterns = ("^a", "b$", "^[ab]+$", "c")
    assert exactly_one(patterns) == with_python(monkeypatch, exactly_one, patterns)


def test_tables_made_row_by_row_read_the_same(native, monkeypatch):
    """An open object's names: a table whose rows are made when first read (`_all_but`)."""
    names = exclude_words(parse_regex(r"[a-z_]+"), ["kind", "kinds", "metadata", "spec"])

    def intersect():
        got = combine([names, parse_regex(r"k[a-z]*")], all)
        return product([got], lambda flags: flags[0])[0]

    assert intersect() == with_python(monkeypatch, intersect)


def test_past_the_state_limit_the_error_is_the_python_codes(native, monkeypatch):
    monkeypatch.setattr(regex_algebra, "MAX_STATES", 20)
    irs = [parse_regex(r"(a|b)*a(a|b){6}")]
    with pytest.raises(ValueError, match="more than 20 states") as with_c:
        product(irs, lambda got: got[0])
    with pytest.raises(ValueError) as python:
        with_python(monkeypatch, product, irs, lambda got: got[0])
    assert str(with_c.value) == str(python.value)


def test_the_clock_stops_a_product(native):
    terms = Terms(Deadline(0.0))
    start = (terms.term(parse_regex(r"(a|b)*a(a|b){12}")),)
    with pytest.raises(CompileTimeout):
        explore(terms, start, lambda got: got[0])


@pytest.mark.skipif(not BENCH.is_dir(), reason="../shared/peer-data/jsonschemabench is absent")
@pytest.mark.filterwarnings("ignore:Possible:FutureWarning")  # re's notes on a few patterns
def test_benchmark_patterns_are_the_python_codes(native, monkeypatch):
    patterns: set[str] = set()
    for path in sorted(BENCH.glob("*/*.json")):
        found = re.finditer(r'"pattern": ("(?:[^"\\]|\\.)*")', path.read_text())
        patterns.update(json.loads(m.group(1)) for m in found)
    date_time = parse_regex(FORMATS["date-time"])
    for pattern in sorted(patterns)[::4]:
        try:
            ir = parse_search_regex(pattern)
        except ValueError:
            continue  # a pattern Python's re refuses: compiles refuse it too
        both_ways(monkeypatch, [ir], lambda got: got[0])
        both_ways(monkeypatch, [ir, date_time], lambda got: got[0] and not got[1])


@pytest.mark.parametrize("node", [("d",), ("a",), ("r", 0), ("s", 0)])
def test_a_malformed_term_is_a_type_error(native, node):
    """A term tuple shorter than its kind needs is named, not a crash or a SystemError."""
    terms = Terms()
    terms._nodes.append(node)
    bad = len(terms._nodes) - 1
    with pytest.raises(TypeError, match="lacks a field"):
        terms.nullable(bad)
    with pytest.raises(TypeError, match="lacks a field"):
        terms.deriv(bad, ord("a"))


def test_the_trie_of_names_is_the_python_codes(native, monkeypatch):
    """The trie that `exclude_words` walks beside a DFA (an object's declared names), made in
    C: the same nodes numbered alike, each node's children in code point order and the same
    word ends, for names that share prefixes or are prefixes of others, repeats, the empty
    name and code points past one byte and past the BMP; anything but a list of strings is a
    TypeError."""
    rng = random.Random(0)
    cases = [
        [],
        [""],
        ["a", "a", "ab"],
        ["abc", "abd", "ab", "b", "ba"],
        ["é", "€x", "😀", "\x00a"],
    ]
    for _ in range(300):
        alphabet = rng.choice(["ab", "abc_", "aé€😀\x00", "".join(map(chr, range(97, 123)))])
        size = rng.randint(0, 12)
        cases.append(["".join(rng.choices(alphabet, k=rng.randint(0, 7))) for _ in range(size)])
    for words in cases:
        got = regex_algebra._trie(words, Deadline(None))
        want = with_python_trie(monkeypatch, words)
        assert got == want, words
    kids, ends = regex_algebra._trie(["ab", "a", "ac"], Deadline(None))
    assert kids == (((97, 1),), ((98, 2), (99, 3)), (), ()) and ends == (False, True, True, True)
    with pytest.raises(TypeError, match="not a str"):
        regex_terms.regex_derivs().trie(["a", 1])
    with pytest.raises(TypeError, match="sorted list of str"):
        regex_terms.regex_derivs().trie(("a",))
