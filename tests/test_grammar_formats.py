"""String formats (`json_schema_formats.FORMATS`) against `jsonschema`'s format checker.

Soundness: words sampled from each format's regex IR (the IR the compiler builds the grammar
from) validate with the draft 2020-12 format checker, which checks with the
`jsonschema[format]` extras; each test first makes sure the checker really checks, so a
missing extra fails rather than passes. Completeness: common values are accepted, known
invalid ones (JSONSchemaBench's among them) rejected, end to end through the engine.
"""

import ast
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
from automaton_walk import accepts
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.json_schema_formats import FORMATS, MAX_LENGTH
from radixflow.grammars.regex_ir import Alt, Chars, Repeat, Seq
from radixflow.grammars.regex_parse import parse_regex

BENCH = Path(__file__).resolve().parents[2] / "shared/peer-data/jsonschemabench"
# Draft 2020-12's checker: `jsonschema.FormatChecker()` checks "time" as draft 3 did
# (HH:MM:SS, no offset), which JSONSchemaBench's expectations do not.
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
SAMPLES = 2000  # per format; ten times as many regexes, whose nested groups are rarer

VALID = {
    "date-time": ["2024-02-29T23:59:59Z", "1999-12-31T00:00:00.123+05:30", "0001-01-01T00:00:00-00:00"],
    "date": ["2024-02-29", "2000-02-29", "2023-12-31", "0004-02-29"],
    "time": ["12:00:00Z", "23:59:59.5+01:00", "00:00:00-23:59"],
    "email": ["user@example.com", "first.last+tag@sub.example.co.uk"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"],
    "uri": [
        "https://example.com", "http://user:pw@example.com:8080/a/b?x=1&y=%20z#frag", "file:///etc/hosts",
        "mailto:someone@example.com", "urn:isbn:0451450523", "http://192.168.0.1/path;p=1", "a:",
    ],
    "uri-reference": [
        "../a/b?x=1#f", "#/definitions/x", "", "//example.com/x", "/abs/path", "a/b:c",
        "https://example.com/schema", "?q=1",
    ],
    "iri": ["http://例え.jp/パス?q=値#フラグ", "https://example.com/ünïcödé", "urn:x:\U00010348"],
    "iri-reference": ["../ü/b", "#/définitions/x", "ﬁle"],
    "ipv4": ["0.0.0.0", "192.168.1.1", "255.255.255.255"],
    "ipv6": [
        "::", "::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::",
        "::2:3:4:5:6:7:8", "::ffff:192.0.2.128", "1:2:3:4:5:6:1.2.3.4", "fe80::1",
    ],
    "hostname": ["localhost", "example.com", "a-b.c-d.example", "xn--bcher-kva.example", "1.2.3.4",
                 "a" * 63 + ".com", ".".join(["a" * 63] * 3 + ["b" * 61])],  # 253 characters
    "json-pointer": ["", "/", "/a/b", "/a~0b/c~1d", "/0/items/-", "/ü"],
    "relative-json-pointer": ["0", "1#", "0/a/b", "10/x", "120#"],
    "regex": [
        "^[a-z0-9-]+$", r"\d{4}-\d{2}", "(?:ab|cd)+", r"^\S+@\S+\.\S+$", "^https?://", "^[A-Z]{2,3}$",
        r"^\+?[1-9]\d{1,14}$", "^#([A-Fa-f0-9]{6}|[A-Fa-f0-9]{3})$", "[A-Za-z0-9._%+-]+", "a*?b+?c??",
        r"^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$", "", "|", "[^-]", r"\bword\b", "((a|b)*c)?", ".{8,255}",
    ],
}  # fmt: skip

INVALID = {
    "date-time": ["2024-01-01 12:00:00", "2023-02-29T00:00:00Z", "0000-01-01T00:00:00Z", "2024-01-01T12:00:00"],
    "date": ["2019-12-32", "2020-02-30", "0000-01-01", "1900-02-29", "Invalid Date"],
    "time": ["12:00:00", "24:00:00Z", "not a time"],
    "email": ["invalid-email", "a"],
    "uuid": ["not-a-uuid", "123e4567-e89b-12d3-a456-42665544000"],
    "uri": ["a:%zz", "http://[bad", "a:b[c", "not a uri", "invalid_uri", "//no-scheme", "http://a b"],
    "uri-reference": ["!not a uri-reference!", " invalid_uri", "invalid Id", "a:%zz", "a#b#c"],
    "iri": ["not-an-iri", "http://a b", "http://[::1"],
    "iri-reference": ["a b", "%zz", "#a#b"],
    "ipv4": ["256.1.1.1", "1.2.3", "01.2.3.4"],
    "ipv6": ["1:2:3:4:5:6:7::1:2:3:4:5:6:7", "1::2::3", "12345::", "1:2:3:4:5:6:7:8:9", "::1%eth0"],
    "hostname": ["localhost:8080", "Invalid Hostname", "-a.com", "a-.com", "_x", "a" * 64,
                 ".".join(["a" * 63] * 3 + ["b" * 62])],  # 254 characters
    "json-pointer": ["a", "/~2", "/a~"],
    "relative-json-pointer": ["01", "-1", "0#/a", "100", "#"],
    "regex": ["*", "\\", "[", "[z-a]", "a**", "(*)", "|*", "^*", "(?P<", "a{2}{3}", "a{3,2}", r"\1"],
}  # fmt: skip


# Valid, and left out of the language on purpose (see `json_schema_formats`).
LEFT_OUT = {
    "uri": ["http://[2001:db8::1]:80/", "http://[::ffff:192.0.2.1]/", "http://[v1.fe]/"],
    "iri-reference": ["//[::1]/ü"],
    "regex": ["[b-d]", "a{10,15}", "(?P<name>x)", "(a)\\1"],
}  # fmt: skip


@pytest.fixture(scope="module")
def checker() -> jsonschema.FormatChecker:
    """The format checker, once it is shown to check every format (a missing
    `jsonschema[format]` extra leaves its formats unchecked: every string passes)."""
    for fmt in FORMATS:
        assert not CHECKER.conforms(INVALID[fmt][0], fmt), f"{fmt} is not checked: extras missing?"
    return CHECKER


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(tiny_tokenizer(), compile_timeout=20.0)


@pytest.fixture(scope="module")
def engine(compiler):
    """fmt -> whether the grammar of `{"type": "string", "format": fmt}` accepts a string."""
    grammars = {f: compiler.compile_json_schema({"type": "string", "format": f}) for f in FORMATS}

    def accepted(fmt: str, text: str) -> bool:
        return accepts(grammars[fmt].automaton, json.dumps(text, ensure_ascii=False))

    return accepted


def sample(node, rng: random.Random) -> str:
    """A random word of regex IR `node`: each option of an `Alt` alike, each range of a class
    alike (then a code point in it, no surrogate), repeats at most 5 past their minimum."""
    if isinstance(node, Chars):
        while True:
            lo, hi = rng.choice(node.ranges)
            cp = rng.randint(lo, hi)
            if not 0xD800 <= cp <= 0xDFFF:
                return chr(cp)
    if isinstance(node, Seq):
        return "".join(sample(item, rng) for item in node.items)
    if isinstance(node, Alt):
        return sample(rng.choice(node.items), rng)
    assert isinstance(node, Repeat), node
    top = node.lo + 5 if node.hi is None else min(node.hi, node.lo + 5)
    return "".join(sample(node.item, rng) for _ in range(rng.randint(node.lo, top)))


@pytest.mark.filterwarnings("error")  # `re.compile`'s FutureWarnings included
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sampled_words_validate(checker, engine, fmt):
    ir, rng = parse_regex(FORMATS[fmt]), random.Random(fmt)
    cap, samples = MAX_LENGTH.get(fmt), SAMPLES * (10 if fmt == "regex" else 1)
    checked = 0
    for _ in range(samples):
        text = sample(ir, rng)
        if cap is not None and len(text) > cap:
            assert not engine(fmt, text), text
            continue
        assert checker.conforms(text, fmt), text
        assert engine(fmt, text), text
        checked += 1
    assert checked > samples // 2


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_common_values_accepted_invalid_ones_rejected(checker, engine, fmt):
    for text in VALID[fmt]:
        assert checker.conforms(text, fmt), text
        assert engine(fmt, text), text
    for text in INVALID[fmt]:
        assert not checker.conforms(text, fmt), text
        assert not engine(fmt, text), text
    for text in LEFT_OUT.get(fmt, []):
        assert checker.conforms(text, fmt), text
        assert not engine(fmt, text), text


def test_hostname_cap_holds_beside_other_keywords(checker, compiler):
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])
    for schema in [
        {"type": "string", "format": "hostname", "maxLength": 300},
        {"type": "string", "format": "hostname", "minLength": 2, "pattern": "^a"},
        {"oneOf": [{"type": "string", "format": "hostname"}, {"type": "string", "format": "ipv4"}]},
    ]:
        auto = compiler.compile_json_schema(schema).automaton
        assert accepts(auto, json.dumps(longest)) and not accepts(auto, json.dumps(longest + "b"))
    assert not checker.conforms(longest + "b", "hostname")


def bench_format_failures() -> list[tuple[str, str, str]]:
    """(file, format, value) of every JSONSchemaBench instance that fails only a `format` the
    engine enforces, as `jsonschema` reported it."""
    out = []
    message = re.compile(r"(.*) is not a '([^']+)'")
    for path in sorted(BENCH.glob("*/*.json")):
        for case in json.loads(path.read_text())["tests"]:
            found = message.fullmatch(case.get("python_error", "").split("\n", 1)[0])
            if found and found[2] in FORMATS:
                out.append((path.name, found[2], ast.literal_eval(found[1])))
    return out


@pytest.mark.skipif(not BENCH.is_dir(), reason="JSONSchemaBench not in ../shared/peer-data")
def test_jsonschemabench_format_failures_are_rejected(engine):
    failures = bench_format_failures()
    assert len({fmt for _, fmt, _ in failures}) >= 10, failures
    accepted = [case for case in failures if engine(case[1], case[2])]
    assert not accepted, accepted
