"""Grammar compilation limits: every path answers a ValueError naming the limit, in time."""

import json
import random
import re
import time
from decimal import Decimal

import pytest
from automaton_walk import accepts as automaton_accepts
from tiny_models import tiny_tokenizer

from radixflow.grammars import CompileTimeout, GrammarCompiler
from radixflow.grammars.json_schema_numbers import int_range_regex, number_range_regex
from radixflow.runtime.constrained import GrammarService
from radixflow.runtime.sampling_params import SamplingParams

# Many distinct repeats: seconds to intersect with a length bound or another pattern.
SLOW_REGEX = "(" + "|".join(f"[a-z]{{1,100}}w{i}" for i in range(2000)) + ")"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def gc(tok):
    return GrammarCompiler(tok, compile_timeout=5.0)


def accepts(grammar, text: str) -> bool:
    """Does the compiled grammar's byte automaton accept exactly `text`?"""
    return automaton_accepts(grammar.automaton, text)


def timed(fn):
    start = time.perf_counter()
    try:
        fn()
    except ValueError as exc:
        return exc, time.perf_counter() - start
    raise AssertionError("no ValueError")


# ---- integer and number ranges -------------------------------------------------------------
def _samples(rng: random.Random, bounds: list, digits: int) -> list[int]:
    out = [0, 1, -1, 9, 10, -10, 99, 100, 10**digits, -(10**digits)]
    for b in bounds:
        if b is not None:
            width = 10 ** len(str(abs(b)))
            out += [b - 1, b, b + 1, -b, b * 10, width - 1, width, -width]
    return out + [rng.randrange(-(10 ** (digits + 1)), 10 ** (digits + 1)) for _ in range(40)]


def test_integer_ranges_match_python_ints():
    rng = random.Random(0)
    for _ in range(1500):
        digits = rng.choice([1, 2, 3, 7, 19, 30])
        lo, hi = (rng.randrange(-(10**digits), 10**digits) for _ in range(2))
        lo = None if rng.random() < 0.15 else lo
        hi = None if rng.random() < 0.15 else hi
        pattern = re.compile(int_range_regex(lo, hi))
        for v in _samples(rng, [lo, hi], digits):
            want = (lo is None or v >= lo) and (hi is None or v <= hi)
            assert bool(pattern.fullmatch(str(v))) == want, (lo, hi, v)
        for text in ("", "-", "00", "01", "-0", "+1", "1.0"):
            assert not pattern.fullmatch(text), (lo, hi, text)
    for lo in range(-60, 61, 7):  # every value of small ranges, both signs
        for hi in range(-60, 61, 5):
            pattern = re.compile(int_range_regex(lo, hi))
            assert [v for v in range(-700, 701) if pattern.fullmatch(str(v))] == [
                v for v in range(-700, 701) if lo <= v <= hi
            ]


def test_number_ranges_match_python_comparisons():
    rng = random.Random(1)
    for _ in range(300):
        digits = rng.choice([1, 3, 19, 30])
        lo, hi = sorted(rng.randrange(-(10**digits), 10**digits) for _ in range(2))
        lo_x, hi_x = rng.random() < 0.5, rng.random() < 0.5
        pattern = re.compile(number_range_regex(lo, lo_x, hi, hi_x))
        for v in _samples(rng, [lo, hi], digits):
            for frac in ("", ".0", ".5", ".000", ".25"):
                text = f"{v}{frac}"
                d = Decimal(text)
                want = (d > lo if lo_x else d >= lo) and (d < hi if hi_x else d <= hi)
                assert bool(pattern.fullmatch(text)) == want, (lo, lo_x, hi, hi_x, text)


