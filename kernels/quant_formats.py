"""ggml's block-quantized weight formats, kept packed: names, sizes, dequantize and quantize.

A packed weight is a contiguous uint8 tensor [N, row_bytes]: each output row holds its K input
weights as ggml blocks, byte for byte as a GGUF file stores them, so a GGUF tensor is used as is.

    q8_0  32 weights / 34 B:  d f16 | 32 x int8                       w = d * q
    q4_0  32 weights / 18 B:  d f16 | 16 B nibbles (lo: 0-15, hi: 16-31)   w = d * (q - 8)
    q4_1  32 weights / 20 B:  d f16 | m f16 | 16 B nibbles             w = d * q + m
    q4_k 256 weights / 144 B: d f16 | dmin f16 | 12 B 6-bit scales/mins | 128 B nibbles
                              8 sub-blocks of 32: w = d * sc * q - dmin * mn
    q6_k 256 weights / 210 B: 128 B low nibbles | 64 B 2-bit highs | 16 x int8 scales | d f16
                              16 sub-blocks of 16: w = d * sc * (q - 32)

q8_0x16, q4_0x16, q4_1x16, q4_kx16 and q6_kx16 are q8_0, q4_0, q4_1, q4_k and q6_k interleaved
by 16 rows (`interleave_rows`): the layout the CPU kernel's matvec reads at memory speed
(kernels/cpu/interleaved_blocks.h, interleaved_kquants.h). Each group of 16 rows is contiguous,
block after block; a block's parts (`_BLOCK_PARTS`: q4: 16 nibble bytes, then d (and m); q8_0:
32 int8, then d; q4_k: 128 nibble bytes, d, dmin, 12 scale bytes; q6_k: ql, qh, scales, d) each
hold the 16 rows' bytes of that part as chunks of 4 (fp16 fields: 2) bytes per row,
chunk-major; rows past the last whole group stay in the plain layout. Same bytes per row as the
plain format.

`dequantize` matches `gguf.quants.dequantize` bit for bit (same float32 operations in the same
order); `quantize` matches `gguf.quants.quantize` for q8_0, q4_0 and q4_1.

The CPU kernel's batch-invariant matmul (kernels/cpu/quant_blocks.h) runs `BLOCKED_QTYPES` for
up to `MAX_BLOCKED_ROWS` rows of fp32 x; with int8 activations x is rounded per block of 32 as
`quantize_activations` rounds it, and that matmul multiplies in int8, at any number of rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantFormat:
    name: str
    ggml_name: str  # gguf.GGMLQuantizationType member name
    block_size: int  # weights per block
    block_bytes: int


FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat("q8_0", "Q8_0", 32, 34),
        QuantFormat("q4_0", "Q4_0", 32, 18),
        QuantFormat("q4_1", "Q4_1", 32, 20),
        QuantFormat("q4_k", "Q4_K", 256, 144),
        QuantFormat("q6_k", "Q6_K", 256, 210),
    )
}
# interleaved qtype -> its plain format (same blocks, rows interleaved by INTERLEAVE_ROWS)
INTERLEAVED = {
    "q8_0x16": "q8_0",
    "q4_0x16": "q4_0",
    "q4_1x16": "q4_1",
    "q4_kx16": "q4_k",
    "q6_kx16": "q6_k",
}
INTERLEAVE_ROWS = 16
QTYPES = (*FORMATS, *INTERLEAVED)
# what `quantize` can produce from float weights
QUANTIZE_QTYPES = ("q8_0", "q4_0", "q4_1")
# run by the batch-invariant kernels
BLOCKED_QTYPES = frozenset({"q4_0", "q4_1", "q8_0", *INTERLEAVED})
# rows of fp32 x they take (quant_linear.cpp kMaxBlockedRows): every decode batch up to the
# default max_running_requests; x in int8 they take at any number of rows
MAX_BLOCKED_ROWS = 128
ACTIVATION_BLOCK = 32  # values of x sharing one int8 scale


def quant_format(qtype: str) -> QuantFormat:
    """The format named `qtype` (an interleaved one's plain format); a ValueError naming the
    known ones otherwise."""
    fmt = FORMATS.get(INTERLEAVED.get(qtype, qtype))
    if fmt is None:
        raise ValueError(f"unknown quantized weight type {qtype!r}; known: {list(QTYPES)}")
    return fmt


def qtype_of_ggml(ggml_name: str) -> str | None:
    """Our qtype for a GGML type name ("Q4_1" -> "q4_1"); None for types not kept packed."""
    return next((f.name for f in FORMATS.values() if f.ggml_name == ggml_name), None)


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one packed row of `k` weights; `k` must be a whole number of blocks."""
    fmt = quant_format(qtype)
    if k <= 0 or k % fmt.block_size:
        raise ValueError(f"{qtype} rows hold multiples of {fmt.block_size} weights, got K={k}")
    return k // fmt.block_size * fmt.block_bytes


def check_packed(packed: torch.Tensor, qtype: str, k: int) -> None:
    """A ValueError unless `packed` is a contiguous uint8 [N, row_bytes(qtype, k)] tensor."""
    expected = row_bytes(qtype, k)
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != expected:
        raise ValueError(
            f"packed {qtype} weight with K={k} must be uint8 [N, {expected}], "
            f"got {packed.dtype} {list(packed.shape)}"
        )
    if not packed.is_contiguous():
        raise ValueError("packed weight must be contiguous")


@dataclass
class PackedWeight:
    """A quantized [N, K] weight: `data` uint8 [N, row_bytes] in ggml blocks of `qtype`."""

    data: torch.Tensor
    qtype: str
    shape: tuple[int, int]  # (N, K) of the float weight it stands for

    def __post_init__(self) -> None:
        check_packed(self.data, self.qtype, self.shape[1])
        if self.data.shape[0] != self.shape[0]:
            raise ValueError(
                f"packed weight has {self.data.shape[0]} rows, shape says {self.shape}"
            )

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.data, self.qtype, self.shape[1])


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of each block, as float32 [B, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2, n]: the low nibbles, then the high nibbles."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=-2)


