"""`strict_schema` (OpenAI's `strict: true`): objects admit only the keys their schema declares.

Checked with `jsonschema` as the reference: instances with keys the schema does not declare are
valid before and invalid after, the schema's own instances stay valid, and over the JSON Schema
Test Suite the transform only ever narrows what a schema accepts.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_convert import (
    STRICT_MAX_DEPTH,
    checked_strict,
    strict_schema,
)

SUITE = Path(__file__).resolve().parents[1].parent / "shared/peer-data/json-schema-test-suite"
SUITE_2020 = SUITE / "tests/draft2020-12"

NESTED = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
        "tags": {
            "type": "array",
            "items": {"type": "object", "properties": {"k": {"type": "string"}}},
        },
        "pair": {"type": "array", "prefixItems": [{"properties": {"a": {"type": "integer"}}}]},
    },
    "required": ["user"],
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["v"],
        }
    },
    "$ref": "#/$defs/node",
}
EXTENDED = {  # allOf of a shared base and an extension: both parts' keys stay allowed
    "definitions": {
        "base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    },
    "allOf": [{"$ref": "#/definitions/base"}, {"properties": {"note": {"type": "string"}}}],
}
TAGGED = {  # shared keys beside alternatives: each branch admits the shared keys and its own
    "type": "object",
    "properties": {"kind": {"type": "string"}},
    "required": ["kind"],
    "anyOf": [
        {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
        {"properties": {"y": {"type": "integer"}}, "required": ["y"]},
    ],
}
PETS = {
    "$defs": {
        "cat": {
            "type": "object",
            "properties": {"meow": {"type": "boolean"}},
            "required": ["meow"],
        },
        "dog": {
            "type": "object",
            "properties": {"bark": {"type": "boolean"}},
            "required": ["bark"],
        },
    },
    "type": "object",
    "properties": {"pet": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]}},
}
CARD = {
    "type": "object",
    "properties": {"card": {"type": "string"}},
    "dependentSchemas": {
        "card": {"properties": {"billing": {"type": "string"}}, "required": ["billing"]}
    },
}

# (schema, instances valid before and after, instances valid before only)
CASES = [
    (
        NESTED,
        [{"user": {"name": "a"}, "tags": [{"k": "x"}, {}], "pair": [{"a": 1}, {"b": 2}]}],
        [
            {"user": {"name": "a"}, "zz": 1},
            {"user": {"name": "a", "zz": 1}},
            {"user": {"name": "a"}, "tags": [{"k": "x", "zz": 1}]},
            {"user": {"name": "a"}, "pair": [{"a": 1, "zz": 2}]},
        ],
    ),
    (
        TREE,
        [{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}],
        [{"v": 1, "zz": 0}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "zz": 0}]}]}],
    ),
    (EXTENDED, [{"id": 1, "note": "x"}, {"id": 1}], [{"id": 1, "note": "x", "zz": 1}]),
    (
        TAGGED,
        [{"kind": "a", "x": 1}, {"kind": "b", "y": 2}],
        [{"kind": "a", "x": 1, "zz": 0}, {"kind": "a", "x": 1, "y": 2}],
    ),
    (
        PETS,
        [{"pet": {"meow": True}}, {"pet": {"bark": False}}, {}],
        [{"pet": {"meow": True, "zz": 1}}, {"pet": {"bark": True}, "zz": 1}],
    ),
    (CARD, [{"card": "x", "billing": "y"}, {}], [{"card": "x", "billing": "y", "zz": 1}]),
]


def valid(schema, instance) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(instance)


@pytest.mark.parametrize(("schema", "good", "extra"), CASES)
def test_strict_closes_objects(schema, good, extra):
    before = copy.deepcopy(schema)
    strict = strict_schema(schema)
    assert schema == before  # pure: the request's schema is not changed
    jsonschema.Draft202012Validator.check_schema(strict)
    for instance in good:
        assert valid(schema, instance) and valid(strict, instance), instance
    for instance in extra:
        assert valid(schema, instance) and not valid(strict, instance), instance
    assert strict_schema(strict) == strict  # a strict schema is its own strict form


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        {"type": "object", "additionalProperties": True},
        {"type": "object", "patternProperties": {"^x-": {"type": "string"}}},
        {"type": "string", "maxLength": 3},
        {"enum": [{"a": 1}, 2]},
        {"not": {"type": "object", "properties": {"a": {}}}},
        {"anyOf": [{"type": "integer"}, {"required": ["a"]}]},
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "integer"}}},
        True,
    ],
)
def test_strict_keeps_closed_and_non_object_schemas(schema):
    assert strict_schema(schema) == schema


def test_strict_refuses_a_required_property_nothing_declares():
    closed = {"type": "object", "properties": {}, "required": ["b"]}
    with pytest.raises(ValueError, match="#/properties/a: required property 'b'"):
        strict_schema({"type": "object", "properties": {"a": closed}})
    typeless = strict_schema({"properties": {}, "required": ["b"]})  # still admits non-objects
    assert valid(typeless, 3) and not valid(typeless, {"b": 1})
    declared_in_part = {"type": "object", "required": ["b"], "allOf": [{"properties": {"b": {}}}]}
    strict = strict_schema(declared_in_part)
    assert valid(strict, {"b": 1}) and not valid(strict, {"b": 1, "c": 2})


def test_strict_refuses_schemas_nested_past_the_limit():
    deep: dict = {"type": "integer"}
    for _ in range(STRICT_MAX_DEPTH + 5):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match=f"deeper than {STRICT_MAX_DEPTH} levels"):
        strict_schema(deep)
    with pytest.raises(APIError, match="tools"):
        checked_strict(deep, "tools")


def _suite_cases():
    skip = {"refRemote.json", "dynamicRef.json", "vocabulary.json"}  # other documents
    for path in sorted(SUITE_2020.glob("*.json")):
        if path.name in skip:
            continue
        for group in json.loads(path.read_text()):
            yield pytest.param(group, id=f"{path.stem}: {group['description']}")


@pytest.mark.skipif(not SUITE_2020.is_dir(), reason=f"the JSON Schema Test Suite is not at {SUITE}")
@pytest.mark.parametrize("group", list(_suite_cases()) if SUITE_2020.is_dir() else [])
def test_strict_only_narrows_the_test_suite_schemas(group):
    """An instance the schema rejects, its strict form rejects too (or strict refuses it)."""
    try:
        strict = strict_schema(group["schema"])
    except ValueError as exc:  # an object that requires an undeclared property
        assert "is not declared in properties" in str(exc)
        return
    for test in group["tests"]:
        try:
            if test["valid"] or valid(group["schema"], test["data"]):
                continue  # valid, or a case the reference validator itself gets wrong
        except Exception as exc:  # the reference cannot run it (e.g. a Unicode \\p escape)
            pytest.skip(f"jsonschema cannot validate this group: {exc!r}")
        assert not valid(strict, test["data"]), test["description"]
