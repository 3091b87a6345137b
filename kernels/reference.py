"""The one torch reference of every op, with the argument checks its implementations share.

Every fast implementation (Triton in kernels/*.py, C++ in kernels/cpu_*.py, the torch paths the
model layers bind) has the signature and meaning of one `*_ref` here, and the tests compare it
with that reference on random inputs. Nothing here imports triton, so the references and the
checks load on machines without it. It is longer than one op per file because keeping all
references in one place is the point: there is exactly one answer to "what should this op do".

    rms_norm_ref / fused_add_rms_norm_ref   RMSNorm with HF Llama's rounding, and the residual add
    rotary_embedding_ref                    rotary embedding in place, neox or GPT-J pairs
    silu_and_mul_ref                        SiLU(gate) * up of a fused [gate | up] row
    linear_ref                              x @ weight.T + bias
    quant_linear_ref                        x @ W.T + bias, W packed in ggml blocks (Q8_0 ... Q6_K)
    store_kv_ref                            new K/V into the paged pool
    apply_token_bitmask_ref                 -inf where an xgrammar-layout bitmask forbids a token
    decode_attention_ref                    one query per request over its paged K/V
    extend_attention_ref                    new tokens over their paged prefix plus causal self
    decode_attention_block_ref /            a decode step's attention and MLP sublayers, and
    decode_mlp_block_ref / decode_linear_ref   one projection of weight segments
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixflow.kernels.quant_formats import dequantize, quantize_activations

# -- RMSNorm ---------------------------------------------------------------------------------


def check_norm_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """y = (x / sqrt(mean(x^2) + eps)).to(x.dtype) * w over the last dim, statistics in fp32."""
    check_norm_weight(x, weight)
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = (normed.float() * weight.float()).to(x.dtype)
    if out is None:
        return y
    return out.copy_(y)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x (rounded to residual's dtype), then x = rms_norm(residual)."""
    residual.copy_((x.float() + residual.float()).to(residual.dtype))
    x.copy_(rms_norm_ref(residual, weight, eps))
    return x, residual


# -- rotary embedding ------------------------------------------------------------------------


def heads_view(x: torch.Tensor, num_tokens: int, head_dim: int, name: str) -> torch.Tensor:
    """[T, H*D] or [T, H, D] -> a [T, H, D] view of the same memory (in place needs a view)."""
    if x.shape[0] != num_tokens or x.shape[-1] % head_dim or x.dim() not in (2, 3):
        raise ValueError(f"{name} must be [T, H*{head_dim}] or [T, H, {head_dim}], T={num_tokens}")
    if x.dim() == 3 and x.shape[2] != head_dim:
        raise ValueError(f"{name} head dim {x.shape[2]} != head_dim {head_dim}")
    try:
        view = x.view(num_tokens, -1, head_dim)
    except RuntimeError as e:
        raise ValueError(f"{name} must be viewable as [T, H, D] for in-place rotation") from e
    if view.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim")
    return view


def check_rotary(positions: torch.Tensor, cos_sin_cache: torch.Tensor, head_dim: int) -> int:
    """The rotary dim, after checking the cache [max_position, rotary_dim] and positions [T]."""
    rotary_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_position, rotary_dim] with an even rotary_dim <= "
            f"head_dim {head_dim}, got {tuple(cos_sin_cache.shape)}"
        )
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D, got {tuple(positions.shape)}")
    return rotary_dim


def rotary_embedding_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq*D] (or [T, Hq, D]) and k [T, Hk*D] in place at positions [T].

    cos_sin_cache [max_position, rotary_dim] holds cos in its first half and sin in the second.
    Pair i is (x[i], x[i + rotary_dim/2]) for neox, (x[2i], x[2i + 1]) for GPT-J, and becomes
    (a cos - b sin, b cos + a sin) in fp32, rounded once. Returns (q, k), the same tensors.
    """
    rotary_dim = check_rotary(positions, cos_sin_cache, head_dim)
    half = rotary_dim // 2
    cos_sin = cos_sin_cache[positions].float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    for name, x in (("q", q), ("k", k)):
        view = heads_view(x, positions.shape[0], head_dim, name)
        if is_neox:
            a, b = view[..., :half], view[..., half:rotary_dim]
        else:
            a, b = view[..., 0:rotary_dim:2], view[..., 1:rotary_dim:2]
        af, bf = a.float(), b.float()
        new_a, new_b = af * cos - bf * sin, bf * cos + af * sin
        a.copy_(new_a)
        b.copy_(new_b)
    return q, k


# -- SiLU-and-mul, linear --------------------------------------------------------------------


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(g) * u for gate_up = [g | u] along the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T + bias [N]."""
    return F.linear(x, weight, bias)


