"""Decode attention kernel (Triton interpreter) against its torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.decode_attention import decode_attention
from radixflow.kernels.reference import decode_attention_ref
from radixflow.kernels.testing import random_paged_table, relative_error

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float16]


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Max abs error relative to the largest reference value; NaN anywhere fails."""
    assert not out.isnan().any(), "kernel left unwritten (NaN) or produced NaN elements"
    err = relative_error(out, ref)
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


DECODE_CASES = [
    # seq_lens, heads, kv_heads, head_dim, page_size, logit_cap, sliding_window, num_kv_splits
    pytest.param([1], 4, 4, 64, 1, 0.0, -1, 1, id="single-token"),
    pytest.param([1, 70, 130], 8, 2, 128, 16, 0.0, -1, 3, id="gqa4-d128"),
    pytest.param([5, 64, 65, 17, 200], 8, 1, 64, 16, 0.0, -1, 3, id="gqa8-b5"),
    pytest.param([33, 150], 8, 1, 96, 1, 30.0, -1, 2, id="gqa8-d96-cap"),
    pytest.param([3, 100, 129, 50], 12, 4, 64, 16, 0.0, 40, 2, id="gqa3-window"),
    pytest.param([150, 7], 72, 1, 64, 16, 0.0, -1, 1, id="gqa72-head-blocks"),
    pytest.param([90, 2, 64], 4, 2, 64, 1, 5.0, 17, 8, id="cap-window-many-splits"),
    pytest.param([300, 1], 8, 8, 64, 16, 0.0, -1, None, id="auto-splits"),
    pytest.param([4, 0], 4, 1, 64, 16, 0.0, -1, 2, id="padding-empty-request"),
    pytest.param([9, 3], 2, 1, 8, 1, 0.0, -1, 1, id="tiny-head-dim"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "seq_lens,heads,kv_heads,head_dim,page_size,logit_cap,window,splits", DECODE_CASES
)
def test_decode_attention_matches_reference(
    dtype, seq_lens, heads, kv_heads, head_dim, page_size, logit_cap, window, splits
):
    gen = torch.Generator().manual_seed(hash((tuple(seq_lens), heads, head_dim)) % 2**31)
    req_to_token, rows, num_slots = random_paged_table(seq_lens, page_size, gen)
    k_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(len(seq_lens), heads, head_dim, generator=gen).to(dtype)
    seq_lens_t = torch.tensor(seq_lens)
    args = (
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        rows,
        seq_lens_t,
        head_dim**-0.5,
        logit_cap,
        window,
    )

    out = torch.full_like(q, float("nan"))
    decode_attention(*args, num_kv_splits=splits, out=out)
    ref = decode_attention_ref(*args)
    assert_rel_close(out, ref, dtype)


def test_decode_reference_is_sdpa_over_gathered_kv():
    gen = torch.Generator().manual_seed(0)
    seq_lens = [9, 40]
    req_to_token, rows, num_slots = random_paged_table(seq_lens, 4, gen)
    k_buffer = torch.randn(num_slots, 2, 32, generator=gen)
    v_buffer = torch.randn(num_slots, 2, 32, generator=gen)
    q = torch.randn(2, 6, 32, generator=gen)
    ref = decode_attention_ref(
        q, k_buffer, v_buffer, req_to_token, rows, torch.tensor(seq_lens), 0.3
    )
    for i, (row, n) in enumerate(zip(rows.tolist(), seq_lens, strict=True)):
        slots = req_to_token[row, :n].long()
        k = k_buffer[slots].transpose(0, 1).repeat_interleave(3, 0)  # [H, L, D]
        v = v_buffer[slots].transpose(0, 1).repeat_interleave(3, 0)
        expect = F.scaled_dot_product_attention(q[i][:, None], k, v, scale=0.3)[:, 0]
        torch.testing.assert_close(ref[i], expect, rtol=1e-5, atol=1e-5)


def test_bad_shapes_raise_value_error():
    q = torch.randn(2, 6, 64)
    k_buffer = torch.randn(10, 4, 64)  # 6 heads do not group over 4 KV heads
    r2t = torch.zeros(2, 8, dtype=torch.int32)
    idx, lens = torch.tensor([0, 1]), torch.tensor([3, 4])
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, k_buffer, k_buffer, r2t, idx, lens, 1.0)
    with pytest.raises(ValueError, match="sliding_window"):
        decode_attention(q, k_buffer[:, :2], k_buffer[:, :2], r2t, idx, lens, 1.0, 0.0, 0)
