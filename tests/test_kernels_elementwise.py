"""RMSNorm, rotary, KV store and token bitmask kernels (Triton interpreter) vs their references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.grammars import allocate_token_bitmask
from radixflow.kernels.bitmask import apply_token_bitmask
from radixflow.kernels.norm import fused_add_rms_norm, rms_norm
from radixflow.kernels.reference import (
    apply_token_bitmask_ref,
    bitmask_words,
    fused_add_rms_norm_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    store_kv_ref,
    unpack_token_bitmask,
)
from radixflow.kernels.rotary import rotary_embedding
from radixflow.kernels.store_kv import store_kv
from radixflow.kernels.testing import relative_error

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any()
    assert relative_error(out, ref) < TOLERANCE[dtype]


# -- RMSNorm ---------------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("shape", [(1, 96), (5, 576), (2, 3, 64)])
def test_rms_norm_matches_reference(dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    out = torch.full_like(x, float("nan"))
    rms_norm(x, weight, 1e-6, out=out)
    assert_rel_close(out, rms_norm_ref(x, weight, 1e-6), dtype)
    assert_rel_close(rms_norm(x, weight, 1e-6), out, dtype)


@DTYPES
def test_rms_norm_reference_follows_hf_llama(dtype):
    """HF LlamaRMSNorm: normalise in fp32, cast to the input dtype, then scale by the weight."""
    x = torch.randn(4, 80).to(dtype)
    weight = torch.rand(80).to(dtype)
    expect = F.rms_norm(x.float(), (80,), eps=1e-5).to(dtype) * weight
    torch.testing.assert_close(rms_norm_ref(x, weight, 1e-5), expect)


@DTYPES
@pytest.mark.parametrize("rows", [1, 7])
def test_fused_add_rms_norm_matches_reference_in_place(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 320, generator=gen).to(dtype)
    residual = torch.randn(rows, 320, generator=gen).to(dtype)
    weight = torch.randn(320, generator=gen).to(dtype)
    x_ref, res_ref = x.clone(), residual.clone()
    out_x, out_res = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert out_x is x and out_res is residual
    fused_add_rms_norm_ref(x_ref, res_ref, weight, 1e-6)
    assert_rel_close(residual, res_ref, dtype)
    assert_rel_close(x, x_ref, dtype)


def test_fused_add_rms_norm_reference_is_unfused_residual_then_norm():
    x, residual, weight = (
        torch.randn(3, 64).half(),
        torch.randn(3, 64).half(),
        torch.rand(64).half(),
    )
    expect_res = residual + x
    expect_x = rms_norm_ref(expect_res, weight, 1e-6)
    fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    torch.testing.assert_close(residual, expect_res, rtol=0, atol=0)
    torch.testing.assert_close(x, expect_x, rtol=0, atol=0)


def test_norm_rejects_wrong_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)


# -- rotary ----------------------------------------------------------------------------------


def cos_sin_cache(max_pos: int, rotary_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@DTYPES
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_dim,rotary_dim,heads,kv_heads", [(64, 64, 4, 1), (96, 48, 3, 3)])
def test_rotary_matches_reference_on_qkv_views(
    dtype, is_neox, head_dim, rotary_dim, heads, kv_heads
):
    gen = torch.Generator().manual_seed(head_dim + heads)
    num_tokens = 6
    widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv = torch.randn(num_tokens, sum(widths), generator=gen).to(dtype)
    qkv_ref = qkv.clone()
    positions = torch.randint(0, 300, (num_tokens,), generator=gen)
    cache = cos_sin_cache(300, rotary_dim)
    q, k, _ = qkv.split(widths, dim=1)  # strided views: rotation must land in qkv
    q_ref, k_ref, _ = qkv_ref.split(widths, dim=1)
    rotary_embedding(positions, q, k, cache, head_dim, is_neox)
    rotary_embedding_ref(positions, q_ref, k_ref, cache, head_dim, is_neox)
    assert_rel_close(qkv, qkv_ref, dtype)


def test_rotary_reference_neox_is_rotate_half_and_gptj_is_complex_product():
    head_dim, positions = 32, torch.tensor([0, 5, 17])
    cache = cos_sin_cache(20, head_dim)
    cos, sin = cache[positions, : head_dim // 2], cache[positions, head_dim // 2 :]
    x = torch.randn(3, 2, head_dim)

    q, k = x.clone(), x[:, :1].clone()
    rotary_embedding_ref(positions, q, k, cache, head_dim, is_neox=True)
    cos2, sin2 = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    rotate_half = torch.cat([-x[..., head_dim // 2 :], x[..., : head_dim // 2]], -1)
    torch.testing.assert_close(q, x * cos2 + rotate_half * sin2)
    torch.testing.assert_close(k, (x * cos2 + rotate_half * sin2)[:, :1])

    q, k = x.clone(), x[:, :1].clone()
    rotary_embedding_ref(positions, q, k, cache, head_dim, is_neox=False)
    rotation = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[:, None]
    expect = torch.view_as_real(torch.view_as_complex(x.reshape(3, 2, -1, 2)) * rotation)
    torch.testing.assert_close(q, expect.reshape(3, 2, head_dim), rtol=1e-5, atol=1e-5)


def test_rotary_rejects_odd_rotary_dim():
    q, k = torch.randn(2, 64), torch.randn(2, 64)
    with pytest.raises(ValueError, match="rotary_dim"):
        rotary_embedding(torch.tensor([0, 1]), q, k, torch.randn(4, 7), 64, True)


# -- store_kv --------------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("num_tokens,kv_heads,head_dim", [(1, 1, 64), (9, 2, 96)])
def test_store_kv_writes_exactly_the_given_slots(dtype, num_tokens, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(num_tokens)
    k_buffer = torch.randn(64, kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(64, kv_heads, head_dim, generator=gen).to(dtype)
    loc = torch.randperm(64, generator=gen)[:num_tokens]
    kv = torch.randn(num_tokens, 3, kv_heads * head_dim, generator=gen).to(dtype)
    k = kv[:, 1].view(num_tokens, kv_heads, head_dim)  # strided, like a split of fused qkv
    v = kv[:, 2]  # flat [T, KVH*D]
    k_ref, v_ref = k_buffer.clone(), v_buffer.clone()
    store_kv(k_buffer, v_buffer, loc, k, v)
    store_kv_ref(k_ref, v_ref, loc, k, v)
    assert torch.equal(k_buffer, k_ref) and torch.equal(v_buffer, v_ref)
    assert torch.equal(k_buffer[loc], k)


def test_store_kv_rejects_mismatched_rows():
    buf = torch.zeros(8, 2, 4)
    with pytest.raises(ValueError, match="k must hold"):
        store_kv(buf, buf.clone(), torch.tensor([1, 2]), torch.zeros(2, 7), torch.zeros(2, 8))


# -- token bitmask ---------------------------------------------------------------------------


def random_bitmask(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, (rows, bitmask_words(vocab)), generator=gen).int()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "vocab,logit_width,indices",
    [(1000, 1000, None), (4500, 4500, [3, 1]), (1000, 1030, None), (70, 64, [0])],
    ids=["all-rows", "some-rows", "wider-logits", "narrower-logits"],
)
def test_apply_token_bitmask_matches_reference(dtype, vocab, logit_width, indices):
    gen = torch.Generator().manual_seed(vocab + logit_width)
    logits = torch.randn(4, logit_width, generator=gen).to(dtype)
    bitmask = random_bitmask(4, vocab, gen)
    idx = None if indices is None else torch.tensor(indices)
    expect = logits.clone()
    apply_token_bitmask(logits, bitmask, idx)
    apply_token_bitmask_ref(expect, bitmask, idx)
    assert torch.equal(logits, expect)


def test_bitmask_layout_is_xgrammar():
    """Bit i of word j allows token 32 * j + i; a 0 bit sets the logit to -inf."""
    vocab = 70
    allowed = {0, 31, 32, 33, 63, 64, 69}
    bitmask = allocate_token_bitmask(2, vocab)
    assert bitmask.shape == (2, 3) and bitmask.dtype == torch.int32
    bits = [[1 if 32 * j + i in allowed else 0 for i in range(32)] for j in range(3)]
    words = [sum(b << i for i, b in enumerate(row)) for row in bits]
    bitmask[1] = torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int32)
    unpacked = unpack_token_bitmask(bitmask, vocab)
    assert unpacked[0].all()
    assert set(unpacked[1].nonzero().flatten().tolist()) == allowed

    logits = torch.zeros(2, vocab)
    apply_token_bitmask(logits, bitmask)
    assert not logits[0].isinf().any()
    assert set((logits[1] == 0).nonzero().flatten().tolist()) == allowed
    assert logits[1].isneginf().sum() == vocab - len(allowed)
