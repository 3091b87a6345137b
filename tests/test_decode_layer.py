"""The fused CPU decode sublayers (kernels/decode_layer.py) against their torch references
(kernels/reference.py): projections of every weight kind, the attention sublayer over a paged
pool (GQA, bias, q/k norm, partial rotary, sliding window, ragged batches) and the MLP sublayer,
in float32 and bfloat16; a whole stack bound once (DecodeLayers) gives the sublayer ops' bits;
bad arguments raise errors that name them."""

from __future__ import annotations

import time

import pytest
import torch

from radixflow.kernels.cpu_build import current_choice
from radixflow.kernels.decode_layer import (
    AttentionWeights,
    DecodeLayers,
    MlpWeights,
    PagedKV,
    Projection,
    decode_attention_block,
    decode_linear,
    decode_mlp_block,
)
from radixflow.kernels.reference import (
    decode_attention_block_ref,
    decode_linear_ref,
    decode_mlp_block_ref,
)
from radixflow.kernels.testing import random_gguf_weight, relative_error

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)

# fp32: the same weights, only the order of fp32 sums differs; bf16: the references round
# differently inside (rotary, attention), a few bf16 ulps on top
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
DTYPES = list(TOLERANCE)
KINDS = [
    "",
    "q4_0",
    "q4_1",
    "q8_0",
    "q4_k",
    "q6_k",
    "q4_0x16",
    "q4_1x16",
    "q8_0x16",
    "q4_kx16",
    "q6_kx16",
]  # "": a float weight


K_QUANTS = ("q4_k", "q6_k", "q4_kx16", "q6_kx16")  # K a multiple of 256


