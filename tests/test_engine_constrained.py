"""Constrained generation through the engine: every output is valid, bad grammars fail alone."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import lark
import pytest
from kv_checks import assert_kv_released

import radixflow as rf

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ARITH = """
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""


@pytest.fixture(scope="module")
def engine():
    eng = rf.Engine(dtype="bfloat16", max_total_tokens=8192)
    yield eng
    eng.shutdown()


def _chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def test_regex_outputs_always_match(engine):
    pattern = r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
    outs = engine.generate(
        [_chat(engine, "When did the first moon landing happen?")] * 6,
        {"max_new_tokens": 16, "temperature": 1.0, "regex": pattern, "seed": 3},
    )
    for o in outs:
        assert re.fullmatch(pattern, o["text"]), o["text"]
        assert o["meta_info"]["finish_reason"]["type"] == "stop"


def test_json_schema_outputs_validate(engine):
    outs = engine.generate(
        [_chat(engine, "Describe a person as JSON.")] * 6,
        {"max_new_tokens": 64, "temperature": 0.9, "json_schema": json.dumps(PERSON), "seed": 5},
    )
    finished = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert len(finished) >= 4
    for o in finished:
        jsonschema.validate(json.loads(o["text"]), PERSON)


def test_lark_grammar_outputs_parse(engine):
    parser = lark.Lark(ARITH)
    outs = engine.generate(
        [_chat(engine, "Write a sum of small numbers.")] * 4,
        {"max_new_tokens": 24, "temperature": 0.8, "lark": ARITH, "seed": 9},
    )
    for o in outs:
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            parser.parse(o["text"])


def test_ebnf_grammar(engine):
    gbnf = 'root ::= "yes" | "no" | "maybe"'
    out = engine.generate(_chat(engine, "Is the sky blue?"), {"max_new_tokens": 8, "ebnf": gbnf})
    assert out["text"] in {"yes", "no", "maybe"}


def test_bad_grammar_fails_alone(engine):
    done = {}
    thread = threading.Thread(
        target=lambda: done.setdefault(
            "out", engine.generate("Count: 1, 2,", {"max_new_tokens": 6, "temperature": 0})
        )
    )
    thread.start()
    with pytest.raises(ValueError, match="regex"):
        engine.generate("x", {"regex": "(unclosed"})
    with pytest.raises(ValueError, match="json_schema"):
        engine.generate("x", {"json_schema": {"type": "array", "uniqueItems": True}})
    with pytest.raises(ValueError, match="json_schema"):
        engine.generate("x", {"json_schema": "{not json"})
    thread.join(timeout=60)
    assert done["out"]["meta_info"]["finish_reason"]["type"] == "length"


LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 20},
        "customer_age_in_years": {"type": "integer", "minimum": 0, "maximum": 120},
        "customer_is_premium_member": {"type": "boolean"},
    },
    "required": ["customer_full_name", "customer_age_in_years", "customer_is_premium_member"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("page_size", [1, 16])
def test_jump_forward_is_canonical_valid_and_saves_steps(page_size):
    steps = {}
    for jump in (False, True):
        eng = rf.Engine(dtype="bfloat16", jump_forward=jump, page_size=page_size)
        try:
            prompt = _chat(eng, "A JSON record for the customer Bob, 42, premium.")
            outs = eng.generate(
                [prompt] * 3, {"max_new_tokens": 80, "temperature": 0, "json_schema": LONG_KEYS}
            )
            for o in outs:
                assert o["meta_info"]["finish_reason"]["type"] == "stop"
                jsonschema.validate(json.loads(o["text"]), LONG_KEYS)
                if jump:
                    assert o["output_ids"] == eng.tokenizer.encode(o["text"])
            steps[jump] = eng.stats["steps"]
            assert_kv_released(eng)
        finally:
            eng.shutdown()
    assert steps[True] <= 0.7 * steps[False]
