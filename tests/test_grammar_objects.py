"""JSON Schema objects and free values: nesting depth, merged property orders, uniqueItems.

Every instance is walked byte by byte through the compiled automaton and the verdict is
compared with the `jsonschema` validator (and, for property orders, with the documented rule).
"""

import itertools
import json

import jsonschema
import pytest
from automaton_walk import accepts as automaton_accepts
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler, GrammarLimits
from radixflow.grammars.json_schema_objects import MAX_INTERLEAVINGS, MAX_UNIQUE_STATES


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def gc(tok):
    return GrammarCompiler(tok, compile_timeout=5.0)


def accepts(grammar, value) -> bool:
    """Does the grammar's byte automaton accept `value` written compactly?"""
    return automaton_accepts(
        grammar.automaton, json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    )


def nested(depth: int, leaf=1):
    """`depth` arrays/objects around `leaf`, alternating."""
    value = leaf
    for level in range(depth):
        value = [value, "x"] if level % 2 else {"k": value, "n": None}
    return value


def agree(grammar, schema, values) -> None:
    checker = jsonschema.Draft202012Validator(schema)
    for value in values:
        assert accepts(grammar, value) == checker.is_valid(value), value


# ---- free values ------------------------------------------------------------------------
FREE_SCHEMAS = [
    {},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "array", "prefixItems": [{"type": "string"}]},
]


@pytest.mark.parametrize("schema", FREE_SCHEMAS)
def test_free_values_nest_to_the_configured_depth(tok, schema):
    limit = 10
    gc = GrammarCompiler(tok, compile_timeout=30.0, limits=GrammarLimits(free_value_depth=limit))
    g = gc.compile_json_schema(schema)

    def place(value):  # `value` where the schema leaves it free
        if schema.get("type") == "object":
            return {"a": 1, "extra": value}
        return ["s", value] if schema.get("type") == "array" else value

    for depth in (0, 1, 3, 10, limit):
        assert accepts(g, place(nested(depth))), depth
    leaf = {"e": [True, -1.5e3, "\n"]}  # two levels
    assert accepts(g, place(nested(limit - 2, leaf)))
    assert not accepts(g, place(nested(limit - 1, leaf)))
    assert not accepts(g, place(nested(limit + 1)))
    agree(g, schema, [place(nested(4)), place(nested(2, "x")), {"a": "no"}, ["s", 1, 2], [3]])


def test_default_free_depth_is_the_limits_default(gc):
    g = gc.compile_json_schema({"type": "object", "properties": {"meta": {}}})
    depth = GrammarLimits().free_value_depth
    assert accepts(g, {"meta": nested(depth)}) and accepts(g, {"other": nested(depth)})
    assert not accepts(g, {"meta": nested(depth + 1)})


def test_free_depth_rejects_the_token_that_opens_one_level_too_many(tok):
    gc = GrammarCompiler(tok, compile_timeout=5.0, limits=GrammarLimits(free_value_depth=3))
    g = gc.compile_json_schema({})
    m = g.matcher()
    for t in tok.encode("[[[", add_special_tokens=False):
        assert m.accept(t)
    assert not m.accept(tok.encode("[", add_special_tokens=False)[0])
    assert m.accept(tok.encode("]", add_special_tokens=False)[0])


# ---- property order where a schema's properties merge into anyOf/oneOf branches ---------
PARENT = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a"],
}
BRANCHES = [
    {"properties": {"c": {"type": "boolean"}, "d": {"type": "null"}}, "required": ["c"]},
    {"properties": {"b": {"const": "x"}, "e": {"type": "integer"}}, "required": ["e"]},
]
CHAINS = [[["a", "b"], ["c", "d"]], [["a", "b"], ["e"]]]  # per branch, by the documented rule


def order_allowed(keys: list[str], chains: list[list[str]]) -> bool:
    """Each chain's keys in chain order, keys no chain declares after all declared ones."""
    declared = [k for k in keys if any(k in chain for chain in chains)]
    in_order = all([k for k in keys if k in c] == [k for k in c if k in keys] for c in chains)
    return in_order and keys[: len(declared)] == declared