@pytest.mark.parametrize(
    "lo,hi",
    [
        (0, 9007199254740991),
        (-(2**63), 2**63 - 1),
        (-int("7" * 30), int("3" * 30)),
        (-int("98765432109876543210987654321"), -int("1234567890123456789")),
    ],
)
def test_wide_integer_ranges_compile_fast_and_exactly(tok, lo, hi):
    gc = GrammarCompiler(tok, compile_timeout=10.0)
    start = time.perf_counter()
    g = gc.compile_json_schema({"type": "integer", "minimum": lo, "maximum": hi})
    assert time.perf_counter() - start < 5.0  # was: never finished, or a RecursionError
    rng = random.Random(2)
    digits = len(str(max(abs(lo), abs(hi))))
    for v in _samples(rng, [lo, hi], digits)[:40]:
        assert accepts(g, str(v)) == (lo <= v <= hi), v
    start = time.perf_counter()
    gc.compile_json_schema({"type": "number", "exclusiveMinimum": lo, "maximum": hi})
    assert time.perf_counter() - start < 5.0


# ---- the time limit on every path ----------------------------------------------------------
@pytest.mark.parametrize(
    "kind,source",
    [  # regexes and grammars are built lazily: the pattern algebra is what can be slow
        ("json_schema", {"type": "string", "pattern": f"^{SLOW_REGEX}$", "maxLength": 50}),
        ("json_schema", {"type": "string", "pattern": f"^{SLOW_REGEX}$", "not": {"pattern": "q"}}),
    ],
)
def test_compile_timeout_is_a_value_error_naming_the_limit(tok, kind, source):
    gc = GrammarCompiler(tok, compile_timeout=1.0)
    exc, took = timed(lambda: gc.compile(kind, source))
    assert isinstance(exc, CompileTimeout)
    assert "time limit of 1 s" in str(exc) and "grammar_compile_timeout" in str(exc)
    assert took < 3.0


@pytest.mark.parametrize(
    "kind,source",
    [
        ("regex", "a{1000000}"),
        ("regex", "(ab|cd){0,400000}"),
        ("regex", "(){4294967294}"),
        ("regex", "x{2,4294967294}"),
        ("json_schema", {"type": "string", "minLength": 10**7}),
        ("json_schema", {"type": "array", "items": {"type": "integer"}, "minItems": 1e9}),
        ("lark", 'start: A\nA: "a" ~ 1000000\n'),
    ],
)
def test_huge_repeats_compile_as_counters(tok, kind, source):
    # Once one NFA copy per count (or a MAX_NFA_STATES error): now a count per walk step.
    grammar = GrammarCompiler(tok, compile_timeout=10.0).compile(kind, source)
    grammar.matcher().next_token_mask()
    auto = grammar.automaton
    nfa = auto.dfa.nfa if hasattr(auto, "dfa") else auto.lexer.nfa
    assert len(nfa) < 1_000, len(nfa)  # what the first mask's tokens read, not the bound


