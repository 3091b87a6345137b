"""`patternProperties` name classes: which patterns a name matches, and which sets of patterns
some name matches together, against Python's `re` (the literal-start shortcut included)."""

import itertools
import random
import re

import pytest

from radixflow.grammars.json_schema_names import PatternNames
from radixflow.grammars.nfa import Deadline
from radixflow.grammars.regex_ir import word_prefix
from radixflow.grammars.regex_parse import parse_regex, parse_search_regex

PATTERNS = [
    "^name:(en|nl|pt)$",
    "^name:e",  # shares a start with the one above
    "^na",
    "^contacts:([0-3]{1}):surName$",
    "^contacts:([0-3]{1}):givenName$",
    "^(?:x-|X-)",  # no single literal start
    "Name$",  # unanchored
    "^coin:ss:type_of_service:(en|nl)$",
    "^[a-z]+$",
    "^name:en$",
]
ALPHABET = "nameNcotsx:X-01234enlpgivurS_fy"
NAMES = [
    "name:en",
    "name:nl",
    "name:pt",
    "name:e",
    "na",
    "n",
    "",
    "contacts:2:surName",
    "contacts:4:givenName",
    "x-anything",
    "X-Name",
    "givenName",
    "coin:ss:type_of_service:nl",
    "lowercase",
]


def random_names(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    prefixes = ["name:", "contacts:1:", "x-", "coin:ss:type_of_service:", "", "na"]
    return [
        rng.choice(prefixes) + "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(6)))
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def names() -> PatternNames:
    return PatternNames({p: {} for p in PATTERNS}, Deadline(None))


def test_word_prefix_is_the_literal_start_of_every_word():
    assert word_prefix(parse_search_regex("^name:(en|nl)$")) == "name:"
    assert word_prefix(parse_search_regex("^contacts:([0-3]):x$")) == "contacts:"
    assert word_prefix(parse_search_regex("Name$")) == ""  # unanchored: any text before
    assert word_prefix(parse_search_regex("^(?:ab|ac)")) == "a"  # re factors the "a" out
    assert word_prefix(parse_search_regex("^(?:ab|cd)")) == ""
    assert word_prefix(parse_search_regex("(?i)^ab")) == ""  # classes, not one code point
    assert word_prefix(parse_regex("abc(d|e)f")) == "abc"


def test_matched_agrees_with_re_search(names):
    for name in NAMES + random_names(400, 1):
        assert names.matched(name) == tuple(bool(re.search(p, name)) for p in PATTERNS), name


def test_every_name_falls_in_a_listed_class(names):
    classes = set(names.classes("#"))
    for name in NAMES + random_names(400, 2):
        assert tuple(bool(re.search(p, name)) for p in PATTERNS) in classes, name


def test_patterns_with_clashing_literal_starts_share_no_class(names):
    # "^name:(en|nl|pt)$" and "^contacts:..." cannot both match a name; "^name:en$",
    # "^name:e", "^na" and "^name:(en|nl|pt)$" can ("name:en")
    index = {p: i for i, p in enumerate(PATTERNS)}
    classes = names.classes("#")
    assert not any(c[index["^name:(en|nl|pt)$"]] and c[index["^contacts:([0-3]{1}):surName$"]]
                   for c in classes)  # fmt: skip
    assert tuple(bool(re.search(p, "name:en")) for p in PATTERNS) in classes
    for a, b in itertools.combinations(range(len(PATTERNS)), 2):
        both = any(c[a] and c[b] for c in classes)
        witness = any(
            re.search(PATTERNS[a], n) and re.search(PATTERNS[b], n)
            for n in NAMES + random_names(400, 3)
        )
        assert both or not witness, (PATTERNS[a], PATTERNS[b])
