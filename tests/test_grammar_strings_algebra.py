"""Regex algebra at scale: `pattern` with long length bounds, patternProperties combinations.

Each result is compiled to a byte automaton and checked against `re.search` (the JSON Schema
meaning of `pattern`) on random words, and every live prefix against the words that finish it.
"""

import itertools
import random
import re

import pytest
from automaton_walk import accepts, walk
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.regex_algebra import combine, exclude_words, overlaps, restrict_length
from radixflow.grammars.regex_ir import MAX_CODEPOINT, normalize
from radixflow.grammars.regex_parse import parse_search_regex
from radixflow.grammars.regex_terms import NEVER, Terms


def words_near(rng: random.Random, alphabet: str, lengths: list[int]) -> list[str]:
    out = []
    for n in lengths:
        for m in (n - 1, n, n + 1):
            if m >= 0:
                out += ["".join(rng.choice(alphabet) for _ in range(m)) for _ in range(2)]
    return out


PATTERNS = [r"^[a-z]+$", r"ab", r"^a.*1$", r"^(ab|x)+-?$", r"[0-9]", r"x{2,3}", r"1$", r"^(a|b)*a$"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("lo,hi", [(0, 256), (3, 4096), (1, 32767), (300, None)])
def test_pattern_with_long_length_bounds_is_exact(pattern, lo, hi):
    ir = restrict_length(parse_search_regex(pattern), lo, hi)
    auto = RegexAutomaton(ir)
    rng = random.Random(f"{pattern}{lo}{hi}")
    top = hi if hi is not None else lo + 50
    lengths = [0, 2, lo, top] if top < 5000 else [0, 2, lo, 600]
    words = words_near(rng, "ab1-x", lengths)
    # A walk costs ~10 NFA and DFA states per code point read: the 32767 bound is not walked.
    edge = top if top < 5000 else 1000
    words += ["a" * edge + "1", "ab" + "x" * (edge - 3) + "1", "a" * (edge - 1) + "1"]
    for w in words:
        want = re.search(pattern, w) is not None and lo <= len(w) and (hi is None or len(w) <= hi)
        assert accepts(auto, w) == want, (pattern, lo, hi, len(w), w[:30])


@pytest.mark.parametrize("pattern", PATTERNS + [r"^(aa)*$", r"^a(ba)*$"])
@pytest.mark.parametrize("lo,hi", [(0, 3), (2, 5), (5, 5), (3, None), (4, 6)])
def test_live_prefixes_can_be_finished_within_the_bounds(pattern, lo, hi):
    alphabet, longest = "ab1x", 6
    ir = restrict_length(parse_search_regex(pattern), lo, hi)
    if ir is NEVER:
        return
    auto = RegexAutomaton(ir)
    words = ["".join(p) for n in range(longest + 1) for p in itertools.product(alphabet, repeat=n)]
    valid = {
        w for w in words if re.search(pattern, w) and lo <= len(w) and (hi is None or len(w) <= hi)
    }
    finishable = {w[:i] for w in valid for i in range(len(w) + 1)}
    for w in words:
        alive = walk(auto, w) >= 0
        if hi is not None:  # every word that finishes a prefix is among `words`
            assert alive == (w in finishable), (pattern, lo, hi, w)
        else:
            assert alive or w not in finishable, (pattern, lo, hi, w)
        assert accepts(auto, w) == (w in valid), (pattern, lo, hi, w)


PROPERTY_PATTERNS = ["^x-", "y$", "^[a-z]{1,40}$", "[0-9]{3}", "^(a|b)+-[0-9]+$"]


def test_pattern_properties_combinations_are_exact():
    irs = [parse_search_regex(p) for p in PROPERTY_PATTERNS]
    rng = random.Random(5)
    alphabet = "xy-ab09z"
    words = [""] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 50))) for _ in range(300)
    ]
    words += ["x-", "ay", "a-123", "ab" * 20, "ab" * 21, "x-012y", "b-9"]
    for want in itertools.product((False, True), repeat=len(irs)):
        ir = combine(irs, lambda got, want=want: got == want)
        if ir is NEVER:
            continue
        auto = RegexAutomaton(ir)
        for w in words:
            got = tuple(re.search(p, w) is not None for p in PROPERTY_PATTERNS)
            assert accepts(auto, w) == (got == want), (want, w)


