"""JSON Schema coverage on the JSONSchemaBench failure classes (issue #15), checked against
`jsonschema`: names other than the declared ones, patternProperties classes, unknown formats,
keywords beside `$ref` by draft, recursive `$ref`s inside `allOf`, `oneOf` branches proven
exclusive (and overlapping ones still refused), one parser of schema sources.

Every instance is walked byte by byte through the compiled automaton; the verdict must be the
validator's (the draft its `$schema` names, 2020-12 otherwise).
"""

import json
import re

import jsonschema
import pytest
from test_grammar_refs import accepts as accepts_text
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.json_schema_names import MAX_PATTERN_CLASSES
from radixflow.grammars.peer_compiler import grammar_source


@pytest.fixture(scope="module")
def gc():
    return GrammarCompiler(tiny_tokenizer(), compile_timeout=10.0)


def accepts(grammar, value) -> bool:
    return accepts_text(grammar, json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def agree(gc, schema, values) -> None:
    """The grammar accepts exactly the values the schema's validator finds valid."""
    grammar = gc.compile_json_schema(schema)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = cls(schema, format_checker=cls.FORMAT_CHECKER)
    verdicts = [checker.is_valid(v) for v in values]
    assert any(verdicts) and not all(verdicts), "a test needs valid and invalid values"
    for value, valid in zip(values, verdicts, strict=True):
        assert accepts(grammar, value) == valid, value


# ---- names other than the declared ones ---------------------------------------------------
NAMES = ["a", "ab", "abc", "b", 'q"', "x\n", "é", "aé", "a/b"]


def test_extra_names_exclude_every_declared_name(gc):
    schema = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in NAMES},
        "additionalProperties": {"type": "integer"},
    }
    near = ["", "aa", "abcd", "ac", "q", 'q""', "x", "x\n\n", "e", "é1", "a/", "a\\b", "\u2028"]
    values = [{n: "s"} for n in NAMES] + [{n: 1} for n in NAMES]
    values += [{n: 1} for n in near] + [{n: "s"} for n in near]
    values += [{"a": "s", "zz": 2}, {"a": "s", "ab": 1}]
    agree(gc, schema, values)


def test_a_declared_name_written_with_an_escape_does_not_pass_as_extra(gc):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "/": {"type": "string"}},
        "additionalProperties": {"type": "integer"},
    }
    g = gc.compile_json_schema(schema)
    for text in ['{"\\u0061":1}', '{"\\/":1}', '{"\\u002f":1}']:
        assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert not accepts_text(g, text), text
    assert accepts_text(g, '{"a":"s","b":1}')


def test_closed_object_with_many_names(gc):
    names = [f"field_{i}" for i in range(60)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    values = [{"field_1": 1, "field_10": 2, "field_1x": 3}, {"field_1": "s"}, {"field_": []},
              {"field_1": 1, "field_59": 2}]  # fmt: skip
    agree(gc, {**schema, "additionalProperties": False}, values)
    agree(gc, {**schema, "additionalProperties": {"type": "array"}}, values)


# ---- patternProperties: only the classes some name has ------------------------------------
def test_many_disjoint_patterns_compile_as_one_class_each(gc):
    langs = ["en", "nl", "pt"]
    patterns = {f"^name{i}:(en|nl|pt)$": {"type": "string"} for i in range(24)}
    schema = {
        "type": "object",
        "properties": {"name0:en": {"const": "x"}, "id": {"type": "integer"}},
        "patternProperties": patterns,
        "additionalProperties": False,
    }
    values = [{"id": 1, f"name{i}:{lang}": "v"} for i in (0, 5, 23) for lang in langs]
    values += [{"name0:en": "x"}, {"name0:en": "y"}, {"name3:de": "v"}, {"name3:en": 1}]
    agree(gc, schema, values)


def test_overlapping_patterns_meet_in_their_own_class(gc):
    schema = {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 5}, "^c": False},
        "additionalProperties": {"type": "string"},
    }
    values = [{"ab": 7}, {"ab": 3}, {"ab": "s"}, {"a": 1}, {"b": 1}, {"b": "s"}, {"cb": 9},
              {"c": "s"}, {"x": "s"}, {"x": 1}, {"axb": 5.5}]  # fmt: skip
    agree(gc, schema, values)


def test_pattern_classes_are_bounded(gc):
    n = MAX_PATTERN_CLASSES.bit_length()  # every subset of these patterns meets
    schema = {"type": "object", "patternProperties": {chr(97 + i): {} for i in range(n)}}
    with pytest.raises(ValueError, match="MAX_PATTERN_CLASSES"):
        gc.compile_json_schema(schema)


# ---- formats ----------------------------------------------------------------------------
def test_unknown_formats_are_annotations_and_known_ones_hold(gc):
    schema = {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date"},
            "color": {"type": "string", "format": "color"},
            "cert": {"type": "string", "format": "certificate", "maxLength": 3},
        },
    }
    values = [{"when": "2024-02-29"}, {"when": "2023-02-29"}, {"color": "#fff"},
              {"color": "no color at all"}, {"cert": "abc"}, {"cert": "abcd"}]  # fmt: skip
    agree(gc, schema, values)
    merged = {"allOf": [{"type": "string", "format": "url"}, {"format": "date"}]}
    agree(gc, merged, ["2024-01-31", "2024-01-32", "http://x"])