def weight(kind: str, n: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if not kind:
        return (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
    return random_gguf_weight(kind, n, k, gen)[0]


def projection(kinds: list[str], rows: list[int], k: int, dtype, gen, bias=False) -> Projection:
    weights = tuple(weight(q, n, k, dtype, gen) for q, n in zip(kinds, rows, strict=True))
    b = torch.randn(sum(rows), generator=gen).to(dtype) if bias else None
    return Projection(weights, tuple(kinds), b)


@pytest.mark.parametrize("int8", [False, True], ids=["", "int8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", KINDS, ids=lambda q: q or "float")
def test_linear_matches_the_reference(kind, dtype, int8):
    gen = torch.Generator().manual_seed(len(kind))
    k = 512  # two K-quant blocks, sixteen of the others
    proj = projection([kind], [72], k, dtype, gen, bias=True)
    for rows in (1, 3, 8):
        x = torch.randn(rows, k, generator=gen).to(dtype)
        got = decode_linear(x, proj, int8)
        assert got.shape == (rows, 72) and got.dtype == dtype
        err = relative_error(got, decode_linear_ref(x, proj, int8))
        assert err < TOLERANCE[dtype], f"{kind} M={rows}: {err:.2e}"


def test_a_projection_of_mixed_segments_concatenates_them():
    gen = torch.Generator().manual_seed(1)
    kinds = ["q4_k", "q4_1", "q6_k", "q8_0", "q4_1x16", "q4_kx16", "q6_kx16"]
    proj = projection(kinds, [32, 48, 16, 8, 40, 24, 19], 256, torch.float32, gen)
    x = torch.randn(2, 256, generator=gen)
    assert relative_error(decode_linear(x, proj), decode_linear_ref(x, proj)) < 2e-5


# (heads, kv_heads, head_dim, rotary_dim, qkv bias, q/k norm, sliding window)
LAYOUTS = {
    "llama-gqa": (4, 2, 32, 32, False, False, -1),
    "qwen2-bias": (4, 4, 32, 32, True, False, -1),
    "qwen3-qk-norm": (8, 2, 64, 64, False, True, -1),
    "partial-rotary-window": (4, 1, 48, 32, False, False, 6),
}


def attention_case(layout, kind: str, dtype, seq_lens: list[int], gen, int8: bool = False):
    heads, kv_heads, head_dim, rotary_dim, bias, qk_norm, window = layout
    hidden = 128
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    k_qkv = 256 if kind in K_QUANTS else hidden
    hidden = k_qkv
    kinds = [kind]
    w = AttentionWeights(
        norm=(1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype),
        eps=1e-6,
        qkv=projection(kinds, [q_size + 2 * kv_size], hidden, dtype, gen, bias=bias),
        o=projection(["" if kind in K_QUANTS else kind], [hidden], q_size, dtype, gen),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        q_norm=(1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype) if qk_norm else None,
        k_norm=(1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype) if qk_norm else None,
        sliding_window=window,
        int8_activations=int8,
    )
    batch, slots = len(seq_lens), 256
    k_buffer = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    req_to_token = torch.zeros(batch + 2, 64, dtype=torch.int32)
    order = torch.randperm(slots, generator=gen)
    rows = torch.tensor([2, 0, 3][:batch], dtype=torch.int64)
    for i, (row, n) in enumerate(zip(rows.tolist(), seq_lens, strict=True)):
        req_to_token[row, :n] = order[64 * i : 64 * i + n].int()
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    loc = req_to_token[rows, lens - 1].long()
    kv = PagedKV(k_buffer, v_buffer, loc, req_to_token, rows, lens)
    angles = torch.rand(batch, rotary_dim // 2, generator=gen) * 6
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
    x = torch.randn(batch, hidden, generator=gen).to(dtype)
    return w, kv, cos_sin, x


def clone_kv(kv: PagedKV) -> PagedKV:
    return PagedKV(kv.k_buffer.clone(), kv.v_buffer.clone(), *list(vars(kv).values())[2:])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "kind", ["", "q4_1", "q8_0", "q4_k", "q4_1+int8", "q8_0+int8"], ids=lambda q: q or "float"
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_attention_block_matches_the_reference(layout, kind, dtype):
    gen = torch.Generator().manual_seed(7)
    kind, int8 = kind.removesuffix("+int8"), kind.endswith("+int8")
    w, kv, cos_sin, x = attention_case(LAYOUTS[layout], kind, dtype, [9, 1, 23], gen, int8)
    for with_residual in (False, True):
        residual = torch.randn(x.shape, generator=gen).to(dtype) if with_residual else None
        ref_kv, ref_residual = clone_kv(kv), None if residual is None else residual.clone()
        got = decode_attention_block(x, residual, w, cos_sin, kv)
        ref = decode_attention_block_ref(x, ref_residual, w, cos_sin, ref_kv)
        err = relative_error(got, ref)
        assert err < TOLERANCE[dtype], f"{layout} {kind}: output {err:.2e}"
        if residual is not None:
            assert torch.equal(residual, ref_residual)
        for name in ("k_buffer", "v_buffer"):
            stored = getattr(kv, name)[kv.out_cache_loc]
            expected = getattr(ref_kv, name)[kv.out_cache_loc]
            assert relative_error(stored, expected) < TOLERANCE[dtype], name


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "kind", ["", "q4_0", "q4_1", "q6_k", "q4_0+int8", "q8_0+int8"], ids=lambda q: q or "float"
)
def test_mlp_block_matches_the_reference(kind, dtype):
    gen = torch.Generator().manual_seed(3)
    kind, int8 = kind.removesuffix("+int8"), kind.endswith("+int8")
    hidden, inter = 256, 512
    w = MlpWeights(
        norm=(1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype),
        eps=1e-5,
        gate_up=projection([kind, kind], [inter, inter], hidden, dtype, gen),
        down=projection([kind], [hidden], inter, dtype, gen),
        int8_activations=int8,
    )
    for rows in (1, 5):
        x = torch.randn(rows, hidden, generator=gen).to(dtype)
        residual = torch.randn(rows, hidden, generator=gen).to(dtype)
        ref_residual = residual.clone()
        got = decode_mlp_block(x, residual, w)
        ref = decode_mlp_block_ref(x, ref_residual, w)
        assert relative_error(got, ref) < TOLERANCE[dtype]
        assert torch.equal(residual, ref_residual)


def test_bad_arguments_raise_errors_naming_them():
    gen = torch.Generator().manual_seed(0)
    proj = projection(["q4_1"], [32], 64, torch.float32, gen)
    with pytest.raises(RuntimeError, match="1 to 8 rows"):
        decode_linear(torch.randn(9, 64), proj)
    with pytest.raises(RuntimeError, match="one qtype per weight segment"):
        decode_linear(torch.randn(1, 64), Projection(proj.weights, ("q4_1", "q8_0")))
    with pytest.raises(RuntimeError, match="q4_1 rows of K=96 take 60 bytes, got 40"):
        decode_linear(torch.randn(1, 96), proj)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        decode_linear(torch.randn(1, 64, dtype=torch.float64), proj)
    w, kv, cos_sin, x = attention_case(LAYOUTS["llama-gqa"], "q8_0", torch.float32, [4], gen)
    bad = AttentionWeights(**{**vars(w), "num_kv_heads": 4})
    with pytest.raises(RuntimeError, match="qkv must have"):
        decode_attention_block(x, None, bad, cos_sin, kv)


def stack_case(kind: str, dtype: torch.dtype, int8: bool, gen: torch.Generator):
    """Three layers (attention over 3 requests in one pool, K/V buffers per layer in a
    shuffled order) and an MLP of the same hidden size."""
    layers, k_buffers, v_buffers, step = [], [], [], None
    for i in range(3):
        w, kv, cos_sin, x = attention_case(LAYOUTS["llama-gqa"], kind, dtype, [9, 1, 23], gen, int8)
        if step is None:
            step, step_cos_sin, step_x = kv, cos_sin, x
        # one step: every layer's tokens sit at the first layer's places in its own pool
        kv = PagedKV(kv.k_buffer, kv.v_buffer, *list(vars(step).values())[2:])
        hidden = w.norm.shape[0]
        mlp = MlpWeights(
            norm=(1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype),
            eps=1e-5,
            gate_up=projection([kind, kind], [192, 192], hidden, dtype, gen),
            down=projection([kind], [hidden], 192, dtype, gen),
            int8_activations=int8,
        )
        layers.append((w, mlp, 2 - i, kv))
        k_buffers.insert(0, kv.k_buffer)
        v_buffers.insert(0, kv.v_buffer)
    return layers, k_buffers, v_buffers, step_cos_sin, step_x


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["q4_1+int8", "q8_0", ""], ids=lambda q: q or "float")
def test_bound_layers_give_the_sublayer_ops_bits(kind, dtype):
    gen = torch.Generator().manual_seed(11)
    kind, int8 = kind.removesuffix("+int8"), kind.endswith("+int8")
    layers, k_buffers, v_buffers, cos_sin, x = stack_case(kind, dtype, int8, gen)
    ops_k = [b.clone() for b in k_buffers]
    ops_v = [b.clone() for b in v_buffers]
    # the layer loop of runtime/layers/decode_block.py, one op per sublayer
    h, residual = x.clone(), None
    for w, mlp, kv_index, kv in layers:
        kv = PagedKV(ops_k[kv_index], ops_v[kv_index], *list(vars(kv).values())[2:])
        attn = decode_attention_block(h, residual, w, cos_sin, kv)
        residual = h if residual is None else residual
        h = decode_mlp_block(attn, residual, mlp)
    stack = DecodeLayers([(w, mlp, kv_index) for w, mlp, kv_index, _ in layers])
    assert len(stack) == 3
    step = layers[0][3]
    stacked_x = x.clone()
    stack.warm_first()  # prefetches only: the bits stay the ops'
    got, got_residual = stack.forward(
        stacked_x, cos_sin, k_buffers, v_buffers, step.out_cache_loc, step.req_to_token,
        step.req_pool_indices, step.seq_lens,
    )  # fmt: skip
    assert torch.equal(got, h) and torch.equal(got_residual, residual)
    assert got_residual.data_ptr() == stacked_x.data_ptr()  # x became the residual stream
    for ours, theirs in zip(k_buffers + v_buffers, ops_k + ops_v, strict=True):
        assert torch.equal(ours, theirs)


def test_a_warm_over_weights_freed_meanwhile_cannot_fault():
    """warm_first has a helper thread pull the first layer's weights towards the caches until
    the next parallel matmul; weights freed meanwhile (a model dropped) are only prefetched,
    never read, and the pool goes on working."""
    gen = torch.Generator().manual_seed(3)
    layers, k_buffers, v_buffers, cos_sin, x = stack_case("q8_0", torch.float32, False, gen)
    w, mlp, _, step = layers[0]
    hidden = w.norm.shape[0]
    # past glibc's largest mmap threshold (32 MiB): freeing it unmaps it
    wide = MlpWeights(mlp.norm, mlp.eps, projection(["q8_0"], [2**18], hidden, torch.float32, gen),
                      projection(["q8_0"], [hidden], 2**17, torch.float32, gen))  # fmt: skip
    stack = DecodeLayers([(w, wide, 0)])
    args = (step.out_cache_loc, step.req_to_token, step.req_pool_indices, step.seq_lens)
    stack.forward(x.clone(), cos_sin, k_buffers, v_buffers, *args)  # the helpers start
    stack.warm_first()
    del stack, wide
    time.sleep(0.05)
    proj = projection(["q8_0"], [64], hidden, torch.float32, gen)
    got = decode_linear(x, proj)
    assert relative_error(got, decode_linear_ref(x, proj)) < TOLERANCE[torch.float32]


def test_bound_layers_reject_bad_layers_and_steps():
    gen = torch.Generator().manual_seed(5)
    layers, k_buffers, v_buffers, cos_sin, x = stack_case("q8_0", torch.float32, False, gen)
    w, mlp, _, step = layers[0]
    with pytest.raises(RuntimeError, match="qkv must have"):
        DecodeLayers([(AttentionWeights(**{**vars(w), "num_kv_heads": 4}), mlp, 0)])
    narrow = MlpWeights(**{**vars(mlp), "norm": mlp.norm[:64]})
    with pytest.raises(RuntimeError, match=r"the MLP norm's weight must be a contiguous \[128\]"):
        DecodeLayers([(w, mlp, 0), (w, narrow, 1)])
    stack = DecodeLayers([(w, mlp, 5)])
    args = (step.out_cache_loc, step.req_to_token, step.req_pool_indices, step.seq_lens)
    with pytest.raises(RuntimeError, match="no K/V buffer at index 5"):
        stack.forward(x.clone(), cos_sin, k_buffers, v_buffers, *args)
    stack = DecodeLayers([(w, mlp, 0)])
    outside = torch.full_like(step.out_cache_loc, 10**6)
    with pytest.raises(RuntimeError, match="outside the pool's 256 slots"):
        stack.forward(x.clone(), cos_sin, k_buffers, v_buffers, outside, *args[1:])
    with pytest.raises(RuntimeError, match="in the layers' dtype"):
        stack.forward(x.bfloat16(), cos_sin, k_buffers, v_buffers, *args)