def quant_linear_ref(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: str,
    k: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    int8_activations: bool = False,
) -> torch.Tensor:
    """x [M, K] @ W.T + bias, W the [N, K] weight that `packed` (uint8 [N, row_bytes], ggml
    blocks of `qtype`: kernels/quant_formats.py) holds; the result in x's dtype.
    `int8_activations`: x rounded to its int8 grid first (quantize_activations), the product
    in float32, as every path of the CPU kernel then multiplies."""
    if int8_activations:
        fbias = None if bias is None else bias.float()
        weight = dequantize(packed, qtype, k)
        result = F.linear(quantize_activations(x), weight, fbias).to(x.dtype)
    else:
        result = F.linear(x, dequantize(packed, qtype, k).to(x.dtype), bias)
    return result if out is None else out.copy_(result)


# -- KV store --------------------------------------------------------------------------------


def kv_rows(x: torch.Tensor, num_tokens: int, row: int, name: str) -> torch.Tensor:
    """x as [num_tokens, row] with a contiguous last dim."""
    if x.dim() < 1 or x.shape[0] != num_tokens or x.numel() != num_tokens * row:
        raise ValueError(f"{name} must hold [{num_tokens}, {row}] values, got {tuple(x.shape)}")
    flat = x.reshape(num_tokens, row)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def check_store_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor
) -> tuple[int, int]:
    """(tokens to store, values per token) after checking the buffers and loc."""
    if k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape:
        raise ValueError(
            f"k/v buffers must be [S, KVH, D] of one shape, got {tuple(k_buffer.shape)}, "
            f"{tuple(v_buffer.shape)}"
        )
    if not k_buffer.is_contiguous() or not v_buffer.is_contiguous():
        raise ValueError("k/v buffers must be contiguous")
    if loc.dim() != 1:
        raise ValueError(f"loc must be 1-D, got {tuple(loc.shape)}")
    return loc.shape[0], k_buffer.shape[1] * k_buffer.shape[2]


