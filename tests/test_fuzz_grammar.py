"""Fuzzing the grammar compiler with random regexes and random small JSON Schemas.

Properties, for every generated source:
- compiling it answers within the compile time limit plus slack, either with a grammar or with
  a clean error: `ValueError` (bad or unsupported source) or `CompileTimeout` (the documented
  error past `compile_timeout`); never another exception type, never a hang;
- a regex grammar accepts exactly what `re.fullmatch` accepts, on strings drawn from the regex
  itself (`hypothesis.strategies.from_regex`) and on random strings, and its mask agrees with
  `accept` at every step;
- a JSON Schema grammar never gets stuck (a live matcher always allows some token) and every
  instance a random walk through its masks produces is JSON that validates with `jsonschema`;
- `not`, `if`/`then`/`else` and `allOf` merges accept exactly what `jsonschema` finds valid.

Runs are derandomized (`derandomize=True`, no example database), so CI sees the same examples
on every run; failures print the minimal source.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from tiny_models import tiny_tokenizer

from radixflow.grammars import (
    CompileTimeout,
    GrammarCompiler,
    GrammarLimits,
    allocate_token_bitmask,
)

COMPILE_TIMEOUT = 1.0  # seconds, the compiler's own limit
SLACK = 4.0  # a loaded CI machine (2 cores, shared) may overrun the limit by this much
WALK_BOUND = 20.0  # seconds for all the matcher walks of one example


@pytest.fixture(scope="module")
def compiler():
    tok = tiny_tokenizer()
    return tok, GrammarCompiler(tok, compile_timeout=COMPILE_TIMEOUT)


def bounded(fn, bound: float, what: str):
    """fn() in a daemon thread; its result, its exception re-raised, or a failure past `bound`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound)
    if t.is_alive():
        pytest.fail(f"{what} still running after {bound:.1f}s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - start


def tally(what: str) -> None:
    """Count an outcome in hypothesis' statistics (--hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


def compile_clean(what: str, build):
    """The compiled grammar, or None when compilation refused cleanly; fails otherwise."""
    try:
        grammar, took = bounded(build, COMPILE_TIMEOUT + SLACK, f"compiling {what}")
    except (ValueError, CompileTimeout) as exc:
        tally(f"refused: {type(exc).__name__}")
        return None
    except Exception as exc:
        pytest.fail(f"compiling {what} raised {type(exc).__name__}: {exc}")
    assert took <= COMPILE_TIMEOUT + SLACK, f"compiling {what} took {took:.1f}s"
    tally("compiled")
    return grammar


def allowed(matcher, row, vocab_size: int) -> np.ndarray:
    matcher.fill_mask(row)
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return bits.astype(bool)


def grammar_accepts(tok, grammar, text: str, check_masks: bool) -> bool:
    """Walk the matcher over text's tokens then EOS; with check_masks, the mask must agree with
    accept() at every step."""
    m = grammar.matcher()
    vocab = grammar.index.vocab_size
    row = allocate_token_bitmask(1, vocab)[0]
    for t in [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]:
        in_mask = bool(allowed(m, row, vocab)[t]) if check_masks else None
        ok = m.accept(t)
        if check_masks:
            assert in_mask == ok, f"mask says {in_mask}, accept says {ok} for token {t}"
        if not ok:
            return False
    return m.is_terminated()


# -- regexes --------------------------------------------------------------------------------
ALPHABET = "abc01 -."
ATOMS = st.one_of(
    st.sampled_from(list("abc01 ")),
    st.sampled_from([r"\.", r"\-", r"\d", r"\w", r"\s", r"\D", r"\W", ".", r"\n", "é"]),
    st.sampled_from(["[abc]", "[a-c]", "[^ab]", "[0-9]", r"[a\d]", "[^a-z]", "[.]", "[ -]"]),
    st.sampled_from(
        [r"[\w-]", r"[^\W\d]", r"\x41", r"\u00e9", "[é-ü]", "[日-本]", r"[\s\S]", "[]a]"]
    ),
    # not regular or rarely supported: compiled exactly or refused with ValueError
    st.sampled_from(["(a)\\1", "(?=a)a", "(?!b)[ab]", "(?<=a)b", "(?i:ab)", "(?s:.)", "\\b"]),
)
SMALL_COUNT = st.integers(0, 5)
BIG_COUNT = st.sampled_from([40, 200, 1000, 100000])


@st.composite
def quantifiers(draw) -> str:
    kind = draw(st.sampled_from(["*", "+", "?", "{m}", "{m,n}", "{m,}", "lazy", "{m,n}big"]))
    if kind == "lazy":
        return draw(st.sampled_from(["*?", "+?", "??"]))
    if kind == "{m,n}big":
        # occasionally big counts: compile must still answer within its limit
        m = draw(st.integers(0, 3))
        return f"{{{m},{draw(BIG_COUNT)}}}"
    m = draw(SMALL_COUNT)
    if kind == "{m}":
        return f"{{{m}}}"
    if kind == "{m,}":
        return f"{{{m},}}"
    if kind == "{m,n}":
        return f"{{{m},{m + draw(SMALL_COUNT)}}}"
    return kind


def _extend(children):
    def group(inner: str, open_: str) -> str:
        return f"{open_}{inner})"

    return st.one_of(
        st.lists(children, min_size=2, max_size=4).map("".join),  # concatenation
        st.lists(children, min_size=2, max_size=3).map("|".join),  # alternation
        st.tuples(children, st.sampled_from(["(", "(?:"])).map(lambda p: group(*p)),
        st.tuples(children, st.sampled_from(["(", "(?:"]), quantifiers()).map(
            lambda p: group(p[0], p[1]) + p[2]
        ),
        st.tuples(ATOMS, quantifiers()).map("".join),
    )


REGEXES = st.recursive(ATOMS, _extend, max_leaves=12)


def _is_valid_python_regex(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


@pytest.mark.slow
@settings(max_examples=300)
@given(pattern=REGEXES, data=st.data())
def test_random_regexes_compile_cleanly_and_agree_with_re(compiler, pattern, data):
    tok, gc = compiler
    grammar = compile_clean(f"regex {pattern!r}", lambda: gc.compile_regex(pattern))
    if grammar is None:
        return  # a clean refusal (unsupported, too big, past the time limit)
    assert _is_valid_python_regex(pattern)
    rx = re.compile(pattern)
    samples = [data.draw(st.from_regex(rx, fullmatch=True), label="from_regex") for _ in range(3)]
    samples += data.draw(
        st.lists(st.text(ALPHABET + "\né", max_size=10), min_size=3, max_size=6), label="random"
    )

    def walk() -> list[tuple[str, bool, bool]]:
        return [
            (s, grammar_accepts(tok, grammar, s, check_masks=len(s) <= 40), bool(rx.fullmatch(s)))
            for s in samples
        ]

    results, _ = bounded(walk, WALK_BOUND, f"matcher walks of regex {pattern!r}")
    for s, ours, theirs in results:
        assert ours == theirs, f"regex {pattern!r} on {s!r}: grammar {ours}, re.fullmatch {theirs}"


@pytest.mark.parametrize(
    "pattern",
    [
        "((a{0,40}){0,40}){0,40}",
        "a{1000000}",
        "(a|aa)*b{0,1000}",
        "((a*)*)*b",
        r"(\w{0,60}){0,60}",
        "(?:[ab]{2,30}){5,40}c",
        "[^a]{100000}",
    ],
)
def test_pathological_regexes_answer_in_time(compiler, pattern):
    tok, gc = compiler
    start = time.monotonic()
    grammar = compile_clean(f"regex {pattern!r}", lambda: gc.compile_regex(pattern))
    assert time.monotonic() - start <= COMPILE_TIMEOUT + SLACK
    if grammar is not None:
        bounded(lambda: grammar_accepts(tok, grammar, "a", False), WALK_BOUND, "a walk")


def test_invalid_regexes_are_value_errors(compiler):
    _, gc = compiler
    for pattern in ["(", "a{2,1}", "[b-a]", "*a", "(?P<x>a)(?P<x>b)", "a)", "\\", "[]"]:
        with pytest.raises(ValueError):
            compile_clean_raw(gc, pattern)


def compile_clean_raw(gc, pattern):
    """Compile with the time bound; lets ValueError through (for pytest.raises)."""
    try:
        return bounded(lambda: gc.compile_regex(pattern), COMPILE_TIMEOUT + SLACK, pattern)[0]
    except ValueError:
        raise
    except Exception as exc:
        pytest.fail(f"compiling regex {pattern!r} raised {type(exc).__name__}: {exc}")


# -- JSON Schemas ---------------------------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "id", "name", "x y", 'q"', "é"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.sampled_from([0.5, -2.25, 1e3]),
    st.text('ab"\\é ', max_size=4),
)
BOUNDS = st.one_of(st.integers(-50, 50), st.sampled_from([0, 2**31, 2**53 - 1, -(2**53) + 1]))


@st.composite
def integer_schemas(draw) -> dict:
    schema: dict[str, Any] = {"type": "integer"}
    lo = draw(st.none() | BOUNDS)
    hi = draw(st.none() | BOUNDS)
    if lo is not None:
        schema[draw(st.sampled_from(["minimum", "exclusiveMinimum"]))] = lo
    if hi is not None:
        schema[draw(st.sampled_from(["maximum", "exclusiveMaximum"]))] = hi
    return schema


@st.composite
def number_schemas(draw) -> dict:
    schema: dict[str, Any] = {"type": "number"}
    bound = st.one_of(st.integers(-20, 40), st.sampled_from([0.5, -1.25, 1e-3]))
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["minimum", "exclusiveMinimum"]))] = draw(bound)
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["maximum", "exclusiveMaximum"]))] = draw(bound)
    if draw(st.integers(0, 5)) == 0:
        schema["multipleOf"] = draw(st.sampled_from([1, 2, 0.5, 3]))
    return schema


@st.composite
def string_schemas(draw) -> dict:
    schema: dict[str, Any] = {"type": "string"}
    lo = draw(st.none() | st.integers(0, 4))
    if lo is not None:
        schema["minLength"] = lo
    hi = draw(st.none() | st.integers(0, 8))
    if hi is not None:
        schema["maxLength"] = hi
    if draw(st.integers(0, 4)) == 0:
        schema["pattern"] = draw(st.sampled_from(["^[a-c]+$", "^x", "[0-9]{2}", "^(ab|cd)*$"]))
    if draw(st.integers(0, 5)) == 0:
        schema["format"] = draw(st.sampled_from(["date", "email", "uuid", "date-time", "ipv4"]))
    return schema


LEAF_SCHEMAS = st.one_of(
    st.just({}),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["integer", "null"]}]),
    integer_schemas(),
    number_schemas(),
    string_schemas(),
    st.lists(SCALARS, min_size=1, max_size=4).map(lambda v: {"enum": v}),
    SCALARS.map(lambda v: {"const": v}),
)


@st.composite
def object_schemas(draw, children) -> dict:
    names = draw(st.lists(NAMES, max_size=3, unique=True))
    props = {n: draw(children) for n in names}
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if names:
        schema["required"] = draw(st.lists(st.sampled_from(names), unique=True))
    extra = draw(st.sampled_from([None, False, True, "schema"]))
    if extra == "schema":
        schema["additionalProperties"] = draw(children)
    elif extra is not None:
        schema["additionalProperties"] = extra
    if draw(st.integers(0, 3)) == 0:  # allOf parts with patterns merge where they can
        patterns = draw(
            st.lists(st.sampled_from(["^a", "b$", "^x-", "é"]), max_size=2, unique=True)
        )
        schema["patternProperties"] = {p: draw(children) for p in patterns}
    if draw(st.integers(0, 4)) == 0:
        schema["minProperties"] = draw(st.integers(0, 2))
    if draw(st.integers(0, 4)) == 0:
        schema["maxProperties"] = draw(st.integers(0, 3))
    return schema


@st.composite
def array_schemas(draw, children) -> dict:
    schema: dict[str, Any] = {"type": "array", "items": draw(children)}
    lo = draw(st.none() | st.integers(0, 3))
    if lo is not None:
        schema["minItems"] = lo
    hi = draw(st.none() | st.integers(0, 4))
    if hi is not None:
        schema["maxItems"] = hi
    if draw(st.integers(0, 4)) == 0:
        schema["prefixItems"] = draw(st.lists(children, min_size=1, max_size=2))
    if draw(st.integers(0, 12)) == 0:
        schema["uniqueItems"] = True  # exact for enumerable items, else a clean ValueError
    return schema


def _schema_extend(children):
    return st.one_of(
        object_schemas(children),
        array_schemas(children),
        st.lists(children, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs}),
        st.lists(children, min_size=1, max_size=2).map(lambda bs: {"oneOf": bs}),
        st.lists(children, min_size=1, max_size=2).map(lambda bs: {"allOf": bs}),
    )


NOT_SCHEMAS = st.one_of(
    st.sampled_from(["integer", "string", "null", "boolean", "array"]).map(lambda t: {"type": t}),
    st.lists(st.text("ab", max_size=2) | st.booleans() | st.none(), min_size=1, max_size=2).map(
        lambda v: {"enum": v}
    ),
)
WITH_NOT = st.tuples(LEAF_SCHEMAS, NOT_SCHEMAS).map(lambda p: {**p[0], "not": p[1]})


SCHEMAS = st.recursive(
    st.one_of(LEAF_SCHEMAS, LEAF_SCHEMAS, LEAF_SCHEMAS, WITH_NOT), _schema_extend, max_leaves=6
)
CLOSERS = {'"', "}", "]", ",", "0", "1", "true", "null", "false"}


def walk_instance(tok, grammar, seed: int, max_tokens: int = 400) -> str | None:
    """A random walk through the grammar's masks, biased toward short instances; the text
    once EOS is accepted, None when it did not end within max_tokens."""
    m = grammar.matcher()
    rng = random.Random(seed)
    vocab = grammar.index.vocab_size
    row = allocate_token_bitmask(1, vocab)[0]
    pieces = [tok.decode([i]) for i in range(len(tok))]
    out: list[int] = []
    for _ in range(max_tokens):
        ids = np.flatnonzero(allowed(m, row, vocab)).tolist()
        assert ids, f"the matcher is stuck after {tok.decode(out)!r}: no token allowed"
        closers = [i for i in ids if i < len(pieces) and pieces[i] in CLOSERS]
        if tok.eos_token_id in ids and rng.random() < 0.6:
            t = tok.eos_token_id
        elif closers and rng.random() < 0.5:
            t = rng.choice(closers)
        else:
            t = rng.choice(ids)
        assert m.accept(t), f"token {t} was in the mask but not accepted"
        if t == tok.eos_token_id:
            return tok.decode(out)
        out.append(t)
    return None


PROBES = [0, 1, -1, 0.5, 1e3, "", "a", "ab", None, True, False, [], [1], {}, {"a": "a"}]


def probe_values(schema) -> list:
    """Fixed probe instances plus every const/enum value the schema names."""
    found = list(PROBES)

    def visit(node) -> None:
        if isinstance(node, dict):
            if "const" in node:
                found.append(node["const"])
            if isinstance(node.get("enum"), list):
                found.extend(node["enum"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return found


@pytest.mark.slow
@settings(max_examples=200)
@given(schema=SCHEMAS, seeds=st.lists(st.integers(0, 2**32), min_size=2, max_size=3))
@example(schema={"oneOf": [{"const": 0.5}, {"type": "number"}]}, seeds=[0, 1])
def test_random_schemas_compile_cleanly_and_walks_validate(compiler, schema, seeds):
    """Sound grammars: whatever the grammar accepts (random walks through its masks, and probe
    instances written compactly) validates with jsonschema."""
    tok, gc = compiler
    what = f"schema {json.dumps(schema)}"
    grammar = compile_clean(what, lambda: gc.compile_json_schema(schema))
    if grammar is None:
        return
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )

    def walks() -> list[str | None]:
        return [walk_instance(tok, grammar, s) for s in seeds]

    def probes() -> list[str]:
        texts = [
            json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in probe_values(schema)
        ]
        return [t for t in texts if grammar_accepts(tok, grammar, t, check_masks=False)]

    texts, _ = bounded(walks, WALK_BOUND, f"random walks of {what}")
    accepted, _ = bounded(probes, WALK_BOUND, f"probes of {what}")
    for text in texts + accepted:
        tally("walk ended" if text is not None else "walk too long")
        if text is None:
            continue
        try:
            instance = json.loads(text)
        except json.JSONDecodeError as exc:
            pytest.fail(f"{what}: the grammar accepted non-JSON {text!r} ({exc})")
        errors = [e.message for e in validator.iter_errors(instance)]
        assert not errors, f"{what}: the grammar accepted {text!r}, invalid: {errors}"


PART_LEAVES = st.sampled_from(
    [{}, {"type": "integer"}, {"type": "string"}, {"type": "null"}, False, {"minimum": 2}]
)


@st.composite
def pattern_objects(draw) -> dict:
    """An object schema with declared names, patterns and additional properties, any of them
    left out: the parts of an `allOf` that must merge exactly or be refused."""
    schema: dict[str, Any] = {"type": "object"}
    names = draw(st.lists(st.sampled_from(["a", "ab", "q"]), max_size=2, unique=True))
    if names:
        schema["properties"] = {n: draw(PART_LEAVES) for n in names}
    patterns = draw(st.lists(st.sampled_from(["^a", "b$", "^x-"]), max_size=2, unique=True))
    if patterns:
        schema["patternProperties"] = {p: draw(PART_LEAVES) for p in patterns}
    extra = draw(st.sampled_from([None, False, {}, {"type": "integer"}]))
    if extra is not None:
        schema["additionalProperties"] = extra
    return schema


@settings(max_examples=150)
@given(parts=st.lists(pattern_objects(), min_size=2, max_size=3))
def test_all_of_parts_with_patterns_merge_exactly_or_are_refused(compiler, parts):
    """`allOf` over objects with properties, patternProperties and additionalProperties: the
    merged grammar accepts a one-property object exactly when jsonschema finds it valid (each
    name against each part's properties, patterns and additional properties), or the compile
    is refused with a clear error."""
    tok, gc = compiler
    schema = {"allOf": parts}
    what = f"schema {json.dumps(schema)}"
    grammar = compile_clean(what, lambda: gc.compile_json_schema(schema))
    if grammar is None:
        return
    validator = jsonschema.Draft202012Validator(schema)
    for name in ["a", "ab", "q", "x-b", "b", "zz"]:
        for value in [1, 3, "s", None]:
            text = json.dumps({name: value}, separators=(",", ":"))
            expected = validator.is_valid({name: value})
            assert grammar_accepts(tok, grammar, text, check_masks=False) == expected, (what, text)


NEGATION_LEAVES = st.sampled_from(
    [
        {"type": "string"}, {"type": "integer"}, {"type": "object"}, {"type": "null"},
        {"minimum": 1}, {"maximum": 2}, {"maxLength": 1}, {"minLength": 2}, {"minItems": 1},
        {"maxProperties": 1}, {"pattern": "^a"}, {"pattern": "^$|^a+$"}, {"pattern": "(^|x)b"},
        {"enum": [1, "a", None]}, {"const": "b"}, {"required": ["a"]}, {"required": ["a", "b"]},
        {"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"enum": ["a", 2]}}},
    ]
)  # fmt: skip
NEGATION_VALUES = [None, True, 0, 1, 3, "", "a", "b", "ab", "xb", "aa", [], [1], {}, {"a": 1},
                   {"a": "a"}, {"b": 2}, {"a": 1, "b": "a"}, {"b": 2, "a": "s"}]  # fmt: skip


def negation_schemas():
    """Small schemas of `not`, `if`/`then`/`else`, `allOf` and `anyOf` over simple keywords."""
    return st.recursive(
        NEGATION_LEAVES,
        lambda inner: st.one_of(
            st.builds(lambda s: {"not": s}, inner),
            st.builds(lambda a, b, c: {"if": a, "then": b, "else": c}, inner, inner, inner),
            st.builds(lambda a, b: {"allOf": [a, b]}, inner, inner),
            st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
            st.builds(lambda a, b: {**a, **b}, NEGATION_LEAVES, inner),
        ),
        max_leaves=5,
    )


@pytest.fixture(scope="module")
def any_order_compiler():
    tok = tiny_tokenizer()
    limits = GrammarLimits(json_key_order="any")
    return tok, GrammarCompiler(tok, compile_timeout=COMPILE_TIMEOUT, limits=limits)


@settings(max_examples=200)
@given(schema=negation_schemas())
def test_negations_and_conditions_agree_with_jsonschema(any_order_compiler, schema):
    """A compiled `not` or `if`/`then`/`else` (nested, beside other keywords and branches)
    accepts exactly what jsonschema finds valid, members in any order; or it is refused."""
    tok, gc = any_order_compiler
    what = f"schema {json.dumps(schema)}"
    grammar = compile_clean(what, lambda: gc.compile_json_schema(schema))
    if grammar is None:
        return
    validator = jsonschema.Draft202012Validator(schema)
    for value in NEGATION_VALUES:
        text = json.dumps(value, separators=(",", ":"))
        expected = validator.is_valid(value)
        assert grammar_accepts(tok, grammar, text, check_masks=False) == expected, (what, text)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
        {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
        {"type": "number", "minimum": -(10**15), "maximum": 10**15},
        {"type": "string", "maxLength": 100000},
        {"type": "array", "items": {"type": "array", "items": {"type": "string"}}, "maxItems": 500},
        {"type": "integer", "minimum": 1e308},
        {"type": "integer", "maximum": float("inf")},
    ],
)
def test_pathological_schemas_answer_in_time(compiler, schema):
    tok, gc = compiler
    grammar = compile_clean(f"schema {schema}", lambda: gc.compile_json_schema(schema))
    if grammar is not None:
        bounded(lambda: walk_instance(tok, grammar, 0, 50), WALK_BOUND, "a walk")


@pytest.mark.parametrize(
    "grammar",
    [
        'start: x\nx: "a" | "b" | x x | x x x | x x x x',
        'start: x\nx: x x | x | "a" | ""',
        'start: e\ne: e "+" e | e "*" e | "(" e ")" | /[0-9]+/',
    ],
)
def test_ambiguous_lark_grammars_answer_in_time(compiler, grammar):
    """Highly ambiguous grammars compile (or refuse) in time and walks through their masks
    stay bounded."""
    tok, gc = compiler
    compiled = compile_clean(f"lark {grammar!r}", lambda: gc.compile_lark(grammar))
    if compiled is not None:
        for seed in range(3):
            bounded(lambda s=seed: walk_instance(tok, compiled, s, 60), WALK_BOUND, "a walk")