def test_merged_branch_properties_interleave_with_the_parents(gc):
    schema = {**PARENT, "anyOf": BRANCHES}
    g = gc.compile_json_schema(schema)
    checkers = [jsonschema.Draft202012Validator({"allOf": [PARENT, b]}) for b in BRANCHES]
    values = {"a": 1, "b": "x", "c": True, "d": None, "e": 2}
    accepted = 0
    for n in range(len(values) + 1):
        for keys in itertools.permutations(values, n):
            instance = {k: values[k] for k in keys}
            want = any(
                check.is_valid(instance) and order_allowed(list(keys), chains)
                for check, chains in zip(checkers, CHAINS, strict=True)
            )
            assert accepts(g, instance) == want, keys
            accepted += want
    assert accepted > 40
    assert accepts(g, {"c": True, "a": 1}) and accepts(g, {"a": 1, "c": True, "b": "y"})
    assert accepts(g, {"e": 1, "a": 1, "b": "x"}) and not accepts(g, {"a": 1, "e": 1, "b": "y"})


def test_nested_branches_keep_every_chain(gc):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "oneOf": [
            {
                "properties": {"k": {"const": 1}},
                "required": ["k"],
                "anyOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]}],
            },
            {"properties": {"k": {"const": 2}}, "required": ["k"]},
        ],
    }
    g = gc.compile_json_schema(schema)
    agree(
        g, schema, [{"x": 1, "k": 1, "a": 0}, {"k": 1, "x": 1}, {"a": 1, "k": 2}, {"k": 2, "a": 1}]
    )
    assert not accepts(g, {"k": 1})


def test_too_many_interleavings_fall_back_to_declared_order(gc):
    n = 16  # (n + 1) ** 2 positions > MAX_INTERLEAVINGS
    assert (n + 1) ** 2 > MAX_INTERLEAVINGS
    parent = {f"p{i}": {"type": "integer"} for i in range(n)}
    branch = {f"b{i}": {"type": "integer"} for i in range(n)}
    schema = {"type": "object", "properties": parent, "anyOf": [{"properties": branch}]}
    g = gc.compile_json_schema(schema)
    assert accepts(g, {"p0": 1, "p1": 2, "b0": 3}) and accepts(g, {"b0": 3})
    assert not accepts(g, {"b0": 3, "p0": 1})  # valid, but outside the documented order
    small = {"type": "object", "properties": {"p0": {}}, "anyOf": [{"properties": branch}]}
    assert accepts(gc.compile_json_schema(small), {"b0": 3, "p0": 1, "b1": 2})


# ---- uniqueItems ------------------------------------------------------------------------
UNIQUE = [
    {"type": "array", "items": {"enum": ["r", "g", "b"]}, "uniqueItems": True},
    {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 1},
    {"type": "array", "items": {"enum": [1, 1.0, 2, None]}, "uniqueItems": True, "maxItems": 2},
    {"type": "array", "prefixItems": [{"const": "x"}], "items": {"enum": ["x", "y"]},
     "uniqueItems": True},
    {"type": "array", "items": {"type": ["boolean", "null"]}, "uniqueItems": False},
]  # fmt: skip


@pytest.mark.parametrize("schema", UNIQUE)
def test_unique_items_agree_with_jsonschema(gc, schema):
    g = gc.compile_json_schema(schema)
    pool = ["r", "g", "b", True, False, None, 1, 2, "x", "y", 7]
    values = [list(p) for n in range(5) for p in itertools.product(pool, repeat=n) if n < 3]
    values += [["r", "g", "b"], ["r", "g", "r"], ["b", "g", "r", "g"], [True, False, True]]
    values += [["x", "y"], ["x", "y", "x"], [None, True, False], [None, None]]
    agree(g, schema, values)


def test_unique_items_limits_and_refusals(gc):
    # at most one element: uniqueItems holds for any items
    g = gc.compile_json_schema(
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1}
    )
    assert accepts(g, ["a"]) and accepts(g, [])
    with pytest.raises(
        ValueError, match="#/items: uniqueItems is supported for items that are enum"
    ):
        gc.compile_json_schema({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
    with pytest.raises(ValueError, match="uniqueItems is supported"):
        gc.compile_json_schema({"type": "array", "uniqueItems": True})
    with pytest.raises(ValueError, match=f"more than {MAX_UNIQUE_STATES} states"):
        gc.compile_json_schema(
            {"type": "array", "items": {"enum": list(range(40))}, "uniqueItems": True}
        )
    with pytest.raises(ValueError, match="uniqueItems must be a boolean"):
        gc.compile_json_schema({"type": "array", "uniqueItems": "yes"})
    # a type other than array ignores it
    g = gc.compile_json_schema({"type": "object", "uniqueItems": True})
    assert accepts(g, {"a": [1, 1]})
