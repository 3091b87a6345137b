"""Shared `$ref` targets and sub-schemas, depth limits, and the compiler's canonical cache key."""

import copy
import json
import re

import jsonschema
import pytest
from automaton_walk import accepts as automaton_accepts
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler
from radixflow.grammars.json_schema import schema_to_ir
from radixflow.grammars.json_schema_resolve import (
    MAX_DOCUMENT_DEPTH,
    MAX_SCHEMA_DEPTH,
    canonical_schema,
)
from radixflow.grammars.nfa import Deadline

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "meta": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def gc():
    return GrammarCompiler(tiny_tokenizer(), compile_timeout=20.0)


def accepts(grammar, text: str) -> bool:
    """Does the compiled grammar's byte automaton accept exactly `text`?"""
    return automaton_accepts(grammar.automaton, text)


def ir_size(node) -> int:
    """Distinct nodes of an IR DAG (a node reached twice counts once)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack += list(getattr(n, "items", ())) + ([n.item] if hasattr(n, "item") else [])
    return len(seen)


def uses(target: dict, n: int) -> dict:
    """An object with n optional properties, each a `$ref` to `target`."""
    return {
        "$defs": {"item": target},
        "type": "object",
        "properties": {f"p{i}": {"$ref": "#/$defs/item"} for i in range(n)},
        "additionalProperties": False,
    }


def test_a_ref_target_is_converted_once_whatever_its_use_count():
    def size(target: dict, n: int) -> int:
        ir, defs = schema_to_ir(uses(target, n), None, Deadline(None))
        assert not defs
        return ir_size(ir)

    # What the target adds is its own size, not its size times the uses.
    small = {"type": "integer"}
    assert size(ITEM, 200) - size(small, 200) == size(ITEM, 10) - size(small, 10)


def test_equal_inline_sub_schemas_share_one_conversion():
    inline = {
        "type": "object",
        "properties": {f"p{i}": copy.deepcopy(ITEM) for i in range(50)},
        "additionalProperties": False,
    }
    by_ref = uses(ITEM, 50)
    ir_inline, _ = schema_to_ir(inline, None, Deadline(None))
    ir_ref, _ = schema_to_ir(by_ref, None, Deadline(None))
    assert ir_size(ir_inline) == ir_size(ir_ref)


def test_shared_targets_keep_the_language(gc):
    schema = uses(ITEM, 50)
    g = gc.compile_json_schema(schema)
    good = {"p0": {"name": "x", "tags": ["a", "c"]}, "p49": {"name": "y", "meta": {"x": 3}}}
    bad = [
        {"p0": {"tags": ["a"]}},  # name missing
        {"p3": {"name": "x", "tags": ["a", "b", "c", "a"]}},  # too many tags
        {"p5": {"name": "x", "meta": {"x": -1}}},
        {"p50": {"name": "x"}},
    ]
    jsonschema.validate(good, schema)
    assert accepts(g, json.dumps(good, separators=(",", ":")))
    for value in bad:
        assert not jsonschema.Draft202012Validator(schema).is_valid(value)
        assert not accepts(g, json.dumps(value, separators=(",", ":")))


def test_long_chains_of_bare_refs_are_followed(gc):
    n = 5000
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}", "description": f"link {i}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer", "minimum": 3}
    g = gc.compile_json_schema({"$defs": defs, "$ref": "#/$defs/d0"})
    assert accepts(g, "12") and not accepts(g, "2")


def test_a_bare_ref_cycle_is_a_value_error(gc):
    schema = {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    }
    with pytest.raises(ValueError, match="refers back to itself"):
        gc.compile_json_schema(schema)


def chain(n: int) -> dict:
    """n definitions, each an object whose property `x` is the next one."""
    defs = {
        f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_ref_chains_within_the_depth_limit_work(gc):
    g = gc.compile_json_schema(chain(40))
    text = '{"x":' * 40 + "7" + "}" * 40
    assert accepts(g, text) and not accepts(g, '{"x":' * 40 + '"7"' + "}" * 40)


@pytest.mark.parametrize(
    "schema",
    [
        chain(3 * MAX_SCHEMA_DEPTH),
        # two recursive definitions merged property by property, without end
        {
            "$defs": {
                "a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
                "b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}},
            },
            "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        },
    ],
    ids=["ref-chain", "allOf-of-recursive"],
)
def test_too_deep_conversions_name_the_limit(gc, schema):
    with pytest.raises(ValueError, match="MAX_SCHEMA_DEPTH"):
        gc.compile_json_schema(schema)


def test_too_deep_documents_name_the_limit(gc):
    schema: dict = {"type": "integer"}
    for _ in range(MAX_DOCUMENT_DEPTH):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ValueError, match="MAX_DOCUMENT_DEPTH") as caught:
        gc.compile_json_schema(schema)
    assert re.match(r"#(/properties(/a)?)+: ", str(caught.value))  # names the place


def test_keyword_order_does_not_change_the_cache_key(gc):
    a = {
        "type": "object",
        "properties": {"b": {"type": "integer", "minimum": 1}, "a": {"$ref": "#/$defs/s"}},
        "required": ["b"],
        "$defs": {"s": {"maxLength": 3, "type": "string"}},
    }
    b = {
        "$defs": {"s": {"type": "string", "maxLength": 3}},
        "required": ["b"],
        "properties": {"b": {"minimum": 1, "type": "integer"}, "a": {"$ref": "#/$defs/s"}},
        "type": "object",
    }
    g = gc.compile_json_schema(a)
    assert gc.compile_json_schema(b) is g
    assert gc.compile_json_schema(json.dumps(b, indent=2)) is g
    assert accepts(g, '{"b":1,"a":"xyz"}') and not accepts(g, '{"b":1,"a":"wxyz"}')


def test_order_that_matters_is_kept():
    # property order is the generated order; data (const/enum) is written as given
    ab = {"properties": {"a": {}, "b": {}}, "const": {"y": 1, "x": 2}}
    ba = {"const": {"y": 1, "x": 2}, "properties": {"b": {}, "a": {}}}
    assert list(canonical_schema(ab)) == ["const", "properties"]
    assert list(canonical_schema(ab)["properties"]) == ["a", "b"]
    assert list(canonical_schema(ba)["properties"]) == ["b", "a"]
    assert list(canonical_schema(ab)["const"]) == ["y", "x"]
    # a property named like a keyword is a name, not a keyword
    odd = {"properties": {"type": {"type": "string"}, "const": {"maxLength": 2, "type": "string"}}}
    assert list(canonical_schema(odd)["properties"]) == ["type", "const"]
    assert list(canonical_schema(odd)["properties"]["const"]) == ["maxLength", "type"]


def test_properties_in_another_order_are_another_grammar(gc):
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    ba = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    g1, g2 = gc.compile_json_schema(ab), gc.compile_json_schema(ba)
    assert g1 is not g2
    assert accepts(g1, '{"a":1,"b":2}') and accepts(g2, '{"b":2,"a":1}')
