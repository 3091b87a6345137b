"""Check every Triton kernel against its torch reference on a CUDA GPU, and time it.

    python benchmarks/kernels_gpu.py

For each kernel and case, in bf16 and fp16: the max error relative to the reference's largest
value (fp32 math in the reference), the kernel's time, the best torch alternative's time
(torch SDPA for attention, HF-style torch RMSNorm, the torch twin elsewhere) and what the kernel
achieves: GB/s for memory-bound kernels, TFLOP/s for extend attention, each also as a share of
this machine's measured copy bandwidth / bf16 matmul rate. Takes a few minutes on an H200.
Attention shapes are Llama-3-8B's: 32 query heads, 8 KV heads, head dim 128; page size 16.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench

from radixflow.kernels.bitmask import apply_token_bitmask
from radixflow.kernels.decode_attention import choose_num_kv_splits, decode_attention
from radixflow.kernels.extend_attention import extend_attention
from radixflow.kernels.norm import fused_add_rms_norm, rms_norm
from radixflow.kernels.quant_triton import quant_linear_triton
from radixflow.kernels.reference import (
    apply_token_bitmask_ref,
    decode_attention_ref,
    extend_attention_ref,
    fused_add_rms_norm_ref,
    quant_linear_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    store_kv_ref,
)
from radixflow.kernels.rotary import rotary_embedding
from radixflow.kernels.store_kv import store_kv
from radixflow.kernels.testing import random_gguf_weight, random_paged_table

HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
SCALE, EPS = HEAD_DIM**-0.5, 1e-5
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


@dataclass
class Row:
    kernel: str
    case: str
    dtype: torch.dtype
    error: float  # max |out - ref| / max |ref|
    triton_ms: float
    torch_ms: float | None
    torch_what: str
    achieved: float  # GB/s or TFLOP/s
    unit: str
    peak: float  # the machine's measured figure in the same unit

    @property
    def ok(self) -> bool:
        return self.error < TOLERANCE[self.dtype]


@dataclass(frozen=True)
class Machine:
    device: torch.device
    copy_gbs: float  # measured copy bandwidth, read + write
    matmul_tflops: float  # measured bf16 matmul rate


def bench(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


def bench_torch(fn: Callable[[], object]) -> float | None:
    """Time a torch alternative; None (reported as n/a) when this torch build cannot run it."""
    try:
        fn()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        print(f"  torch alternative unavailable: {str(e).splitlines()[0][:100]}")
        return None
    return bench(fn)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.isnan().any():
        return float("nan")
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


def measure_machine(device: torch.device) -> Machine:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))
    size = 8192
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    mm_ms = bench(lambda: torch.mm(a, b))
    return Machine(device, 2 * n / copy_ms / 1e6, 2 * size**3 / mm_ms / 1e9)


def paged(seq_lens: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator().manual_seed(len(seq_lens) * 7919 + sum(seq_lens))
    table, rows, slots = random_paged_table(seq_lens, PAGE_SIZE, gen, max_reqs=len(seq_lens))
    return table.to(device), rows.to(device), slots


def decode_case(batch: int, ctx: int, dtype: torch.dtype, m: Machine) -> Row:
    table, rows, num_slots = paged([ctx] * batch, m.device)
    k_buffer = torch.randn(num_slots, KV_HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    v_buffer = torch.randn_like(k_buffer)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    seq_lens = torch.full((batch,), ctx, device=m.device)
    args = (q, k_buffer, v_buffer, table, rows, seq_lens, SCALE)
    err = rel_error(decode_attention(*args), decode_attention_ref(*args))
    # the split count from host-side lengths, as the engine's Triton backend passes it (left
    # to the kernel, it reads seq_lens.max(): a device sync)
    splits = choose_num_kv_splits(batch * KV_HEADS, ctx)
    triton_ms = bench(lambda: decode_attention(*args, num_kv_splits=splits))

    def gather_then_sdpa() -> torch.Tensor:
        slots = table[rows, :ctx].long()
        k = k_buffer[slots].transpose(1, 2)  # [B, KVH, L, D]
        v = v_buffer[slots].transpose(1, 2)
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=SCALE, enable_gqa=True)

    torch_ms = bench_torch(gather_then_sdpa)
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k_buffer.element_size()
    moved = kv_bytes + batch * ctx * 4 + 2 * q.numel() * q.element_size()
    return Row(
        "decode_attention", f"B={batch} ctx={ctx}", dtype, err, triton_ms, torch_ms,
        "gather + sdpa", moved / triton_ms / 1e6, "GB/s", m.copy_gbs,
    )  # fmt: skip


def extend_case(batch: int, prefix: int, ext: int, dtype: torch.dtype, m: Machine) -> Row:
    seq = prefix + ext
    table, rows, num_slots = paged([seq] * batch, m.device)
    k_buffer = torch.randn(num_slots, KV_HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    v_buffer = torch.randn_like(k_buffer)
    q = torch.randn(batch * ext, HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    new_slots = table[rows, prefix:seq].reshape(-1).long()
    k, v = k_buffer[new_slots], v_buffer[new_slots]  # the new tokens, already in the pool
    prefix_lens = torch.full((batch,), prefix, device=m.device)
    extend_lens = torch.full((batch,), ext, device=m.device)
    extend_start = torch.arange(batch, device=m.device) * ext
    args = (q, k, v, k_buffer, v_buffer, table, rows, prefix_lens, extend_lens, extend_start, SCALE)
    err = rel_error(extend_attention(*args), extend_attention_ref(*args))
    triton_ms = bench(lambda: extend_attention(*args, max_extend_len=ext))

    slots = table[rows, :seq].long()
    group = HEADS // KV_HEADS
    k_dense = k_buffer[slots].transpose(1, 2).repeat_interleave(group, 1).contiguous()
    v_dense = v_buffer[slots].transpose(1, 2).repeat_interleave(group, 1).contiguous()
    q_dense = q.view(batch, ext, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    mask = None if prefix == 0 else causal_lower_right(ext, seq)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_dense, k_dense, v_dense, attn_mask=mask, is_causal=mask is None, scale=SCALE
        )

    torch_ms = bench_torch(sdpa)
    visible_pairs = batch * (ext * prefix + ext * (ext + 1) / 2)
    flops = 4 * HEADS * HEAD_DIM * visible_pairs
    return Row(
        "extend_attention", f"B={batch} prefix={prefix} new={ext}", dtype, err, triton_ms,
        torch_ms, "sdpa on dense K/V", flops / triton_ms / 1e9, "TFLOP/s", m.matmul_tflops,
    )  # fmt: skip


def memory_row(
    kernel: str, case: str, dtype: torch.dtype, err: float, fast: Callable[[], object],
    slow: Callable[[], object], what: str, moved_bytes: int, m: Machine,
) -> Row:  # fmt: skip
    triton_ms = bench(fast)
    return Row(
        kernel, case, dtype, err, triton_ms, bench_torch(slow), what,
        moved_bytes / triton_ms / 1e6, "GB/s", m.copy_gbs,
    )  # fmt: skip


def norm_rows(tokens: int, hidden: int, dtype: torch.dtype, m: Machine) -> list[Row]:
    x = torch.randn(tokens, hidden, dtype=dtype, device=m.device)
    w = torch.rand(hidden, dtype=dtype, device=m.device)
    nbytes = x.numel() * x.element_size()
    case = f"T={tokens} N={hidden}"
    err = rel_error(rms_norm(x, w, EPS), rms_norm_ref(x, w, EPS))
    plain = memory_row(
        "rms_norm", case, dtype, err, lambda: rms_norm(x, w, EPS),
        lambda: rms_norm_ref(x, w, EPS), "torch RMSNorm (HF)", 2 * nbytes, m,
    )  # fmt: skip
    r = torch.randn_like(x)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    fused_add_rms_norm(x1, r1, w, EPS)
    fused_add_rms_norm_ref(x2, r2, w, EPS)
    err = rel_error(torch.cat([x1, r1]), torch.cat([x2, r2]))
    fused = memory_row(
        "fused_add_rms_norm", case, dtype, err, lambda: fused_add_rms_norm(x1, r1, w, EPS),
        lambda: fused_add_rms_norm_ref(x2, r2, w, EPS), "torch add + RMSNorm", 4 * nbytes, m,
    )  # fmt: skip
    return [plain, fused]


def rotary_row(tokens: int, dtype: torch.dtype, m: Machine) -> Row:
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype, device=m.device)
    positions = torch.randint(0, 8192, (tokens,), device=m.device)
    inv_freq = 1.0 / 500000 ** (torch.arange(0, HEAD_DIM, 2, device=m.device).float() / HEAD_DIM)
    freqs = torch.outer(torch.arange(8192, device=m.device).float(), inv_freq)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    widths = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]
    a, b = qkv.clone(), qkv.clone()
    qa, ka, _ = a.split(widths, 1)
    qb, kb, _ = b.split(widths, 1)
    rotary_embedding(positions, qa, ka, cache, HEAD_DIM, True)
    rotary_embedding_ref(positions, qb, kb, cache, HEAD_DIM, True)
    qk_bytes = tokens * (HEADS + KV_HEADS) * HEAD_DIM * qkv.element_size()
    return memory_row(
        "rotary_embedding", f"T={tokens} neox", dtype, rel_error(a, b),
        lambda: rotary_embedding(positions, qa, ka, cache, HEAD_DIM, True),
        lambda: rotary_embedding_ref(positions, qb, kb, cache, HEAD_DIM, True),
        "torch twin", 2 * qk_bytes, m,
    )  # fmt: skip


def store_kv_row(tokens: int, dtype: torch.dtype, m: Machine) -> Row:
    slots = 1 << 18
    k_buffer = torch.randn(slots, KV_HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    v_buffer = torch.randn_like(k_buffer)
    kb, vb = k_buffer.clone(), v_buffer.clone()
    loc = torch.randperm(slots, device=m.device)[:tokens]
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=dtype, device=m.device)
    v = torch.randn_like(k)
    store_kv(k_buffer, v_buffer, loc, k, v)
    store_kv_ref(kb, vb, loc, k, v)
    err = rel_error(torch.cat([k_buffer, v_buffer]), torch.cat([kb, vb]))
    return memory_row(
        "store_kv", f"T={tokens}", dtype, err, lambda: store_kv(k_buffer, v_buffer, loc, k, v),
        lambda: store_kv_ref(kb, vb, loc, k, v), "index_put", 4 * k.numel() * k.element_size(), m,
    )  # fmt: skip


def bitmask_row(batch: int, vocab: int, dtype: torch.dtype, m: Machine) -> Row:
    logits = torch.randn(batch, vocab, dtype=dtype, device=m.device)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, (vocab + 31) // 32), device=m.device)
    bitmask = bitmask.int()
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask(a, bitmask)
    apply_token_bitmask_ref(b, bitmask)
    err = 0.0 if torch.equal(a, b) else float("inf")  # masked logits are -inf: exact or wrong
    return memory_row(
        "apply_token_bitmask", f"B={batch} V={vocab}", dtype, err,
        lambda: apply_token_bitmask(a, bitmask), lambda: apply_token_bitmask_ref(b, bitmask),
        "torch twin", bitmask.numel() * 4 + logits.numel() * logits.element_size(), m,
    )  # fmt: skip


def quant_row(tokens: int, qtype: str, dtype: torch.dtype, m: Machine) -> Row:
    """The W8A16/W4A16 matmul on a Llama-3-8B MLP down projection's shape against the dense
    matmul of the dequantized weight (what `--quantization none` runs); GB/s of packed weight
    read, the bound at small batches."""
    n, k = 4096, 14336
    packed, w = random_gguf_weight(qtype, n, k, torch.Generator().manual_seed(k))
    packed, w = packed.to(m.device), w.to(device=m.device, dtype=dtype)
    x = torch.randn(tokens, k, dtype=dtype, device=m.device)
    err = rel_error(quant_linear_triton(x, packed, qtype, k), quant_linear_ref(x, packed, qtype, k))
    return memory_row(
        "quant_linear", f"{qtype} M={tokens} {n}x{k}", dtype, err,
        lambda: quant_linear_triton(x, packed, qtype, k), lambda: torch.mm(x, w.t()),
        "dense matmul, dequantized", packed.numel(), m,
    )  # fmt: skip


def all_rows(dtype: torch.dtype, m: Machine) -> list[Row]:
    rows = [decode_case(b, ctx, dtype, m) for b, ctx in [(1, 4096), (64, 1024), (64, 4096)]]
    torch.cuda.empty_cache()
    for b, prefix, ext in [(1, 0, 4096), (8, 0, 1024), (4, 1024, 1024)]:
        rows.append(extend_case(b, prefix, ext, dtype, m))
        torch.cuda.empty_cache()
    for tokens, hidden in [(64, 4096), (8192, 4096)]:
        rows.extend(norm_rows(tokens, hidden, dtype, m))
    rows.append(rotary_row(8192, dtype, m))
    rows.append(store_kv_row(8192, dtype, m))
    rows.append(bitmask_row(64, 128256, dtype, m))
    rows.extend(quant_row(t, q, dtype, m) for q in ("q8_0", "q4_0", "q4_1") for t in (1, 16, 256))
    return rows


def print_table(rows: list[Row], m: Machine) -> None:
    print(f"\nmeasured: copy {m.copy_gbs:.0f} GB/s, bf16 matmul {m.matmul_tflops:.0f} TFLOP/s\n")
    head = (
        f"{'kernel':<20} {'case':<26} {'dtype':<5} {'rel err':>8} {'ok':>3} {'triton ms':>10} "
        f"{'torch ms':>9} {'speedup':>8} {'achieved':>16} {'of peak':>8}  torch alternative"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        torch_ms = f"{r.torch_ms:9.3f}" if r.torch_ms is not None else f"{'n/a':>9}"
        speedup = f"{r.torch_ms / r.triton_ms:7.2f}x" if r.torch_ms is not None else " " * 8
        ok = "yes" if r.ok else "NO"
        print(
            f"{r.kernel:<20} {r.case:<26} {DTYPE_NAMES[r.dtype]:<5} {r.error:8.1e} {ok:>3} "
            f"{r.triton_ms:10.3f} {torch_ms} {speedup} {r.achieved:8.1f} {r.unit:<7} "
            f"{100 * r.achieved / r.peak:7.1f}%  {r.torch_what}"
        )


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set: unset it to benchmark compiled kernels.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(
            "kernels_gpu.py needs a CUDA GPU; none is visible. On the CPU, the kernel tests run "
            "under the Triton interpreter: pytest tests/test_kernels_*.py",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    print(f"{name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    machine = measure_machine(device)
    rows = [row for dtype in DTYPE_NAMES for row in all_rows(dtype, machine)]
    print_table(rows, machine)
    failed = [f"{r.kernel} {r.case} {DTYPE_NAMES[r.dtype]}" for r in rows if not r.ok]
    if failed:
        print(f"\nFAILED checks: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nall kernels match their references")
    return 0


if __name__ == "__main__":
    sys.exit(main())
