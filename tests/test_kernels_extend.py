"""Extend attention kernel (Triton interpreter) against its torch reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.decode_attention import decode_attention
from radixflow.kernels.extend_attention import extend_attention
from radixflow.kernels.reference import extend_attention_ref
from radixflow.kernels.testing import random_paged_table, relative_error

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float16]


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Max abs error relative to the largest reference value; NaN anywhere fails."""
    assert not out.isnan().any(), "kernel left unwritten (NaN) or produced NaN elements"
    err = relative_error(out, ref)
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


EXTEND_CASES = [
    # prefix_lens, extend_lens, heads, kv_heads, head_dim, page_size, logit_cap, sliding_window
    pytest.param([0], [1], 4, 4, 64, 1, 0.0, -1, id="one-token-prefill"),
    pytest.param([0, 0, 0], [1, 37, 70], 4, 4, 64, 16, 0.0, -1, id="prefill-ragged"),
    pytest.param([70, 16], [1, 1], 8, 2, 64, 16, 0.0, -1, id="prefix-only"),
    pytest.param([0, 33, 128, 5], [65, 3, 1, 40], 4, 1, 128, 16, 0.0, -1, id="gqa4-d128-mixed"),
    pytest.param([20, 0, 7, 64, 1], [4, 9, 5, 2, 60], 8, 1, 96, 1, 20.0, -1, id="gqa8-d96-cap-b5"),
    pytest.param([50, 0, 100], [30, 70, 4], 4, 1, 64, 16, 0.0, 20, id="window"),
    pytest.param([10, 0], [5, 3], 4, 2, 64, 1, 0.0, 1, id="window-self-only"),
    pytest.param([3], [4], 2, 2, 8, 1, 0.0, -1, id="tiny-head-dim"),
    pytest.param([90, 3], [67, 6], 8, 1, 64, 16, 4.0, 70, id="cap-window-gqa8"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens,heads,kv_heads,head_dim,page_size,logit_cap,window", EXTEND_CASES
)
def test_extend_attention_matches_reference(
    dtype, prefix_lens, extend_lens, heads, kv_heads, head_dim, page_size, logit_cap, window
):
    gen = torch.Generator().manual_seed(hash((tuple(prefix_lens), tuple(extend_lens))) % 2**31)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    req_to_token, rows, num_slots = random_paged_table(seq_lens, page_size, gen)
    k_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    extend_lens_t = torch.tensor(extend_lens)
    extend_start = torch.cumsum(extend_lens_t, 0) - extend_lens_t
    for row, p, e, s in zip(
        rows.tolist(), prefix_lens, extend_lens, extend_start.tolist(), strict=True
    ):
        slots = req_to_token[row, p : p + e].long()  # the new tokens live in the pool too
        k_buffer[slots], v_buffer[slots] = k[s : s + e], v[s : s + e]
    args = (
        q, k, v, k_buffer, v_buffer, req_to_token, rows, torch.tensor(prefix_lens),
        extend_lens_t, extend_start, head_dim**-0.5, logit_cap, window,
    )  # fmt: skip

    out = torch.full_like(q, float("nan"))
    extend_attention(*args, out=out)
    ref = extend_attention_ref(*args)
    assert_rel_close(out, ref, dtype)


def test_extend_reference_is_causal_sdpa_over_whole_sequence():
    gen = torch.Generator().manual_seed(1)
    prefix_len, extend_len = 11, 6
    req_to_token, rows, num_slots = random_paged_table([prefix_len + extend_len], 4, gen)
    k_buffer = torch.randn(num_slots, 1, 16, generator=gen)
    v_buffer = torch.randn(num_slots, 1, 16, generator=gen)
    slots = req_to_token[rows[0], : prefix_len + extend_len].long()
    q_all = torch.randn(prefix_len + extend_len, 2, 16, generator=gen)
    q = q_all[prefix_len:]
    k, v = k_buffer[slots[prefix_len:]], v_buffer[slots[prefix_len:]]
    ref = extend_attention_ref(
        q, k, v, k_buffer, v_buffer, req_to_token, rows, torch.tensor([prefix_len]),
        torch.tensor([extend_len]), torch.tensor([0]), 0.25,
    )  # fmt: skip
    k_full = k_buffer[slots].transpose(0, 1).expand(2, -1, -1)
    v_full = v_buffer[slots].transpose(0, 1).expand(2, -1, -1)
    full = F.scaled_dot_product_attention(
        q_all.transpose(0, 1), k_full, v_full, is_causal=True, scale=0.25
    ).transpose(0, 1)
    torch.testing.assert_close(ref, full[prefix_len:], rtol=1e-5, atol=1e-5)


def test_decode_equals_last_row_of_extend():
    """Decoding token n over n cached keys is extending by that one token: same semantics."""
    gen = torch.Generator().manual_seed(2)
    req_to_token, rows, num_slots = random_paged_table([25], 16, gen)
    k_buffer = torch.randn(num_slots, 2, 64, generator=gen)
    v_buffer = torch.randn(num_slots, 2, 64, generator=gen)
    q = torch.randn(1, 8, 64, generator=gen)
    last = req_to_token[rows[0], 24].long()
    one, lens = torch.tensor([1]), torch.tensor([25])
    for window, cap in ((-1, 0.0), (6, 10.0)):
        dec = decode_attention(q, k_buffer, v_buffer, req_to_token, rows, lens, 0.2, cap, window)
        ext = extend_attention(
            q, k_buffer[last][None], v_buffer[last][None], k_buffer, v_buffer, req_to_token, rows,
            torch.tensor([24]), one, torch.tensor([0]), 0.2, cap, window,
        )  # fmt: skip
        torch.testing.assert_close(dec, ext, rtol=1e-5, atol=1e-5)


def test_bad_shapes_raise_value_error():
    q = torch.randn(2, 4, 64)
    k = torch.randn(2, 2, 64)
    k_buffer = torch.randn(10, 2, 64)
    r2t = torch.zeros(2, 8, dtype=torch.int32)
    idx, lens = torch.tensor([0, 1]), torch.tensor([3, 1])
    with pytest.raises(ValueError, match="extend_lens"):
        extend_attention(q, k, k, k_buffer, k_buffer, r2t, idx, lens, lens[:1], lens, 1.0)
    with pytest.raises(ValueError, match="k/v buffers"):
        extend_attention(q, k, k, k_buffer[:, :1], k_buffer[:, :1], r2t, idx, lens, lens, lens, 1.0)