def store_kv_ref(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store k, v ([T, KVH, D] or [T, KVH*D]) at slots loc [T] of the [S, KVH, D] buffers."""
    num_tokens, row = check_store_kv(k_buffer, v_buffer, loc)
    shape = (num_tokens, *k_buffer.shape[1:])
    k_buffer[loc] = kv_rows(k, num_tokens, row, "k").reshape(shape).to(k_buffer.dtype)
    v_buffer[loc] = kv_rows(v, num_tokens, row, "v").reshape(shape).to(v_buffer.dtype)


# -- token bitmask ---------------------------------------------------------------------------
# bitmask [B, ceil(V / 32)] int32: bit i of word j allows token 32 * j + i (xgrammar's layout).


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., words] int32 -> [..., vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def check_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> int:
    """The number of logit columns the bitmask covers, after checking the arguments."""
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected logits [B, V] and bitmask [B, words], got {tuple(logits.shape)} and "
            f"{tuple(bitmask.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if indices is not None and indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got {tuple(indices.shape)}")
    return min(logits.shape[1], 32 * bitmask.shape[1])


def _byte_bias(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: for each byte value, +inf where bit i is set and -inf where it is clear."""
    bits = (torch.arange(256, device=device).unsqueeze(-1) >> torch.arange(8, device=device)) & 1
    return torch.where(bits.bool(), float("inf"), float("-inf"))


_BYTE_BIAS: dict[torch.device, torch.Tensor] = {}


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Set logits[r, t] = -inf where bitmask[r] forbids t, for rows r in indices (default all).

    Logit columns beyond 32 * words and bits beyond the logits' width are ignored. Each bitmask
    byte looks up 8 bias values (+inf allowed, -inf forbidden) and `minimum(logit, bias)` masks
    the whole batch in one elementwise op (a NaN logit stays NaN, where the Triton kernel writes
    -inf over a forbidden one). Fast enough to be the CPU path too.
    """
    vocab = check_bitmask(logits, bitmask, indices)
    if vocab == 0 or (indices is not None and indices.shape[0] == 0):
        return
    table = _BYTE_BIAS.get(logits.device)
    if table is None:
        table = _BYTE_BIAS.setdefault(logits.device, _byte_bias(logits.device))
    words = bitmask if indices is None else bitmask[indices.long()]
    # byte k of word j holds tokens 32j+8k .. 32j+8k+7
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=words.device)
    data = ((words.unsqueeze(-1) >> shifts) & 0xFF).flatten(-2).long()
    bias = F.embedding(data, table).flatten(-2)[:, :vocab].to(logits.dtype)
    if indices is None:
        view = logits[:, :vocab]
        torch.minimum(view, bias, out=view)
    else:
        rows = indices.long()
        logits[rows, :vocab] = torch.minimum(logits[rows, :vocab], bias)


# -- paged attention -------------------------------------------------------------------------


def _check_attention_knobs(logit_cap: float, sliding_window: int) -> None:
    if logit_cap < 0:
        raise ValueError(f"logit_cap must be >= 0 (0 disables), got {logit_cap}")
    if sliding_window == 0 or sliding_window < -1:
        raise ValueError(f"sliding_window must be positive or -1, got {sliding_window}")


def _check_out(q: torch.Tensor, out: torch.Tensor | None) -> None:
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim, got "
            f"{tuple(out.shape)} {out.dtype}"
        )


def check_decode_args(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    logit_cap: float,
    sliding_window: int,
    num_kv_splits: int | None,
    out: torch.Tensor | None,
) -> None:
    """ValueError naming the first argument of a paged decode-attention call that is wrong."""
    if q.dim() != 3 or k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape:
        raise ValueError(
            f"expected q [B,H,D] and k/v buffers [S,KVH,D] of one shape, got q {tuple(q.shape)}, "
            f"k_buffer {tuple(k_buffer.shape)}, v_buffer {tuple(v_buffer.shape)}"
        )
    if q.shape[2] != k_buffer.shape[2] or q.shape[1] % k_buffer.shape[1] != 0:
        raise ValueError(
            f"q heads/dim {tuple(q.shape[1:])} do not fit KV heads/dim {tuple(k_buffer.shape[1:])}"
        )
    if req_pool_indices.shape != (q.shape[0],) or seq_lens.shape != (q.shape[0],):
        raise ValueError(
            f"req_pool_indices {tuple(req_pool_indices.shape)} and seq_lens "
            f"{tuple(seq_lens.shape)} must both be [{q.shape[0]}]"
        )
    if req_to_token.dim() != 2:
        raise ValueError(f"req_to_token must be 2-D, got {tuple(req_to_token.shape)}")
    _check_attention_knobs(logit_cap, sliding_window)
    if num_kv_splits is not None and not 1 <= num_kv_splits <= 256:
        raise ValueError(f"num_kv_splits must be in [1, 256], got {num_kv_splits}")
    _check_out(q, out)


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, D] over each request's paged K/V; returns o [B, H, D] (into out).

    Request i reads slots req_to_token[req_pool_indices[i], :seq_lens[i]] of k_buffer/v_buffer
    [S, KVH, D]; query head h uses KV head h // (H // KVH). Scores are q.k * sm_scale,
    soft-capped to logit_cap * tanh(score / logit_cap) when logit_cap > 0; with
    sliding_window > 0 the query sees only its last sliding_window keys. fp32 math;
    num_kv_splits (a kernel tuning knob) has no effect.
    """
    check_decode_args(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
        logit_cap, sliding_window, num_kv_splits, out,
    )  # fmt: skip
    group = q.shape[1] // k_buffer.shape[1]
    if out is None:
        out = torch.empty_like(q)
    for i, (row, seq_len) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        start = max(0, seq_len - sliding_window) if sliding_window > 0 else 0
        slots = req_to_token[row, start:seq_len].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].float(), k) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def check_extend_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start: torch.Tensor,
    logit_cap: float,
    sliding_window: int,
    out: torch.Tensor | None,
) -> None:
    """ValueError naming the first argument of an extend-attention call that is wrong."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or k.shape[0] != q.shape[0]:
        raise ValueError(
            f"expected q [T,H,D] and k, v [T,KVH,D], got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape or k_buffer.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"k/v buffers {tuple(k_buffer.shape)}, {tuple(v_buffer.shape)} must be [S, KVH, D] "
            f"with KVH, D = {tuple(k.shape[1:])}"
        )
    if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q heads/dim {tuple(q.shape[1:])} do not fit KV {tuple(k.shape[1:])}")
    batch = req_pool_indices.shape[0]
    for name, t in (("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                    ("extend_start", extend_start)):  # fmt: skip
        if t.shape != (batch,):
            raise ValueError(
                f"{name} must be [{batch}] like req_pool_indices, got {tuple(t.shape)}"
            )
    if req_to_token.dim() != 2:
        raise ValueError(f"req_to_token must be 2-D, got {tuple(req_to_token.shape)}")
    _check_attention_knobs(logit_cap, sliding_window)
    _check_out(q, out)


def extend_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the new tokens q [T, H, D] over prefix + causal new keys; returns o [T, H, D].

    Request i owns rows [extend_start[i], extend_start[i] + extend_lens[i]) of q/k/v; its new
    token j sits at position prefix_lens[i] + j and sees the prefix (slots
    req_to_token[req_pool_indices[i], :prefix_lens[i]] of the pool) and new keys up to itself,
    only the last sliding_window of them when sliding_window > 0. fp32 math; max_extend_len (a
    kernel grid size) has no effect.
    """
    check_extend_args(
        q, k, v, k_buffer, v_buffer, req_to_token, req_pool_indices,
        prefix_lens, extend_lens, extend_start, logit_cap, sliding_window, out,
    )  # fmt: skip
    group = q.shape[1] // k.shape[1]
    if out is None:
        out = torch.empty_like(q)
    rows = zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist(),
        extend_start.tolist(), strict=True,
    )  # fmt: skip
    for row, prefix_len, extend_len, tok0 in rows:
        new = slice(tok0, tok0 + extend_len)
        slots = req_to_token[row, :prefix_len].long()
        keys = torch.cat([k_buffer[slots], k[new]]).float().repeat_interleave(group, dim=1)
        values = torch.cat([v_buffer[slots], v[new]]).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,lhd->htl", q[new].float(), keys) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        q_pos = torch.arange(prefix_len, prefix_len + extend_len, device=q.device)[:, None]
        k_pos = torch.arange(prefix_len + extend_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window > 0:
            visible &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[new] = torch.einsum("htl,lhd->thd", scores.softmax(-1), values).to(q.dtype)
    return out


# -- decode-step sublayers (kernels/decode_layer.py) -----------------------------------------

if TYPE_CHECKING:
    from radixflow.kernels.decode_layer import AttentionWeights, MlpWeights, PagedKV, Projection


def decode_linear_ref(
    x: torch.Tensor, proj: Projection, int8_activations: bool = False
) -> torch.Tensor:
    """x [M, K] @ W.T + bias, W the segments of `proj` by output rows ("" = float weight)."""
    outs, first = [], 0
    for weight, qtype in zip(proj.weights, proj.qtypes, strict=True):
        rows = weight.shape[0]
        bias = None if proj.bias is None else proj.bias[first : first + rows]
        if qtype:
            outs.append(
                quant_linear_ref(x, weight, qtype, x.shape[1], bias, None, int8_activations)
            )
        else:
            outs.append(linear_ref(x, weight, bias))
        first += rows
    return torch.cat(outs, dim=-1)


def decode_attention_block_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    w: AttentionWeights,
    cos_sin: torch.Tensor,
    kv: PagedKV,
) -> torch.Tensor:
    """[residual += x]; rms_norm; q|k|v; [per-head q/k rms_norm]; rotary by cos_sin
    [T, rotary_dim]; K/V stored at out_cache_loc; decode attention; o projection."""
    if residual is not None:
        residual.copy_((x.float() + residual.float()).to(residual.dtype))
    h = rms_norm_ref(x if residual is None else residual, w.norm, w.eps)
    qkv = decode_linear_ref(h, w.qkv, w.int8_activations)
    tokens, q_size, kv_size = x.shape[0], w.num_heads * w.head_dim, w.num_kv_heads * w.head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(tokens, w.num_heads, w.head_dim)
    k = k.reshape(tokens, w.num_kv_heads, w.head_dim)
    if w.q_norm is not None and w.k_norm is not None:
        q, k = rms_norm_ref(q, w.q_norm, w.eps), rms_norm_ref(k, w.k_norm, w.eps)
    q, k = q.contiguous(), k.contiguous()
    rotary_embedding_ref(torch.arange(tokens), q, k, cos_sin, w.head_dim, True)
    store_kv_ref(kv.k_buffer, kv.v_buffer, kv.out_cache_loc, k, v)
    attn = decode_attention_ref(
        q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.req_pool_indices, kv.seq_lens,
        w.scale, w.logit_cap, w.sliding_window,
    )  # fmt: skip
    return decode_linear_ref(attn.reshape(tokens, q_size), w.o, w.int8_activations)


def decode_mlp_block_ref(x: torch.Tensor, residual: torch.Tensor, w: MlpWeights) -> torch.Tensor:
    """residual += x; down(silu_and_mul(gate_up(rms_norm(residual))))."""
    residual.copy_((x.float() + residual.float()).to(residual.dtype))
    gate_up = decode_linear_ref(
        rms_norm_ref(residual, w.norm, w.eps), w.gate_up, w.int8_activations
    )
    return decode_linear_ref(silu_and_mul_ref(gate_up), w.down, w.int8_activations)
