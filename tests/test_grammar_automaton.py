"""The lazy NFA: counters for bounded repeats, states made on first visit, no deep recursion.

Languages are checked against `re.fullmatch` (and `regex` partial matches for live prefixes)
on random strings; laziness is checked on the number of NFA states built, not on time.
"""

import gc
import random
import re

import pytest
import regex
from automaton_walk import walk
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.regex_ir import Alt, Chars, Seq, literal
from radixflow.grammars.regex_parse import parse_regex


def check_against_re(pattern: str, words: list[str]) -> None:
    """Our automaton accepts exactly what `re.fullmatch` does; live prefixes can be finished."""
    auto = RegexAutomaton(parse_regex(pattern))
    for w in words:
        state = walk(auto, w)
        got = state >= 0 and auto.is_accepting(state)
        assert got == (re.fullmatch(pattern, w) is not None), (pattern, len(w), w[:40])
        if state >= 0:
            assert regex.fullmatch(pattern, w, partial=True) is not None, (pattern, w[:40])


def around(rng: random.Random, alphabet: str, lengths: list[int], per: int = 3) -> list[str]:
    """Random words over `alphabet` with lengths near each of `lengths`."""
    out = [""]
    for n in lengths:
        for m in (n - 1, n, n + 1):
            if m >= 0:
                out += ["".join(rng.choice(alphabet) for _ in range(m)) for _ in range(per)]
    return out


@pytest.mark.parametrize(
    "pattern,alphabet,lengths",
    [
        ("a{3,5000}", "a", [2, 3, 4999, 5000]),
        ("[a-c]{0,32767}x", "abcx", [1, 5, 300]),
        ("(ab){2,3000}c?", "abc", [4, 6000]),
        ("(a|bc){5,}", "abc", [5, 6, 40]),
        ("(xy{1,2}){100,200}", "xy", [199, 200, 400, 600, 601]),
        ("é{2,700}[^a]{0,3}", "éa\u65e5", [2, 701]),
    ],
)
def test_bounded_repeats_match_re(pattern, alphabet, lengths):
    rng = random.Random(pattern)
    words = around(rng, alphabet, lengths)
    words += [alphabet[0] * n for n in lengths]
    words += [alphabet[:2] * n for n in lengths] + [alphabet[:2] + alphabet[-1] * n for n in (1, 2)]
    check_against_re(pattern, words)


@pytest.mark.parametrize(
    "pattern,alphabet",
    [
        ("(a*b?)*c", "abc"),
        ("((ab)+|c?)*d?", "abcd"),
        ("(x(y?z*)+)?w", "xyzw"),
        ("(é?[^a]*)+a", "éab"),
        ("(a?(b(c(d)*)*)*)*e", "abcde"),
        ("(ab?){2,4}(c*d){1,}", "abcd"),
    ],
)
def test_stars_and_optionals_nested_in_counters_match_re(pattern, alphabet):
    # Repeats that stop counting (`*`, `+`, `?`) build their bodies into their continuation;
    # bounded ones around or inside them still count.
    rng = random.Random(pattern)
    words = around(rng, alphabet, [1, 2, 3, 5, 8, 13], per=20)
    check_against_re(pattern, words)


def test_nested_counters_match_re():
    # (xy{1,2}) cannot split a word two ways, so `re` checks it without backtracking.
    pattern = "(xy{1,2}){100,200}"
    words = ["xy" * n for n in (99, 100, 200, 201)] + ["xyy" * n for n in (100, 150, 201)]
    words += ["xyxyy" * 60 + "xyyy", "xyxyy" * 40 + "xyy" * 120, "xyxyy" * 60 + "y"]
    check_against_re(pattern, words)


def pieces(word: str) -> int:
    """Fewest words of `a?b?` (non-empty) that make up a word over a, b: take `ab` when possible."""
    i = count = 0
    while i < len(word):
        i += 2 if word[i : i + 2] == "ab" else 1
        count += 1
    return count


def test_an_ambiguous_counted_body_keeps_its_states_small():
    # After n characters `(a?b?){0,1000}` can be at any of ~n counts; the smallest one allows
    # everything the others do, so a DFA state keeps one place per count it could be at.
    auto = RegexAutomaton(parse_regex("(a?b?){0,1000}"))
    rng = random.Random(7)
    words = ["ab" * 500, "ab" * 500 + "a", "ba" * 500, "ba" * 500 + "a", "b" * 1000 + "a"]
    words += ["".join(rng.choice("ab") for _ in range(n)) for n in (600, 1100, 1300, 1500)]
    for w in words:
        state = walk(auto, w)
        assert (state >= 0 and auto.is_accepting(state)) == (pieces(w) <= 1000), (len(w), w[:20])
    assert max(len(s) for s in auto.dfa.sets) < 20