OVERLAP_PATTERNS = [
    *PROPERTY_PATTERNS, *PATTERNS, r"^name:(en|nl)$", r"^contacts:([0-3]{1}):surName$",
    r"^x-", r"^[^x]", r"^$", r"(ab)*$", r"^(a|b)*a$",
]  # fmt: skip


def test_overlaps_agrees_with_the_product_automaton():
    # The search's slow twin: building the whole product and asking whether it is empty.
    irs = [parse_search_regex(p) for p in OVERLAP_PATTERNS]
    groups = [*itertools.combinations(range(len(irs)), 2), *itertools.combinations(range(6), 3)]
    terms = Terms()
    starts = [terms.term(ir) for ir in irs]
    found = 0
    for group in groups:
        want = combine([irs[i] for i in group], all) is not NEVER
        assert overlaps(terms, [starts[i] for i in group]) == want, [
            OVERLAP_PATTERNS[i] for i in group
        ]
        found += want
    assert 0 < found < len(groups)  # both answers occur


def test_exclude_words_after_a_combination():
    irs = [parse_search_regex(p) for p in PROPERTY_PATTERNS[:3]]
    names = combine(irs, lambda got: not any(got))
    ir = exclude_words(names, ["q", "zz", "x"])
    auto = RegexAutomaton(ir)
    for w in ["q", "zz", "x", "qq", "z", "", "x-", "Q", "zz1"]:
        free = not any(re.search(p, w) for p in PROPERTY_PATTERNS[:3])
        assert accepts(auto, w) == (free and w not in ("q", "zz", "x")), w


@pytest.mark.parametrize("max_length", [256, 4096, 32767])
def test_pattern_and_max_length_schemas_compile(max_length):
    compiler = GrammarCompiler(tiny_tokenizer(), compile_timeout=10.0)
    schema = {"type": "string", "pattern": "^[a-z]*-[0-9]+$", "maxLength": max_length}
    grammar = compiler.compile_json_schema(schema)
    m = grammar.matcher()
    m.next_token_mask()
    auto = grammar.automaton
    assert accepts(auto, '"ab-12"') and not accepts(auto, '"ab-"')
    # A walk keeps ~10 KiB of automaton per character of a counted string, so the grammar's
    # 128 MiB budget (max_mb) ends one string near 12,000 characters: walk to 4096 at most.
    edge = min(max_length, 4096)
    assert accepts(auto, '"' + "a" * (edge - 2) + '-1"')
    assert accepts(auto, '"' + "a" * (edge - 1) + '-1"') == (edge < max_length)


def test_classes_are_the_code_points_each_set_of_sets_holds():
    """`Terms.classes` partitions the code points the sets cover by which of the sets hold
    them (one block each), the rest apart when asked: checked point by point on random sets
    that touch, overlap and reach the last code point."""
    rng = random.Random(7)
    top = MAX_CODEPOINT
    for _ in range(300):
        sets = []
        for _ in range(rng.randint(1, 6)):
            starts = [
                rng.choice([0, rng.randint(0, 120), top - rng.randint(0, 3)]) for _ in range(3)
            ]
            sets.append(normalize(tuple((lo, min(lo + rng.randint(0, 40), top)) for lo in starts)))
        with_rest = rng.random() < 0.5
        terms = Terms()
        blocks = terms.classes([terms.chars(r) for r in sets], with_rest)
        points = sorted(
            {p for r in sets for lo, hi in r for p in (lo, hi, lo - 1, hi + 1)} | {0, 64}
        )
        points = [p for p in points if 0 <= p <= top]
        signature = {p: tuple(any(lo <= p <= hi for lo, hi in r) for r in sets) for p in points}
        block_of = {p: [i for i, b in enumerate(blocks) if any(lo <= p <= hi for lo, hi in b)]
                    for p in points}  # fmt: skip
        for p in points:
            if any(signature[p]) or with_rest:
                assert len(block_of[p]) == 1, (sets, p, blocks)
            else:
                assert block_of[p] == [], (sets, p, blocks)
        for p, q in itertools.combinations(points, 2):
            if block_of[p] and block_of[q]:
                assert (block_of[p] == block_of[q]) == (signature[p] == signature[q]), (sets, p, q)