def _dequantize_blocks(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """[B, block_bytes] uint8 -> [B, block_size] float32."""
    n = blocks.shape[0]
    if qtype == "q8_0":
        return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks, 0)
    if qtype == "q4_0":
        q = _nibbles(blocks[:, 2:]).reshape(n, 32).to(torch.int8) - 8
        return _f16(blocks, 0) * q.float()
    if qtype == "q4_1":
        q = _nibbles(blocks[:, 4:]).reshape(n, 32).float()
        return _f16(blocks, 0) * q + _f16(blocks, 2)
    if qtype == "q4_k":
        a, b, c = blocks[:, 4:16].reshape(n, 3, 4).unbind(1)
        scale = torch.cat((a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)), dim=1).float()
        low = torch.cat((b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)), dim=1).float()
        d = (_f16(blocks, 0) * scale).unsqueeze(-1)
        dmin = (_f16(blocks, 2) * low).unsqueeze(-1)
        # 4 chunks of 32 bytes; a chunk's low nibbles are sub-block 2j, its high ones 2j+1
        q = _nibbles(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).float()
        return (d * q - dmin).reshape(n, 256)
    if qtype == "q6_k":
        # two halves of 128 weights; in each, ql's 64 bytes give weights 0-63 (low nibbles)
        # and 64-127 (high nibbles), qh's 32 bytes give bits 4-5 of weights 32*s + i at 2*s
        ql = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device)
        qh = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts.view(1, 1, 4, 1)) & 0x03
        q = (ql | (qh << 4)).to(torch.int8) - 32
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
        d = (_f16(blocks, 208) * scales).unsqueeze(-1)
        return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)
    raise ValueError(f"unknown quantized weight type {qtype!r}; known: {list(QTYPES)}")


