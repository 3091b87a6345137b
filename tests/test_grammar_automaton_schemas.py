"""The lazy automaton under JSON Schemas: long string bounds as counters, large `$ref` graphs.

Masks are checked against `re.fullmatch` on sampled strings; laziness is checked on the
number of NFA states built, not on time.
"""

import json
import random
import re

import pytest
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler

# A JSON string of at most 32767 characters, as `re` reads it (shortest escapes or \uXXXX).
LONG_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,32767}"')


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok, compile_timeout=20.0)


def allows(matcher, token: int) -> bool:
    """Whether the matcher's packed int32 mask has `token`'s bit."""
    return bool((int(matcher.next_token_mask()[token // 32]) >> (token % 32)) & 1)


def walk_tokens(tok, grammar, text: str) -> bool:
    """Whether the grammar's masks allow `text`'s tokens one by one and then EOS."""
    matcher = grammar.matcher()
    for token in tok.encode(text, add_special_tokens=False):
        if not allows(matcher, token):
            return False
        assert matcher.accept(token)
    return allows(matcher, tok.eos_token_id)


def sampled_strings(rng: random.Random) -> list[str]:
    pieces = ["a", "Z", " ", "é", "日", "\U0001f600", '\\"', "\\\\", "\\n", "\\u00e9", "\\/"]
    bad = ['"', "\\", "\\x", "\\u12", "\n"]
    out = ['""', '"' + "q" * 200 + '"']
    for _ in range(30):
        body = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12)))
        out.append(f'"{body}"')
        cut = rng.randrange(len(body) + 1)
        out.append(f'"{body[:cut]}{rng.choice(bad)}{body[cut:]}"')
    return out


def test_a_32767_character_string_compiles_as_a_counter_and_masks_like_re(tok, compiler):
    grammar = compiler.compile_json_schema({"type": "string", "maxLength": 32767})
    assert len(grammar.automaton.dfa.nfa) < 50  # nothing per count before a walk
    for text in sampled_strings(random.Random(3)):
        assert walk_tokens(tok, grammar, text) == bool(LONG_STRING.fullmatch(text)), text
    assert len(grammar.automaton.dfa.nfa) < 10_000


@pytest.mark.parametrize("bound", [1, 300, 2000])
def test_the_length_bound_is_exact_at_its_edge(tok, compiler, bound):
    grammar = compiler.compile_json_schema({"type": "string", "maxLength": bound})
    auto = grammar.automaton
    state = auto.initial
    for b in b'"' + b"x" * bound:
        state = int(auto.row(state)[b])
    assert state >= 0 and int(auto.row(state)[ord("x")]) < 0
    assert auto.is_accepting(int(auto.row(state)[ord('"')]))


def kubernetes_like(n: int) -> dict:
    """`n` object definitions, each referring to two others and to one shared `meta`, with
    bounded strings and integers (a tree of `$ref`s, as Kubernetes' specs and statuses are)."""
    meta = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}}
    defs = {"meta": meta}
    for i in range(n):
        props = {f"f{j}": {"type": "string", "maxLength": 253} for j in range(8)}
        props["count"] = {"type": "integer", "minimum": 0, "maximum": 65535}
        props["meta"] = {"$ref": "#/definitions/meta"}
        if 2 * i + 2 < n:
            props["child"] = {"$ref": f"#/definitions/d{2 * i + 1}"}
            props["items"] = {"type": "array", "items": {"$ref": f"#/definitions/d{2 * i + 2}"}}
        defs[f"d{i}"] = {"type": "object", "properties": props, "additionalProperties": False}
    return {"definitions": defs, "$ref": "#/definitions/d0"}


def test_a_large_ref_graph_builds_only_what_a_walk_visits(tok, compiler):
    grammar = compiler.compile_json_schema(kubernetes_like(150))
    nfa = grammar.automaton.dfa.nfa  # no recursion: one regular language, ~1,200 strings
    built = len(nfa)
    # Eagerly, each `maxLength: 253` string alone took thousands of states.
    assert built < 100, built
    instance = {"f0": "abc", "count": 7, "child": {"meta": {"name": "x"}, "items": [{"f1": ""}]}}
    text = json.dumps(instance, separators=(",", ":"))
    assert walk_tokens(tok, grammar, text)
    assert len(nfa) - built < 40 * len(text)  # what the masks along the walk visited
    assert not walk_tokens(tok, grammar, text.replace("7", "70000"))