# ---- malformed input -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "schema,message",
    [
        ('{"type": "integer", "minimum": Infinity}', "minimum must be a finite number"),
        ('{"type": "number", "maximum": -Infinity}', "maximum must be a finite number"),
        ('{"type": "number", "exclusiveMinimum": NaN}', "exclusiveMinimum must be a finite"),
        ({"type": "integer", "minimum": "5"}, "minimum must be a finite number"),
        ({"type": "integer", "maximum": True}, "maximum must be a finite number"),
        ({"allOf": [{"minimum": 1}, {"minimum": "x"}]}, "minimum must be a finite number"),
        ({"type": "integer", "minimum": 10**400}, "MAX_BOUND_DIGITS"),
        ({"type": "string", "maxLength": float("inf")}, "maxLength must be a non-negative"),
        ({"type": "string", "minLength": -1}, "minLength must be a non-negative integer"),
        ({"type": "array", "maxItems": 1.5}, "maxItems must be a non-negative integer"),
        ({"type": "object", "required": 5}, "malformed JSON schema"),
        ({"allOf": ["x"]}, "a schema must be an object"),
    ],
)
def test_bad_schema_values_are_value_errors(gc, schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gc.compile_json_schema(schema)


def test_deep_nesting_is_a_value_error(gc):
    schema: dict = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    cases = [
        ("json_schema", schema),
        ("json_schema", '{"items":' * 5000 + "{}" + "}" * 5000),
        ("regex", "(" * 5000 + "a" + ")" * 5000),
        ("lark", "start: " + "(" * 3000 + '"a"' + ")" * 3000 + "\n"),
        ("ebnf", "root ::= " + "(" * 3000 + '"a"' + ")" * 3000 + "\n"),
    ]
    for kind, source in cases:
        with pytest.raises(ValueError, match="nested too deeply.*recursion limit"):
            gc.compile(kind, source)
    with pytest.raises(ValueError, match="^#/items/items/items/"):  # where, as a JSON pointer
        gc.compile_json_schema(schema)


def test_backtracking_patterns_do_not_hang(gc):
    evil, text = "^(a+)+$", "a" * 40 + "!"
    start = time.perf_counter()
    gc.compile_json_schema({"oneOf": [{"const": text}, {"type": "string", "pattern": evil}]})
    schema = {"type": "object", "properties": {text: {"type": "integer"}},
              "patternProperties": {"(a+)+$": {"type": "string"}}}  # fmt: skip
    gc.compile_json_schema(schema)
    assert time.perf_counter() - start < 3.0


def test_enum_intersection_is_linear(gc):
    values = list(range(20000))
    start = time.perf_counter()
    g = gc.compile_json_schema({"allOf": [{"enum": values}, {"enum": values[::-1]}]})
    assert time.perf_counter() - start < 5.0
    assert accepts(g, "19999") and not accepts(g, "20000")


# ---- Lark: what lark itself cannot interrupt -----------------------------------------------
@pytest.mark.parametrize(
    "text,limit",
    [
        ("start: " + " ".join(['("a"|"b")'] * 20) + "\n", "MAX_EXPANSIONS"),
        ("start: " + " ".join(['"a"?'] * 20) + "\n", "MAX_EXPANSIONS"),
        ('start: (("a" ~ 0..49) ~ 0..49)\n', "MAX_EXPANSIONS"),
        (
            'start: T\nT: T30\nT0: "ab"\n'
            + "".join(f"T{i}: T{i - 1} T{i - 1}\n" for i in range(1, 31)),
            "MAX_TERMINAL_GROWTH",
        ),
        ('start: _t{a}\n_t{x}: x | _t{_t{x}}\na: "a"\n', "without end"),
        ("start: " + " | ".join(f'"k{i}"' for i in range(20000)) + "\n", "MAX_GRAMMAR_CHARS"),
    ],
)
def test_lark_blowups_are_refused_before_lark_runs(gc, text, limit):
    exc, took = timed(lambda: gc.compile_lark(text))
    assert limit in str(exc)
    assert took < 1.0


def test_large_rule_repeats_stay_cheap(gc):
    """lark splits `~ n` over rules into O(log n) helper rules; GBNF `{n}` becomes that."""
    start = time.perf_counter()
    g = gc.compile_lark('start: "a" ~ 1000000000 | "b"\n')
    assert accepts(g, "b") and not accepts(g, "a")
    g = gc.compile_ebnf('root ::= "q"{3000000} | "r"\n')
    assert accepts(g, "r") and not accepts(g, "qq")
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize("max_items", [2, 30_000])
def test_bounded_arrays_of_recursive_items_compile_in_linear_time(gc, max_items):
    """A `{lo,hi}` repeat over a recursive rule is a chain of optional rules, not one
    alternative per count (quadratic: minutes at 30,000)."""
    node = {
        "type": "object",
        "properties": {"k": {"type": "array", "items": {"$ref": "#"}, "maxItems": max_items}},
        "additionalProperties": False,
    }
    start = time.perf_counter()
    g = gc.compile_json_schema(node)
    assert time.perf_counter() - start < 3.0
    assert accepts(g, '{"k":[{},{"k":[{}]}]}')
    assert accepts(g, '{"k":[{},{},{}]}') == (max_items >= 3)


def test_recursive_lowering_checks_the_deadline(tok):
    node = {
        "type": "object",
        "properties": {"k": {"type": "array", "items": {"$ref": "#"}, "maxItems": 10**8}},
    }
    exc, took = timed(lambda: GrammarCompiler(tok, compile_timeout=0.5).compile_json_schema(node))
    assert "grammar_compile_timeout" in str(exc) and took < 3.0


# ---- Lark %import confinement --------------------------------------------------------------
SECRET = "TOPSECRET-7f3a"


@pytest.fixture
def secret_dir(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "secret.lark").write_text(f'X: "{SECRET}"\n')
    (tmp_path / "secret.lark").write_text(f'X: "{SECRET}"\n')
    monkeypatch.chdir(tmp_path)
    return sub


@pytest.mark.parametrize(
    "text,message",
    [
        ("%import .sub.secret (X)\nstart: X\n", "relative %import is not allowed"),
        ("%import .secret (X)\nstart: X\n", "relative %import is not allowed"),
        ("%import sub.secret (X)\nstart: X\n", "no such grammar"),
        ("%import secret.X\nstart: X\n", "no such grammar"),
        ("%import nosuch.thing (X)\nstart: X\n", "no such grammar"),
    ],
)
def test_lark_imports_outside_the_allowed_places_are_refused(tok, secret_dir, text, message):
    gc = GrammarCompiler(tok)
    with pytest.raises(ValueError, match=message) as info:
        gc.compile_lark(text)
    assert SECRET not in str(info.value)
    assert "common, lark, python, unicode" in str(info.value) or "relative" in message


def test_lark_imports_bundled_and_configured_grammars(tok, secret_dir):
    g = GrammarCompiler(tok).compile_lark("%import common.INT\nstart: INT\n")
    assert accepts(g, "42") and not accepts(g, "4a")
    gc = GrammarCompiler(tok, import_paths=[str(secret_dir)])
    assert accepts(gc.compile_lark("%import secret (X)\nstart: X\n"), SECRET)
    with pytest.raises(ValueError, match="relative %import"):
        gc.compile_lark("%import .secret (X)\nstart: X\n")


def test_backend_import_paths_knob(tok, secret_dir):
    backend = GrammarService(tok, len(tok), {tok.eos_token_id}, 5.0, import_paths=str(secret_dir))
    try:
        params = SamplingParams(lark="%import secret (X)\nstart: X\n")
        assert accepts(backend.submit(params).result(), SECRET)
    finally:
        backend.shutdown()


# ---- the compile pool ----------------------------------------------------------------------
def test_busy_pool_still_answers_cached_and_small_grammars_quickly(tok):
    backend = GrammarService(tok, len(tok), {tok.eos_token_id}, 3.0, workers=4)
    try:
        cached = SamplingParams(json_schema={"type": "integer", "maximum": 99})
        first = backend.submit(cached).result()
        slow = [
            SamplingParams(
                json_schema={"type": "string", "pattern": f"^{SLOW_REGEX}x{i}$", "maxLength": 50}
            )
            for i in range(3)
        ]
        running = [backend.submit(p) for p in slow]
        assert backend.submit(slow[0]) is running[0]  # one compilation per grammar

        start = time.perf_counter()
        hit = backend.submit(SamplingParams(json_schema=json.dumps(cached.json_schema)))
        assert hit.done() and hit.result() is first  # no wait behind the slow ones
        small = backend.submit(SamplingParams(regex="[0-9]{1,3}-[a-z]+")).result(timeout=10)
        assert time.perf_counter() - start < 1.5
        assert accepts(small, "12-ab")
        assert not all(f.done() for f in running)

        for f in running:
            with pytest.raises(ValueError, match="grammar_compile_timeout"):
                f.result(timeout=30)
        bad = backend.submit(SamplingParams(json_schema='{"minimum": Infinity}'))
        with pytest.raises(ValueError, match="invalid json_schema: #: minimum must be"):
            bad.result(timeout=10)
    finally:
        backend.shutdown()