def test_a_large_repeat_is_a_counter_built_as_it_is_read():
    auto = RegexAutomaton(parse_regex("[a-z]{0,32767}"))
    built = len(auto.dfa.nfa)
    assert built < 20  # not one copy per count
    state = walk(auto, "q" * 4096)
    assert auto.is_accepting(state)
    per_char = (len(auto.dfa.nfa) - built) / 4096
    assert per_char <= 4, per_char  # linear in what was read, small constant


def test_nullable_bodies_do_not_run_through_the_counts():
    auto = RegexAutomaton(parse_regex("(ab?|c?){0,100000}d"))
    assert len(auto.dfa.nfa) < 50 and len(auto.dfa.sets[auto.initial]) < 10
    assert auto.is_accepting(walk(auto, "abac" * 300 + "d"))
    assert walk(auto, "abb") < 0


def test_a_literal_costs_what_a_walk_reads_of_it():
    # 300 words of 40 characters, no two ending alike (the whole language: 12,000 NFA
    # states): a walk that reads three characters builds the positions it reached.
    rng = random.Random(3)
    words = [f"{i:03d}" + "".join(rng.choice("abcdefgh") for _ in range(37)) for i in range(300)]
    auto = RegexAutomaton(Alt(tuple(literal(w) for w in words)))
    state = walk(auto, "123")
    assert state >= 0 and not auto.is_accepting(state)
    assert len(auto.dfa.nfa) < 1_000, len(auto.dfa.nfa)
    assert auto.is_accepting(walk(auto, words[123]))
    assert walk(auto, words[123][:-1] + "y") < 0
    assert walk(auto, "3") < 0


def test_deep_ir_compiles_without_recursion():
    node = Chars(((ord("z"), ord("z")),))
    for i in range(20_000):
        node = Seq((Chars(((97 + i % 3, 97 + i % 3),)), node))
    auto = RegexAutomaton(node)
    text = "".join(chr(97 + i % 3) for i in reversed(range(20_000))) + "z"
    assert auto.is_accepting(walk(auto, text))
    assert walk(auto, text[:-1] + "y") < 0
    # Sequences that start with a sequence, as deep: read first item first, in a loop.
    node = Chars(((ord("z"), ord("z")),))
    for i in range(20_000):
        node = Seq((node, Chars(((97 + i % 3, 97 + i % 3),))))
    auto = RegexAutomaton(node)
    text = "z" + "".join(chr(97 + i % 3) for i in range(20_000))
    assert auto.is_accepting(walk(auto, text))
    assert walk(auto, "zb") < 0


def test_only_the_visited_part_of_a_large_alternation_is_built():
    branches = [
        Seq(
            (Chars(((0x4E00 + i, 0x4E00 + i),)), Alt(tuple(literal(f"{i}-{j}") for j in range(40))))
        )
        for i in range(500)
    ]
    auto = RegexAutomaton(Alt(tuple(branches)))
    assert len(auto.dfa.nfa) < 2_500  # a few states per branch head, none for its words
    assert auto.is_accepting(walk(auto, chr(0x4E00 + 123) + "123-39"))
    assert walk(auto, chr(0x4E00 + 123) + "124-") < 0
    # A row interns every successor: the 64 branches one third byte can reach build their
    # words' states (the whole language would take ~120,000).
    assert len(auto.dfa.nfa) < 10_000


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), compile_timeout=10.0)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 32767},
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 1000},
        {"type": "string", "pattern": "[0-9]x", "minLength": 2, "maxLength": 4096},
    ],
)
def test_long_string_bounds_compile_and_mask_lazily(compiler, schema):
    grammar = compiler.compile_json_schema(schema)
    matcher = grammar.matcher()
    matcher.next_token_mask()
    nfa = grammar.automaton.dfa.nfa
    assert len(nfa) < 300, len(nfa)  # what the first mask visits, not the bound
    assert len(grammar.automaton.dfa.sets) < 50


def test_automaton_tables_leave_the_cyclic_garbage_collector(compiler):
    # A cached grammar holds NFA moves and edges and DFA states by the hundred thousand; kept
    # as tuples of ints they are not tracked, so Python's full collections, which stall
    # whatever compile or mask runs at the time, do not grow with the grammar cache.
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 1000},
            "tags": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}},
        },
    }
    tok = tiny_tokenizer()
    compiler.clear_cache()
    gc.collect()
    gc.collect()
    before = len(gc.get_objects())
    grammar = compiler.compile_json_schema(schema)
    matcher = grammar.matcher()
    text = '{"name":"' + "ab" * 200 + '","tags":["beta"]}'  # a count per character
    for t in tok.encode(text, add_special_tokens=False):
        matcher.next_token_mask()
        assert matcher.accept(t)
    gc.collect()
    gc.collect()
    nfa_states = len(grammar.automaton.dfa.nfa)
    assert nfa_states > 5_000
    assert len(gc.get_objects()) - before < nfa_states // 2
