"""Number keywords (bounds, exclusive bounds, multipleOf): regexes and automata against arithmetic."""

import json
import random
import re
from decimal import Decimal
from fractions import Fraction

import jsonschema
import pytest
from automaton_walk import accepts as automaton_accepts
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.json_schema_numbers import (
    MAX_MULTIPLE_NODES,
    int_range_regex,
    integer_ir,
    number_ir,
    number_range_regex,
)

JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")  # no exponent: bounded form


def random_texts(rng: random.Random, digits: int, count: int) -> list[str]:
    """Number-like strings: valid JSON numbers and near misses (leading zeros, -0, bare '.')."""
    out = []
    for _ in range(count):
        whole = str(rng.randrange(10 ** rng.randint(1, digits)))
        if rng.random() < 0.05:
            whole = "0" + whole
        frac = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 0, 1, 2, 3, 5])))
        text = ("-" if rng.random() < 0.4 else "") + whole + ("." + frac if frac else "")
        out.append(text + "." if rng.random() < 0.02 else text)
    return out


def in_range(value: Decimal, lo, lo_x: bool, hi, hi_x: bool) -> bool:
    return (lo is None or (value > lo if lo_x else value >= lo)) and (
        hi is None or (value < hi if hi_x else value <= hi)
    )


# ---- integer ranges -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lo,hi",
    [
        (None, 9223372036854776000),
        (-9223372036854775808, None),
        (-9223372036854775808, 9223372036854775807),
        (0, 18446744073709551615),
        (-99999999999999999999, -10000000000000000000),
    ],
)
def test_twenty_digit_integer_ranges_are_small_and_exact(lo, hi):
    pattern = int_range_regex(lo, hi)
    assert len(pattern) < 20_000
    rx = re.compile(pattern)
    rng = random.Random(3)
    edges = [b + d for b in (lo, hi, 0, 10**19, -(10**19)) if b is not None for d in (-1, 0, 1)]
    for v in edges + [rng.randrange(-(10**21), 10**21) for _ in range(3000)]:
        assert bool(rx.fullmatch(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi))
    for text in ("-0", "00", "01", "-01", "+1", "1.0", ""):
        assert not rx.fullmatch(text)


def test_integer_schema_bounds_all_drafts():
    cases = [
        ({"minimum": 2.5, "maximum": 7.0}, 3, 7),
        ({"exclusiveMinimum": 2, "exclusiveMaximum": 7}, 3, 6),
        ({"minimum": 2, "exclusiveMinimum": True, "maximum": 7, "exclusiveMaximum": True}, 3, 6),
        ({"exclusiveMinimum": -2.5, "maximum": -0.5}, -2, -1),
        ({"minimum": 1e-300, "maximum": 3.6893488147419103e19}, 1, 36893488147419103000),
    ]
    for schema, lo, hi in cases:
        auto = RegexAutomaton(integer_ir({"type": "integer", **schema}, "#"))
        for v in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0):
            assert automaton_accepts(auto, str(v)) == (lo <= v <= hi), (schema, v)


# ---- decimal bounds on numbers --------------------------------------------------------------
def _random_bound(rng: random.Random) -> Decimal:
    whole = rng.choice([0, 0, 1, 2, 9, 10, 99, 123, 10**19 + 7])
    frac = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 1, 2, 4])))
    return Decimal(f"{rng.choice(['', '-'])}{whole}.{frac or '0'}")


def test_decimal_bounds_are_sound_and_exact():
    rng = random.Random(7)
    for _ in range(400):
        lo, hi = _random_bound(rng), _random_bound(rng)
        lo, hi = (lo, hi) if lo <= hi else (hi, lo)
        lo = None if rng.random() < 0.15 else lo
        hi = None if rng.random() < 0.15 else hi
        lo_x, hi_x = rng.random() < 0.5, rng.random() < 0.5
        rx = re.compile(number_range_regex(lo, lo_x, hi, hi_x))
        texts = random_texts(rng, 3, 150)
        for b in (lo, hi):
            if b is not None:
                step = Decimal(10) ** (b.as_tuple().exponent - 1)
                texts += [str(b), str(b + step), str(b - step), str(b) + "0", str(-b)]
        for text in texts:
            want = bool(JSON_NUMBER.fullmatch(text)) and in_range(Decimal(text), lo, lo_x, hi, hi_x)
            assert bool(rx.fullmatch(text)) == want, (lo, lo_x, hi, hi_x, text)
        for _ in range(30):  # in-range floats in their shortest form
            a = float(lo if lo is not None else -1e6)
            b = float(hi if hi is not None else 1e6)
            text = repr(rng.uniform(a, b))
            if "e" not in text and in_range(Decimal(text), lo, lo_x, hi, hi_x):
                assert rx.fullmatch(text), (lo, lo_x, hi, hi_x, text)


