"""Speculative decoding parts without a model: n-gram lookup and lossless verification."""

from __future__ import annotations

import random

import pytest
import torch

from radixflow.runtime.speculative import NgramIndex, verify_greedy, verify_sampled
from radixflow.runtime.speculative.verify import sample_rows


def _reference_proposal(tokens: list[int], k: int, max_n: int = 4) -> list[int]:
    """Plain scan: longest tail n-gram, its latest earlier occurrence, what followed it."""
    for n in range(min(max_n, len(tokens)), 0, -1):
        tail = tokens[len(tokens) - n :]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n : end] == tail:
                return tokens[end : end + k]
    return []


def test_ngram_index_matches_a_plain_scan():
    rng = random.Random(0)
    for trial in range(200):
        index = NgramIndex()
        tokens: list[int] = []
        for _ in range(rng.randint(1, 6)):
            if tokens and rng.random() < 0.3:  # a rewritten tail (jump-forward re-tokenization)
                tokens = tokens[: rng.randint(0, len(tokens))] + [rng.randint(0, 4)]
            tokens = tokens + [rng.randint(0, 4) for _ in range(rng.randint(1, 12))]
            index.sync(tokens)
            k = rng.randint(1, 6)
            assert index.propose(k) == _reference_proposal(tokens, k), (trial, tokens)


def test_ngram_proposes_the_copied_continuation():
    index = NgramIndex()
    index.sync([10, 11, 12, 13, 14, 15, 16, 99, 12, 13])
    assert index.propose(3) == [14, 15, 16]
    assert NgramIndex().propose(3) == []


def test_greedy_verification_accepts_the_matching_prefix_and_the_target_after_it():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert verify_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert verify_greedy([5, 6, 7], [4, 6, 7, 8]) == [4]


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def test_rejection_sampling_is_lossless():
    """Each emitted token follows the target given the ones before it (chi-square per position).

    Drafts are fixed; the target rows are p0 (first token), p1 (after d1), p2 (after d1 d2).
    """
    torch.manual_seed(0)
    V, N = 6, 30000
    p = torch.softmax(torch.randn(3, V) * 1.5, dim=-1)
    p[1, 4] = 0.0  # a zero-probability token must never appear
    p[1] /= p[1].sum()
    drafts = [int(p[0].argmax()), 4]  # a likely first draft, an impossible second one
    gen = torch.Generator().manual_seed(1)
    uniforms = torch.rand(N, 3, dtype=torch.float64, generator=gen).tolist()
    out = verify_sampled(p.repeat(N, 1), [drafts] * N, uniforms)
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=V).float()
    assert _chi2_pvalue(first, p[0]) > 1e-3
    after_d1 = [o[1] for o in out if o[0] == drafts[0]]
    assert len(after_d1) > 1000
    second = torch.bincount(torch.tensor(after_d1), minlength=V).float()
    assert _chi2_pvalue(second, p[1]) > 1e-3
    assert all(len(o) == 2 or (len(o) == 1 and o[0] != drafts[0]) for o in out)


def test_rejection_sampling_accepts_all_drafts_at_their_probability():
    V, N = 5, 20000
    p = torch.tensor([[0.7, 0.1, 0.1, 0.1, 0.0], [0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5])
    gen = torch.Generator().manual_seed(2)
    uniforms = torch.rand(N, 3, dtype=torch.float64, generator=gen).tolist()
    out = verify_sampled(p.repeat(N, 1), [[0, 1]] * N, uniforms)
    full = [o for o in out if len(o) == 3]
    assert len(full) / N == pytest.approx(0.7 * 0.5, abs=0.015)
    bonus = torch.bincount(torch.tensor([o[2] for o in full]), minlength=V).float()
    assert _chi2_pvalue(bonus, p[2]) > 1e-3
    # rejected at the second draft: the residual of p1 without token 1 is token 2
    assert all(o[1] == 2 for o in out if len(o) == 2)


def test_certain_draft_is_always_accepted_and_rows_must_match():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert verify_sampled(p, [[0]], [[0.999999, 0.5]]) == [[0, 2]]
    with pytest.raises(ValueError, match="rows"):
        verify_sampled(p, [[0, 1]], [[0.1, 0.1, 0.1]])


def test_sample_rows_follows_weights_and_skips_zeros():
    w = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0]])
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tokens = sample_rows(w.repeat(len(u), 1), u)
    counts = torch.bincount(tokens, minlength=6).float()
    assert _chi2_pvalue(counts, w[0] / w.sum()) > 1e-3
    assert int(sample_rows(w, torch.tensor([1.0 - 1e-16]))) == 4