# Per plain qtype, the parts of a block in their interleaved order: (first byte in the plain
# block, bytes, bytes per row in each chunk).
_BLOCK_PARTS = {
    "q8_0": ((2, 32, 4), (0, 2, 2)),  # codes, d
    "q4_0": ((2, 16, 4), (0, 2, 2)),  # codes, d
    "q4_1": ((4, 16, 4), (0, 4, 2)),  # codes, d and m
    "q4_k": ((16, 128, 4), (0, 4, 2), (4, 12, 4)),  # codes, d and dmin, scales
    "q6_k": ((0, 128, 4), (128, 64, 4), (192, 16, 4), (208, 2, 2)),  # ql, qh, scales, d
}


@functools.cache
def _group_order(qtype: str, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For one group of 16 plain `qtype` rows of `nbytes` (bytes numbered row by row): the plain
    byte at each position of the interleaved group, and its inverse (the interleaved position of
    each plain byte)."""
    nblocks = nbytes // quant_format(qtype).block_bytes
    rows = torch.arange(INTERLEAVE_ROWS * nbytes).view(INTERLEAVE_ROWS, nblocks, -1)
    # each part [row, b, chunk, unit] -> [b, chunk, row, unit]; a block's parts in turn
    parts = [
        rows[..., first : first + size]
        .reshape(INTERLEAVE_ROWS, nblocks, -1, unit)
        .permute(1, 2, 0, 3)
        .reshape(nblocks, -1)
        for first, size, unit in _BLOCK_PARTS[qtype]
    ]
    order = torch.cat(parts, 1).reshape(-1)
    return order, torch.argsort(order)


def _regroup(packed: torch.Tensor, plain: str, inverse: bool) -> torch.Tensor:
    """`packed`'s whole groups of 16 rows through `_group_order` (or its inverse); the rest as
    they are."""
    n, nbytes = packed.shape
    whole = n // INTERLEAVE_ROWS * INTERLEAVE_ROWS
    index = _group_order(plain, nbytes)[inverse]
    groups = packed[:whole].reshape(-1, INTERLEAVE_ROWS * nbytes)[:, index]
    return torch.cat((groups.reshape(whole, nbytes), packed[whole:]))


def interleave_rows(packed: torch.Tensor, qtype: str) -> torch.Tensor:
    """Packed rows [N, row_bytes] of a plain qtype -> the same weight as `qtype`x16 (see
    above)."""
    if qtype not in INTERLEAVED.values():
        raise ValueError(
            f"{qtype!r} rows do not interleave (only {', '.join(INTERLEAVED.values())})"
        )
    return _regroup(packed, qtype, inverse=False)


def interleaved_qtype(qtype: str) -> str:
    """The interleaved qtype of a plain one ("q4_1" -> "q4_1x16")."""
    return next(name for name, plain in INTERLEAVED.items() if plain == qtype)


def deinterleave_rows(packed: torch.Tensor, qtype: str) -> torch.Tensor:
    """The inverse of `interleave_rows`: `qtype` (q8_0x16, ..., q4_kx16) rows -> plain."""
    return _regroup(packed, INTERLEAVED[qtype], inverse=True)


def select_rows(packed: torch.Tensor, qtype: str, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [T]) of a packed weight, in its plain format's layout [T, row_bytes]
    (an embedding lookup); for an interleaved qtype one gather of each row's bytes."""
    n, nbytes = packed.shape
    whole = n // INTERLEAVE_ROWS * INTERLEAVE_ROWS
    if qtype not in INTERLEAVED or whole == 0:
        return packed.index_select(0, ids)
    lanes = _group_order(INTERLEAVED[qtype], nbytes)[1].view(INTERLEAVE_ROWS, nbytes).to(ids.device)
    in_group = (ids // INTERLEAVE_ROWS * INTERLEAVE_ROWS * nbytes).unsqueeze(-1)
    plain = ids.unsqueeze(-1) * nbytes + torch.arange(nbytes, device=ids.device)
    where = torch.where((ids < whole).unsqueeze(-1), in_group + lanes[ids % INTERLEAVE_ROWS], plain)
    return packed.view(-1)[where]


def dequantize(packed: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Packed uint8 [N, row_bytes] of `qtype` -> float32 [N, K]."""
    check_packed(packed, qtype, k)
    if qtype in INTERLEAVED:
        return dequantize(deinterleave_rows(packed, qtype), INTERLEAVED[qtype], k)
    fmt = quant_format(qtype)
    blocks = packed.reshape(-1, fmt.block_bytes)
    return _dequantize_blocks(blocks, qtype).reshape(packed.shape[0], k)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] (K a multiple of 32) rounded to its int8 grid, in float32: per block of 32,
    d = max|x| / 127 and x -> d * round(x * (127 / max|x|)), ties to even (an all-zero block
    stays zero). The CPU kernel's int8 activations are these codes and scales, bit for bit."""
    if x.dim() != 2 or x.shape[1] % ACTIVATION_BLOCK:
        raise ValueError(f"x must be [M, K] with K a multiple of 32, got {tuple(x.shape)}")
    xf = x.float().reshape(x.shape[0], -1, ACTIVATION_BLOCK)
    amax = xf.abs().amax(-1, keepdim=True)
    # true divisions (torch multiplies by the reciprocal when the divisor is a Python scalar)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    scale = amax / torch.full_like(amax, 127.0)
    return (torch.round(xf * inverse) * scale).reshape(x.shape)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf (ties away from zero), as ggml rounds; torch.round rounds ties to even."""
    a = x.abs()
    whole = a.floor()
    return torch.sign(x) * (whole + torch.floor(2 * (a - whole)))


def _reciprocal(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 [B, 1] -> its fp16 bytes [B, 2]."""
    return x.to(torch.float16).view(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[B, 32] values 0-15 -> [B, 16] bytes: weight i in the low nibble, i + 16 in the high."""
    return q[:, :16] | (q[:, 16:] << 4)


def quantize(weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """Float [N, K] -> packed uint8 [N, row_bytes] of `qtype` (q8_0, q4_0 or q4_1), with
    ggml's rounding (round-to-nearest per block, no search for better scales)."""
    if qtype not in QUANTIZE_QTYPES:
        raise ValueError(f"cannot quantize to {qtype!r}; supported: {list(QUANTIZE_QTYPES)}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"quantize takes a float [N, K] weight, got {weight.dtype} {weight.dim()}-D"
        )
    n, k = weight.shape
    row_bytes(qtype, k)  # checks K
    x = weight.detach().float().reshape(-1, 32)
    if qtype == "q8_0":
        d = x.abs().amax(dim=1, keepdim=True) / 127
        q = _round_half_away(x * _reciprocal(d)).to(torch.int8).view(torch.uint8)
        blocks = torch.cat((_f16_bytes(d), q), dim=1)
    elif qtype == "q4_0":
        # the signed value of largest magnitude maps to -8, so all 16 levels can be used
        extreme = x.gather(1, x.abs().argmax(dim=1, keepdim=True))
        d = extreme / -8
        q = torch.trunc(x * _reciprocal(d) + 8.5).clamp(0, 15).to(torch.uint8)
        blocks = torch.cat((_f16_bytes(d), _pack_nibbles(q)), dim=1)
    else:
        low = x.amin(dim=1, keepdim=True)
        d = (x.amax(dim=1, keepdim=True) - low) / 15
        q = torch.trunc((x - low) * _reciprocal(d) + 0.5).clamp(0, 15).to(torch.uint8)
        blocks = torch.cat((_f16_bytes(d), _f16_bytes(low), _pack_nibbles(q)), dim=1)
    return blocks.reshape(n, -1).contiguous()