@pytest.mark.parametrize(
    "lo,lo_x,hi,hi_x,exponent_sign",
    [
        (0, False, None, False, "+"),
        (0, True, None, False, "+"),
        (None, False, 0, True, "-"),
        (-5, False, 0, False, None),
    ],
)
def test_sign_bounds_keep_exponents(lo, lo_x, hi, hi_x, exponent_sign):
    rx = re.compile(number_range_regex(lo, lo_x, hi, hi_x))
    with_exponent = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
    texts = ["1e-06", "0e5", "0.0E+3", "-1e-06", "-0e1", "2.5e3", "-2.5E3", "0.00e-1", "1e", "01e2"]
    for text in texts + random_texts(random.Random(5), 3, 300):
        sign = "-" if text.startswith("-") else "+"
        syntax = with_exponent if sign == exponent_sign else JSON_NUMBER
        want = bool(syntax.fullmatch(text)) and in_range(Decimal(text), lo, lo_x, hi, hi_x)
        assert bool(rx.fullmatch(text)) == want, (lo, lo_x, hi, hi_x, text)


def test_number_schema_with_fractional_bounds_compiles_and_validates():
    gc = GrammarCompiler(tiny_tokenizer(), compile_timeout=5.0)
    schema = {"type": "number", "minimum": 0.5, "maximum": 2}
    g = gc.compile_json_schema(schema)
    for text in ("0.5", "0.50", "1", "1.999", "2", "2.0", "0.49", "2.0001", "-1", "0.05", "1e0"):
        ok = automaton_accepts(g.automaton, text)
        valid = "e" not in text and 0.5 <= float(text) <= 2
        assert ok == valid, text
        if ok:
            jsonschema.validate(json.loads(text), schema)


# ---- multipleOf -----------------------------------------------------------------------------
MULTIPLE_CASES = [
    # (schema, how many digits random texts get)
    ({"type": "integer", "multipleOf": 7, "minimum": -500, "maximum": 2000}, 4),
    ({"type": "integer", "multipleOf": 12, "minimum": 0, "maximum": 10**18}, 4),
    ({"type": "integer", "multipleOf": 256}, 6),
    ({"type": "integer", "multipleOf": 4, "exclusiveMinimum": 10}, 4),
    ({"type": "integer", "multipleOf": 2.5, "maximum": 1000}, 4),
    ({"type": "integer", "multipleOf": 0.5, "minimum": -3, "maximum": 3}, 2),
    ({"type": "number", "multipleOf": 0.01}, 3),
    ({"type": "number", "multipleOf": 0.25, "minimum": -10, "exclusiveMaximum": 7.5}, 2),
    ({"type": "number", "multipleOf": 1.0, "minimum": 0.5}, 3),
    ({"type": "number", "multipleOf": 1.5, "minimum": -100, "maximum": 100.5}, 3),
    ({"type": "number", "multipleOf": 0.1, "exclusiveMinimum": 0.05, "maximum": 99.95}, 3),
    ({"type": "number", "multipleOf": 20, "minimum": 0.001}, 4),
    ({"type": "integer", "multipleOf": 3}, 5),
    ({"type": "integer", "multipleOf": 60, "minimum": -1234}, 5),
    ({"type": "number", "multipleOf": 1.5}, 3),
    ({"type": "number", "multipleOf": 0.03, "exclusiveMaximum": 2.5}, 3),
]


@pytest.mark.parametrize("schema,digits", MULTIPLE_CASES)
def test_multiple_of_matches_arithmetic(schema, digits):
    build = integer_ir if schema["type"] == "integer" else number_ir
    auto = RegexAutomaton(build(schema, "#"))
    step = Fraction(Decimal(repr(schema["multipleOf"])))
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    lo_x, hi_x = "exclusiveMinimum" in schema, "exclusiveMaximum" in schema
    lo = None if lo is None else Fraction(Decimal(repr(lo)))
    hi = None if hi is None else Fraction(Decimal(repr(hi)))
    syntax = re.compile(r"-?(0|[1-9][0-9]*)") if schema["type"] == "integer" else JSON_NUMBER
    rng = random.Random(11)
    texts = random_texts(rng, digits, 3000)
    multiples = [Decimal(repr(schema["multipleOf"])) * n for n in range(-40, 41)]
    texts += [format(m, "f") for m in multiples] + [str(int(m)) for m in multiples if m % 1 == 0]
    texts += [repr(float(m)) for m in multiples]
    accepted = 0
    for text in texts:
        value = Fraction(Decimal(text)) if syntax.fullmatch(text) else None
        want = (
            value is not None
            and value % step == 0
            and in_range(value, lo, lo_x, hi, hi_x)
            and not (schema["type"] == "integer" and text == "-0")  # -0: never for integers
        )
        assert automaton_accepts(auto, text) == want, (schema, text)
        accepted += want
    assert accepted > 20