# ---- keywords beside $ref -------------------------------------------------------------
REF_SIBLINGS = {
    "definitions": {"n": {"type": "integer"}},
    "type": "object",
    "properties": {"x": {"$ref": "#/definitions/n", "minimum": 5}},
}


@pytest.mark.parametrize(
    "dialect",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema#",
        None,
        "https://json-schema.org/draft/2020-12/schema",
    ],  # fmt: skip
)
def test_ref_siblings_apply_from_2019_09_on(gc, dialect):
    schema = dict(REF_SIBLINGS)
    if dialect is not None:
        schema["$schema"] = dialect
    values = [{"x": 1}, {"x": 7}, {"x": "s"}]
    grammar = gc.compile_json_schema(schema)
    old = dialect is None or "draft-0" in dialect  # no $schema with `definitions`: draft 7
    checker = (jsonschema.Draft7Validator if old else jsonschema.Draft202012Validator)(schema)
    for value in values:
        assert accepts(grammar, value) == checker.is_valid(value), value
    assert accepts(grammar, {"x": 1}) == old


# ---- recursive $ref inside allOf ---------------------------------------------------------
def test_recursive_ref_inside_allof(gc):
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "kids": {
                        "type": "array",
                        "items": {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["id"]}]},
                    },
                },
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    deep = {"id": 1, "kids": [{"id": 2, "kids": [{"id": 3, "kids": []}]}]}
    values = [deep, {}, {"kids": [{"id": 2}]}, {"kids": [{}]}, {"kids": [{"id": 2, "kids": [{}]}]},
              {"id": 1, "kids": [{"id": "2"}]}, {"kids": [{"id": 2, "x": 1}]}]  # fmt: skip
    agree(gc, schema, values)


def test_oneof_lists_merged_in_allof_pair_up(gc):
    schema = {
        "allOf": [
            {"oneOf": [{"type": "integer"}, {"type": "string"}]},
            {"oneOf": [{"minimum": 3, "type": "integer"}, {"maxLength": 2, "type": "string"}]},
        ]
    }
    agree(gc, schema, [1, 3, 9, "", "ab", "abc", None, 2.5])


# ---- oneOf branches proven exclusive -----------------------------------------------------
def kind(tag: str, required: bool, **props) -> dict:
    out = {"type": "object", "properties": {"type": {"enum": [tag]}, **props}}
    return {**out, "required": ["type"]} if required else out


ONE_OF_CASES = {
    # a property one branch requires and both give disjoint values
    "required-by-one": {"oneOf": [kind("a", True, x={"type": "integer"}), kind("b", False)]},
    # branches without `type`: every string, number... is in both, so in no branch
    "shared-types-dropped": {
        "oneOf": [
            {"properties": {"type": {"const": "solid"}}, "required": ["type"]},
            {"properties": {"type": {"const": "texture"}}, "required": ["type"]},
        ]
    },
    # a required property the other (closed) branch does not allow
    "closed-vs-required": {
        "oneOf": [
            {"type": "object", "properties": {"$ref": {"type": "string"}}, "required": ["$ref"]},
            {"type": "object", "properties": {"t": {}}, "additionalProperties": False},
        ]
    },
    # a name one branch requires and the other refuses by `not` of required names
    "required-vs-not-required": {
        "oneOf": [
            {"type": "object", "properties": {"name": {}}, "required": ["name"]},
            {"type": "object", "properties": {"$ref": {}, "t": {}}, "not": {"required": ["name"]}},
        ]
    },
    # an enum of objects ruled out by the other branch's required property
    "enum-of-objects": {
        "oneOf": [
            {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string"}},
            },
            {"enum": [{"type": "void"}]},
        ]  # fmt: skip
    },
}
ONE_OF_VALUES = [
    {"type": "a"}, {"type": "a", "x": 1}, {"type": "a", "x": "s"}, {"type": "b"}, {}, {"x": 1},
    {"type": "solid"}, {"type": "texture", "k": 1}, {"type": "other"}, "solid", 3, None, [],
    {"$ref": "#"}, {"t": 1}, {"$ref": "#", "t": 1}, {"name": "n"}, {"type": "void"},
    {"name": 1}, {"name": 1, "t": 1}, {"t": 2},
]  # fmt: skip


@pytest.mark.parametrize("case", list(ONE_OF_CASES))
def test_oneof_branches_proven_exclusive(gc, case):
    agree(gc, ONE_OF_CASES[case], ONE_OF_VALUES)


