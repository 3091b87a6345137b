"""kernels/quant_formats.py against gguf's own numpy (de)quantizers, the formats' owner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from radixflow.kernels.quant_formats import (
    FORMATS,
    INTERLEAVED,
    QUANTIZE_QTYPES,
    PackedWeight,
    deinterleave_rows,
    dequantize,
    interleave_rows,
    qtype_of_ggml,
    quantize,
    row_bytes,
    select_rows,
)
from radixflow.kernels.reference import quant_linear_ref

# byte offsets of each format's fp16 fields: random bytes there could be inf/nan
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q4_k": (0, 2), "q6_k": (208,)}


def random_packed(qtype: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Valid random blocks: random bytes with finite fp16 scales."""
    fmt = FORMATS[qtype]
    gen = np.random.default_rng(seed)
    blocks = gen.integers(0, 256, size=(n * k // fmt.block_size, fmt.block_bytes), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scale = gen.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(blocks.reshape(n, -1))


def ggml_type(qtype: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[FORMATS[qtype].ggml_name]


@pytest.mark.parametrize("qtype", list(FORMATS))
def test_dequantize_matches_gguf_bit_for_bit(qtype):
    k = 512
    packed = random_packed(qtype, 7, k, seed=len(qtype))
    expected = gguf_dequantize(packed.numpy(), ggml_type(qtype)).reshape(7, k)
    got = dequantize(packed, qtype, k)
    assert got.dtype == torch.float32 and got.shape == (7, k)
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(expected)))


# Where the kernels read each part of a group's first block (interleaved_blocks.h,
# interleaved_kquants.h): (offset in the group, first byte in the plain block, bytes, bytes per row
# in each chunk of 16 rows).
GROUP_PARTS = {
    "q8_0": [(0, 2, 32, 4), (512, 0, 2, 2)],  # codes, d
    "q4_0": [(0, 2, 16, 4), (256, 0, 2, 2)],  # codes, d
    "q4_1": [(0, 4, 16, 4), (256, 0, 2, 2), (288, 2, 2, 2)],  # codes, d, m
    "q4_k": [(0, 16, 128, 4), (2048, 0, 2, 2), (2080, 2, 2, 2), (2112, 4, 12, 4)],
    "q6_k": [(0, 0, 128, 4), (2048, 128, 64, 4), (3072, 192, 16, 4), (3328, 208, 2, 2)],
}


@pytest.mark.parametrize("interleaved", sorted(INTERLEAVED))
def test_interleaved_rows_hold_the_same_weights(interleaved):
    plain = INTERLEAVED[interleaved]
    k = 3 * FORMATS[plain].block_size
    for n in (5, 16, 37):  # no whole group, one, two and five plain rows after them
        packed = random_packed(plain, n, k, seed=n)
        mixed = interleave_rows(packed, plain)
        assert mixed.shape == packed.shape and mixed.is_contiguous()
        assert torch.equal(deinterleave_rows(mixed, interleaved), packed)
        assert torch.equal(dequantize(mixed, interleaved, k), dequantize(packed, plain, k))
        whole = n // 16 * 16
        assert torch.equal(mixed[whole:], packed[whole:])  # the rest stay plain
        if whole:
            # the first block of the first group, as the kernels read it: chunk c of a part
            # holds row r's bytes unit c .. unit (c + 1) of it at offset + 16 unit c + unit r
            group = mixed[:16].reshape(-1)
            for offset, first, size, unit in GROUP_PARTS[plain]:
                for r in range(16):
                    for c in range(size // unit):
                        at = offset + 16 * unit * c + unit * r
                        want = packed[r, first + unit * c : first + unit * (c + 1)]
                        assert torch.equal(group[at : at + unit], want), (offset, r, c)
        ids = torch.tensor([n - 1, 0, n // 2, 3 % n, n - 1])
        assert torch.equal(select_rows(mixed, interleaved, ids), packed[ids])


def test_only_known_plain_rows_interleave():
    with pytest.raises(ValueError, match="'q4_1x16' rows do not interleave"):
        interleave_rows(random_packed("q4_1", 16, 256), "q4_1x16")


@pytest.mark.parametrize("qtype", QUANTIZE_QTYPES)
def test_quantize_matches_gguf_bytes(qtype):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(9, 96, generator=gen) * 0.1
    weight[0, :32] = 0  # an all-zero block: scale 0, no division by zero
    weight[1, 5] = 2.5  # an outlier, negative extremes for q4_0's signed maximum
    weight[2, 40] = -3.0
    expected = gguf_quantize(weight.numpy(), ggml_type(qtype))
    got = quantize(weight, qtype)
    assert got.shape == (9, row_bytes(qtype, 96))
    assert np.array_equal(got.numpy(), expected)


def test_round_trip_error_is_within_half_a_step():
    weight = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    for qtype, levels in (("q8_0", 254), ("q4_1", 15)):
        back = dequantize(quantize(weight, qtype), qtype, 64)
        blocks = weight.reshape(-1, 32)
        step = (blocks.amax(1) - blocks.amin(1)) / levels if qtype == "q4_1" else None
        if step is None:
            step = 2 * blocks.abs().amax(1) / levels
        err = (back - weight).reshape(-1, 32).abs().amax(1)
        assert torch.all(err <= step * 0.5 + 1e-3), qtype


def test_qtype_names_map_to_ggml():
    assert qtype_of_ggml("Q4_1") == "q4_1"
    assert qtype_of_ggml("Q6_K") == "q6_k"
    assert qtype_of_ggml("Q5_K") is None
    for fmt in FORMATS.values():
        from gguf.constants import GGML_QUANT_SIZES

        assert GGML_QUANT_SIZES[ggml_type(fmt.name)] == (fmt.block_size, fmt.block_bytes)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: dequantize(torch.zeros(2, 34, dtype=torch.uint8), "q3_k", 32), "q3_k"),
        (lambda: dequantize(torch.zeros(2, 33, dtype=torch.uint8), "q8_0", 32), r"\[N, 34\]"),
        (lambda: dequantize(torch.zeros(2, 34), "q8_0", 32), "uint8"),
        (lambda: row_bytes("q4_k", 96), "multiples of 256"),
        (lambda: quantize(torch.zeros(2, 32), "q6_k"), "cannot quantize"),
        (lambda: quantize(torch.zeros(2, 40), "q8_0"), "K=40"),
        (lambda: PackedWeight(torch.zeros(3, 34, dtype=torch.uint8), "q8_0", (2, 32)), "3 rows"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("qtype", list(FORMATS))
def test_quant_linear_ref_is_linear_over_the_dequantized_weight(qtype):
    k = 256
    packed = random_packed(qtype, 5, k, seed=1)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(5)
    weight = torch.from_numpy(gguf_dequantize(packed.numpy(), ggml_type(qtype)).reshape(5, k))
    expected = torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(quant_linear_ref(x, packed, qtype, k, bias), expected)
    out = quant_linear_ref(x.bfloat16(), packed, qtype, k)
    assert out.dtype == torch.bfloat16