def test_random_multiples_and_bounds_match_arithmetic():
    rng = random.Random(13)
    steps = [2, 3, 4, 6, 12, 25, 7, 0.5, 0.2, 0.25, 0.05, 1.5, 0.3, 0.07]
    checked = 0
    for _ in range(60):
        kind = rng.choice(["integer", "number"])
        schema = {"type": kind, "multipleOf": rng.choice(steps)}
        lo, hi = sorted(
            Decimal(rng.randrange(-3000, 3000)) / rng.choice([1, 10, 100]) for _ in "ab"
        )
        lo_x, hi_x = rng.random() < 0.5, rng.random() < 0.5
        if rng.random() < 0.8:
            schema["exclusiveMinimum" if lo_x else "minimum"] = float(lo)
        if rng.random() < 0.8:
            schema["exclusiveMaximum" if hi_x else "maximum"] = float(hi)
        build = integer_ir if kind == "integer" else number_ir
        unbounded = "minimum" not in schema and "exclusiveMinimum" not in schema
        unbounded |= "maximum" not in schema and "exclusiveMaximum" not in schema
        if unbounded and schema["multipleOf"] in (7, 0.07):  # factor 7 > MAX_CYCLE
            with pytest.raises(ValueError, match="multipleOf.*MAX_CYCLE"):
                build(schema, "#")
            continue
        auto = RegexAutomaton(build(schema, "#"))
        step = Fraction(Decimal(repr(schema["multipleOf"])))
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        low = None if low is None else Fraction(Decimal(repr(low)))
        high = None if high is None else Fraction(Decimal(repr(high)))
        syntax = re.compile(r"-?(0|[1-9][0-9]*)") if kind == "integer" else JSON_NUMBER
        exact = Decimal(repr(schema["multipleOf"]))
        texts = random_texts(rng, 4, 300) + [format(exact * n, "f") for n in range(-30, 30)]
        for text in texts:
            value = Fraction(Decimal(text)) if syntax.fullmatch(text) else None
            want = (
                value is not None
                and value % step == 0
                and in_range(value, low, lo_x, high, hi_x)
                and not (kind == "integer" and text == "-0")
            )
            assert automaton_accepts(auto, text) == want, (schema, text)
        checked += 1
    assert checked > 40


@pytest.mark.parametrize(
    "schema,message",
    [
        ({"type": "integer", "multipleOf": 7}, "multipleOf 7.*MAX_CYCLE.*give both bounds"),
        ({"type": "number", "multipleOf": 0.7, "minimum": 0}, "multipleOf 0.7.*MAX_CYCLE"),
        ({"type": "integer", "multipleOf": 7, "maximum": 10**39}, "MAX_CYCLE"),
        (
            {"type": "integer", "multipleOf": 987654321, "minimum": 0, "maximum": 10**30},
            f"multipleOf 987654321.*{MAX_MULTIPLE_NODES}",
        ),
        ({"type": "integer", "multipleOf": 7, "maximum": 10**50, "minimum": 0}, "MAX_MULTIPLE"),
        ({"type": "number", "minimum": 1e-45}, "MAX_FRACTION_DIGITS"),
    ],
)
def test_unsupported_multiples_raise_naming_the_keyword(schema, message):
    build = integer_ir if schema["type"] == "integer" else number_ir
    with pytest.raises(ValueError, match=message):
        build(schema, "#/x")


def test_multiple_of_schema_keyword_is_checked():
    gc = GrammarCompiler(tiny_tokenizer(), compile_timeout=5.0)
    for bad in (0, -2, "2", True):
        with pytest.raises(ValueError, match="multipleOf must be a positive finite number"):
            gc.compile_json_schema({"type": "integer", "multipleOf": bad})
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.01}}}
    g = gc.compile_json_schema(schema)
    for text in ('{"n":1.25}', '{"n":-0.5}', '{"n":3}', '{"n":1.255}', '{"n":0.001}'):
        valid = Decimal(json.loads(text, parse_float=Decimal)["n"]) % Decimal("0.01") == 0
        assert automaton_accepts(g.automaton, text) == valid, text
