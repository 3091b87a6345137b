"""The compiled CPU decode-attention kernel against decode_attention_ref and dense fp32 math."""

from __future__ import annotations

import warnings

import pytest
import torch

from radixflow.kernels import cpu_attention
from radixflow.kernels.cpu_attention import decode_attention_cpu
from radixflow.kernels.cpu_build import current_choice
from radixflow.kernels.reference import decode_attention_ref
from radixflow.kernels.testing import random_paged_table, relative_error

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def problem(lengths, kv_heads, group, head_dim, page_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    table, rows, slots = random_paged_table(lengths, page_size, gen)
    q = torch.randn(len(lengths), kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    return q, k, v, table, rows, torch.tensor(lengths)


def dense_lse(q, k, v, table, rows, seq_lens, scale, logit_cap=0.0, window=-1):
    """Each query's log-sum-exp over its visible keys, in plain fp32 math."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape[:2])
    for i, (row, n) in enumerate(zip(rows.tolist(), seq_lens.tolist(), strict=True)):
        start = max(0, n - window) if window > 0 else 0
        keys = k[table[row, start:n].long()].float().repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", q[i].float(), keys) * scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        out[i] = torch.logsumexp(scores, -1)
    return out


def run_kernel(q, k, v, table, rows, seq_lens, scale, logit_cap=0.0, window=-1):
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"))
    decode_attention_cpu(q, k, v, table, rows, seq_lens, scale, logit_cap, window, out, lse)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_matches_reference_over_ragged_batches(dtype, page_size, group, head_dim):
    seed = group * 1000 + head_dim + page_size
    gen = torch.Generator().manual_seed(seed)
    batch = 1 + seed % 5
    lengths = [1] + torch.randint(2, 300, (batch - 1,), generator=gen).tolist()
    args = problem(lengths, 2, group, head_dim, page_size, dtype, seed)
    scale = head_dim**-0.5
    out, lse = run_kernel(*args, scale)
    ref = decode_attention_ref(*(t.float() if t.is_floating_point() else t for t in args), scale)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    assert torch.allclose(lse, dense_lse(*args, scale), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_soft_cap_and_sliding_window(dtype):
    args = problem([1, 7, 40, 123, 300], 3, 3, 64, 16, dtype, seed=5)
    out, lse = run_kernel(*args, 0.125, 2.0, 50)
    floats = (t.float() if t.is_floating_point() else t for t in args)
    ref = decode_attention_ref(*floats, 0.125, logit_cap=2.0, sliding_window=50)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    assert torch.allclose(lse, dense_lse(*args, 0.125, 2.0, 50), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("lengths", [[3001], [2500, 17]], ids=["one", "long-and-short"])
def test_long_sequences_split_across_threads_merge_exactly(lengths):
    args = problem(lengths, 2, 4, 64, 16, torch.float32, seed=11)
    out, lse = run_kernel(*args, 0.125)
    assert relative_error(out, decode_attention_ref(*args, 0.125)) < 1e-5
    assert torch.allclose(lse, dense_lse(*args, 0.125), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("lengths", [[60, 3001], [3001], [90, 20]], ids=["mixed", "long", "short"])
def test_query_rows_sharing_a_sequence_see_up_to_their_own_position(dtype, lengths):
    """The k+1 tokens of a speculative verify: consecutive rows over one req_to_token row, row
    j seeing the first len - k + j keys; grouped in the kernel (one K/V load for all), split
    into ranges when the sequence is long."""
    q, k, v, table, rows, seq_lens = problem(lengths, 3, 3, 64, 16, dtype, seed=len(lengths))
    verify = 5
    rows = torch.cat([rows[:-1], rows[-1:].repeat(verify)])
    last = int(seq_lens[-1])
    seq_lens = torch.cat([seq_lens[:-1], torch.arange(last - verify + 1, last + 1)])
    q = torch.randn(len(rows), q.shape[1], q.shape[2], generator=torch.Generator().manual_seed(7))
    q = q.to(dtype)
    args = (q, k, v, table, rows, seq_lens)
    out, lse = run_kernel(*args, 0.125)
    ref = decode_attention_ref(*(t.float() if t.is_floating_point() else t for t in args), 0.125)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    assert torch.allclose(lse, dense_lse(*args, 0.125), rtol=1e-5, atol=1e-4)


def test_table_slice_attends_the_suffix_only():
    q, k, v, table, rows, seq_lens = problem([90, 130], 3, 3, 64, 1, torch.float32, seed=3)
    out, lse = run_kernel(q, k, v, table[:, 64:], rows, seq_lens - 64, 0.125)
    suffix = table[:, 64:].contiguous()
    assert (
        relative_error(out, decode_attention_ref(q, k, v, suffix, rows, seq_lens - 64, 0.125))
        < 1e-5
    )
    assert torch.allclose(lse, dense_lse(q, k, v, suffix, rows, seq_lens - 64, 0.125), atol=1e-4)


def test_empty_sequence_gives_zero_output_and_minus_infinite_lse():
    q, k, v, table, rows, _ = problem([5, 5], 1, 2, 64, 1, torch.float32, seed=1)
    out, lse = run_kernel(q, k, v, table, rows, torch.tensor([0, 5]), 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isneginf(lse[0]).all() and torch.isfinite(lse[1]).all()


def test_bad_arguments_raise_value_errors():
    q, k, v, table, rows, seq_lens = problem([4], 2, 2, 64, 1, torch.float32, seed=2)
    with pytest.raises(ValueError, match="dtype"):
        decode_attention_cpu(q.bfloat16(), k, v, table, rows, seq_lens, 0.125)
    with pytest.raises(ValueError, match="heads"):
        decode_attention_cpu(q[:, :3], k, v, table, rows, seq_lens, 0.125)
    with pytest.raises(ValueError, match="req_to_token"):
        decode_attention_cpu(q, k, v, table.long(), rows, seq_lens, 0.125)
    with pytest.raises(ValueError, match="sliding_window"):
        decode_attention_cpu(q, k, v, table, rows, seq_lens, 0.125, sliding_window=0)


def test_failed_build_warns_and_reports_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu_attention.build(tmp_path) is False
    assert any("torch path" in str(w.message) for w in caught)