CLOSED_A = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "additionalProperties": False,
}
CLOSED_AB = {"type": "object", "additionalProperties": False,
             "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}  # fmt: skip
CLOSED_B = {
    "type": "object",
    "properties": {"b": {"type": "string"}},
    "additionalProperties": False,
}
OVERLAPPING = {
    # 3 matches both: numbers past either bound only (and no other type)
    "bounds": ({"oneOf": [{"minimum": 1}, {"maximum": 5}]},
               [0, 1, 3, 5, 6, 7.5, -2, "s", None, []]),
    # {} matches both; a branch is taken where its tag is there
    "open-tags": ({"oneOf": [kind("a", False), kind("b", False)]},
                  [{}, {"type": "a"}, {"type": "b"}, {"type": "c"}, {"x": 1}, 1]),
    # {} matches both closed objects; each holds a name or a value the other refuses
    "closed-names": ({"oneOf": [CLOSED_A, CLOSED_AB]},
                     [{}, {"a": 1}, {"a": "s"}, {"b": 1}, {"a": 1, "b": 2}, {"a": "s", "b": 1},
                      {"c": 1}, {"a": None}]),
    # each branch meets both others: each is taken where it fails both (by cases)
    "three-bounds": ({"oneOf": [{"minimum": 1}, {"maximum": 5}, {"type": "string"}]},
                     [0, 1, 3, 5, 6, "s", None, {}]),
    "three-closed": ({"oneOf": [CLOSED_A, CLOSED_AB, CLOSED_B]},
                     [{}, {"a": 1}, {"a": "s"}, {"b": 1}, {"b": "s"}, {"a": "s", "b": 1},
                      {"a": 1, "b": "s"}, {"c": 1}]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OVERLAPPING))
def test_oneof_branches_that_overlap_each_take_the_others_not(gc, case):
    """Branches the prover cannot keep apart: each is taken with the `not` of every other
    branch it may share values with (A and not B, B and not A), so exactly one matches."""
    schema, values = OVERLAPPING[case]
    agree(gc, schema, values)


@pytest.mark.parametrize(
    "schema",
    [
        # each meets both others, and `not` of a multipleOf is not written by cases
        {"oneOf": [{"minimum": 1}, {"maximum": 5}, {"multipleOf": 2}]},
        # [] matches both, and `not` of `items` is not written
        {
            "oneOf": [
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "string"}},
            ]
        },  # fmt: skip
        {"oneOf": [{"enum": [{"type": "void"}]}, {"properties": {"type": {"type": "string"}}}]},
    ],
)
def test_oneof_branches_that_may_overlap_are_refused(gc, schema):
    with pytest.raises(ValueError, match="may overlap"):
        gc.compile_json_schema(schema)


NAMES = {"type": {"type": "string"}, "ref": {"type": "string"}, "format": {"type": "string"}}
EXACTLY_ONE_NAME = [{"required": ["type"]}, {"required": ["ref"]}]
BY_FORMAT = [
    {"properties": {"type": {"enum": ["integer"]}, "format": {"enum": ["i32", "i64"]}}},
    {"properties": {"type": {"enum": ["number"]}, "format": {"enum": ["f", "d"]}}},
    {"properties": {"type": {"enum": ["string"]}, "format": {"enum": ["b", "dt"]}}},
]
TWO_LISTS = {
    # Swagger 1.2's data types: "exactly one of two names" and, once `format` is present, a
    # oneOf kept apart by its values; merged, the pairs of the two lists, which the other
    # fallbacks refused (the `not`s by cases of the other pairs past their bound)
    "dependencies": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
                      "oneOf": EXACTLY_ONE_NAME,
                      "properties": {**NAMES, "minimum": {"type": "string"},
                                     "enum": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
                      "dependencies": {"format": {"oneOf": BY_FORMAT}}},
                     [{"type": "integer", "format": "i32"}, {"ref": "r", "format": "f"},
                      {"type": "string", "format": "b"}, {"type": "string"}, {"ref": "r"},
                      {"type": "integer", "ref": "r"}, {}, {"type": "number", "format": "i32"},
                      {"ref": "r", "format": "zz"}, {"type": "integer", "ref": "r", "format": "i64"},
                      {"type": "string", "format": "dt", "minimum": "1", "enum": ["x"]}, {"ref": "r", "enum": []}]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TWO_LISTS))
def test_a_oneof_of_two_lists_pairs_is_exactly_one_of_each(gc, case):
    """Merged parts make a `oneOf` of the pairs of two lists; exactly one pair holds where
    exactly one branch of each list does, so it compiles as the pairs of each list's exclusive
    form."""
    schema, values = TWO_LISTS[case]
    agree(gc, schema, values)


# ---- one parser of schema sources ----------------------------------------------------
def test_peers_and_radixflow_key_schemas_alike(gc):
    text = '{"type": "object", "properties": {"b": {}, "a": {"type": "string"}}}'
    for ws in (None, r"[ ]?"):
        key = gc.cache_key("json_schema", text, ws)[1]
        assert grammar_source("json_schema", json.loads(text), ws).key == key
    with pytest.raises(ValueError, match="not valid JSON"):
        grammar_source("json_schema", "{")
    with pytest.raises(ValueError, match=re.escape("invalid whitespace_pattern")):
        gc.cache_key("json_schema", {}, "(")
