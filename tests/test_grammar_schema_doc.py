"""A schema document's canonical copy and structure numbers in C (`schema_doc.c`): the same
copy, the same sharing and the same numbers as the Python code, on made-up documents and on
every JSONSchemaBench subset; past the depths C follows, the Python code names the limit or
goes on (its build once per machine: `test_grammar_native_build`)."""

import json
from pathlib import Path

import pytest

from radixflow.grammars import json_schema_resolve
from radixflow.grammars.json_schema_resolve import (
    MAX_DOCUMENT_DEPTH,
    SchemaResolver,
    canonical_schema,
)
from radixflow.grammars.nfa import Deadline

BENCH = Path(__file__).resolve().parents[2] / "shared/peer-data/jsonschemabench"

SHARED = {"type": "string", "maxLength": 4}
DOCUMENTS = [
    {"type": "object", "required": ["b", "a"], "properties": {"b": {"type": "integer"}, "a": {}}},
    {  # data left as written, names of name maps in order, schemas in lists sorted
        "enum": [{"z": 1, "a": [2, {"y": 0, "b": 1}]}, "x"],
        "const": {"q": 1, "p": 2},
        "default": [{"k": 1, "c": 2}],
        "anyOf": [{"type": "string", "minLength": 1}, {"maxItems": 2, "items": {"type": "null"}}],
        "$defs": {"zeta": {"type": "null"}, "alpha": {"properties": {"y": {}, "x": {}}}},
        "dependencies": {"y": ["x"], "x": {"required": ["y"], "type": "object"}},
    },
    {"properties": {"a": SHARED, "b": SHARED}, "items": [SHARED, {"allOf": [SHARED]}]},
    {"properties": [{"type": "null", "title": "t"}, {"b": {"c": 1, "a": 2}}]},  # a misused map
    {"patternProperties": {"^x": SHARED}, "propertyNames": SHARED, "examples": [SHARED]},
    True,
    [1, {"b": 2, "a": 1}],
]


@pytest.fixture
def native():
    """Skips where the C module is not in use."""
    if json_schema_resolve.schema_doc() is None:
        pytest.skip(
            "the native schema walks are not in use here (no C compiler or Python headers, "
            "or RADIXFLOW_GRAMMAR_NATIVE=0)"
        )


def twin(monkeypatch, make, arg):
    """`make(arg)` with the Python code."""
    with monkeypatch.context() as m:
        m.setattr(json_schema_resolve, "schema_doc", lambda: None)
        return make(arg)


def containers(doc) -> list:
    """Every dict and list in `doc`, depth first, values in order (shared ones each time)."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            out.append(node)
            stack.extend(reversed(list(node.values()) if isinstance(node, dict) else node))
    return out


def sharing(doc) -> list[int]:
    """For each container of `doc` in `containers` order, where the same object came first."""
    first: dict[int, int] = {}
    return [first.setdefault(id(node), i) for i, node in enumerate(containers(doc))]


def assert_same_copy(with_c, python) -> None:
    assert json.dumps(with_c) == json.dumps(python)  # order-sensitive, unlike ==
    assert sharing(with_c) == sharing(python)


def numbers(doc) -> list[int]:
    """The structure number of every container of `doc`, from a numbering of its own."""
    resolver = SchemaResolver(doc, Deadline(None))
    return [resolver.key(node) for node in containers(doc)]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_the_canonical_copy_and_numbers_are_the_python_codes(native, monkeypatch, doc):
    with_c = canonical_schema(doc)
    python = twin(monkeypatch, canonical_schema, doc)
    assert_same_copy(with_c, python)
    if isinstance(doc, (dict, list)):
        assert with_c is not doc  # a copy, never the caller's document
    assert numbers(with_c) == twin(monkeypatch, numbers, with_c)


def test_shared_objects_stay_shared_and_equal_structures_get_one_number(native):
    doc = canonical_schema(DOCUMENTS[2])
    props = doc["properties"]
    assert props["a"] is props["b"]  # one copy of one object
    assert doc["items"][0] is props["a"]
    resolver = SchemaResolver(doc, Deadline(None))
    equal = json.loads(json.dumps(props["a"]))  # the same structure, another object
    assert resolver.key(equal) == resolver.key(props["a"]) != resolver.key(doc["items"][1])


@pytest.mark.skipif(not BENCH.is_dir(), reason="../shared/peer-data/jsonschemabench is absent")
@pytest.mark.parametrize("subset", sorted(p.name for p in BENCH.glob("*") if p.is_dir()))
def test_benchmark_schemas_match_the_python_code(native, monkeypatch, subset):
    for path in sorted((BENCH / subset).glob("*.json"))[:60]:
        schema = json.loads(path.read_text())["schema"]
        with_c = canonical_schema(schema)
        assert_same_copy(with_c, twin(monkeypatch, canonical_schema, schema))
        assert numbers(with_c) == twin(monkeypatch, numbers, with_c), path.name


def nested(depth: int, leaf) -> dict:
    doc = leaf
    for _ in range(depth):
        doc = {"allOf": [doc]}
    return doc


def test_past_the_document_depth_the_error_names_where(native, monkeypatch):
    deep = nested(MAX_DOCUMENT_DEPTH, {"type": "null"})
    with pytest.raises(ValueError, match="MAX_DOCUMENT_DEPTH") as with_c:
        canonical_schema(deep)
    with pytest.raises(ValueError) as python:
        twin(monkeypatch, canonical_schema, deep)
    assert str(with_c.value) == str(python.value)
    assert "#/allOf/0/allOf/0" in str(with_c.value)
    assert_same_copy(canonical_schema(nested(100, {})), nested(100, {}))


def test_structures_deeper_than_c_follows_are_numbered(native):
    """Data may nest deeper than the schema depth limits (a `const`); C leaves it to Python."""
    deep, again = [[[1]]], [[[1]]]
    for _ in range(1500):
        deep, again = [deep], [again]
    resolver = SchemaResolver({}, Deadline(None))
    assert resolver.key(deep) == resolver.key(again)
    assert resolver.key(deep) != resolver.key([deep])


def test_names_that_do_not_sort_fail_as_in_python(native, monkeypatch):
    odd = {"properties": {}, 1: {}, "type": "object"}
    with pytest.raises(TypeError):
        canonical_schema(odd)
    with pytest.raises(TypeError):
        twin(monkeypatch, canonical_schema, odd)
