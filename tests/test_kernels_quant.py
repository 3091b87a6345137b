"""The compiled CPU quantized linear (GGUF blocks kept packed) against gguf's own dequantize
followed by F.linear, for every qtype and each path (the K-quants' matvec, the register-blocked
q4_0/q4_1/q8_0 kernel, the tiled sgemm of prefill); the blocked kernel gives a row of x the same
bits whatever rows share its call, and the same as the fused decode op, with x in fp32 or rounded
to int8 (int8 activations, against F.linear of x on its int8 grid)."""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.cpu_build import current_choice
from radixflow.kernels.decode_layer import Projection, decode_linear
from radixflow.kernels.quant_formats import quant_format, quantize_activations
from radixflow.kernels.quant_linear import (
    BLOCKED_QTYPES,
    MAX_BLOCKED_ROWS,
    MAX_ROWS,
    QTYPES,
    quant_linear,
)
from radixflow.kernels.reference import quant_linear_ref
from radixflow.kernels.testing import random_gguf_weight, relative_error

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)
# fp32: the weights are exact, only the order of fp32 sums differs; bf16: one rounding of the
# output (2^-8 relative) on top.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = list(TOLERANCE)
BLOCK = {qtype: quant_format(qtype).block_size for qtype in QTYPES}
ROWS = [1, 3, MAX_ROWS, MAX_ROWS + 1, MAX_BLOCKED_ROWS, MAX_BLOCKED_ROWS + 1]


@functools.cache
def weight(qtype: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return random_gguf_weight(qtype, n, k, torch.Generator().manual_seed(n * 31 + k))


def check(qtype: str, rows: int, n: int, k: int, dtype: torch.dtype, with_bias: bool) -> None:
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    got = quant_linear(x, packed, qtype, k, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    err = relative_error(got, exact)
    assert err < TOLERANCE[dtype], f"{qtype} M={rows} {dtype}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("qtype", QTYPES)
def test_matches_gguf_dequantize_then_linear(qtype, with_bias, dtype):
    k = 3 * BLOCK[qtype]
    for rows in ROWS:
        check(qtype, rows, 37, k, dtype, with_bias)


@pytest.mark.parametrize("qtype", QTYPES)
def test_every_decode_row_count_on_a_model_shape(qtype):
    # the default model's down projection: K = 1536 (6 blocks of 256), an odd N
    for rows in range(1, MAX_ROWS + 1):
        check(qtype, rows, 193, 1536, torch.float32, with_bias=False)


@pytest.mark.parametrize("qtype", QTYPES)
def test_prefill_spans_several_weight_tiles(qtype):
    # 1 MiB fp32 tiles of K = 2048 hold 128 rows: 300 rows take three, the last one ragged
    check(qtype, MAX_BLOCKED_ROWS + 1, 300, 2048, torch.float32, with_bias=True)


@pytest.mark.parametrize("int8", [False, True], ids=["", "int8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", sorted(BLOCKED_QTYPES))
def test_a_row_gets_the_same_bits_whatever_rows_share_its_call(qtype, dtype, int8):
    # continuous batching must not change a request's tokens: its row of x gives the same
    # output alone, in batches of any size (full tiles of 8 rows and a ragged one) and through
    # the fused decode op; N = 193 leaves a ragged step of packed rows
    # with int8 activations at any number of rows: prefill chunks past MAX_BLOCKED_ROWS, in
    # slabs of rows (1 MiB of int8 x: 682 rows at this K) too
    n, k = 193, 1536
    packed, _ = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(5)
    sizes = (2, 5, 8, 16, 40, MAX_BLOCKED_ROWS) + ((MAX_BLOCKED_ROWS + 1, 700) if int8 else ())
    x = torch.randn(max(sizes), k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return quant_linear(rows, packed, qtype, k, bias, int8_activations=int8)

    alone = torch.cat([run(x[i : i + 1]) for i in range(len(x))])
    for rows in sizes:
        assert torch.equal(run(x[:rows]), alone[:rows]), rows
        assert torch.equal(run(x[-rows:]), alone[-rows:]), rows
    for rows in (1, 5, 8):
        fused = decode_linear(x[:rows], Projection((packed,), (qtype,), bias), int8)
        assert torch.equal(fused, alone[:rows]), rows
    if not int8:
        check(qtype, MAX_BLOCKED_ROWS, n, k, dtype, with_bias=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", sorted(BLOCKED_QTYPES))
def test_int8_activations_multiply_x_on_its_int8_grid(qtype, dtype):
    # int8 activations: exactly F.linear of x rounded per block of 32 to int8 (up to the order
    # of fp32 sums), which is measurably not F.linear of x itself
    n, k = 37, 7 * BLOCK[qtype]  # an odd number of blocks per row
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(11)
    for rows in (1, 3, MAX_ROWS, MAX_ROWS + 1, MAX_BLOCKED_ROWS):
        x = (torch.randn(rows, k, generator=gen) * torch.rand(rows, k, generator=gen)).to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype)
        got = quant_linear(x, packed, qtype, k, bias, int8_activations=True)
        on_grid = F.linear(quantize_activations(x).double(), w.double(), bias.double())
        assert relative_error(got, on_grid) < TOLERANCE[dtype], rows
        assert (
            relative_error(got, quant_linear_ref(x, packed, qtype, k, bias, None, True))
            < (TOLERANCE[dtype])
        )
        if dtype == torch.float32:
            assert relative_error(got, F.linear(x.double(), w.double(), bias.double())) > 1e-4


@pytest.mark.parametrize("rows", [3, MAX_ROWS + 1])
@pytest.mark.parametrize("qtype", sorted(set(QTYPES) - BLOCKED_QTYPES))
def test_int8_activations_round_x_on_the_fp32_paths_too(qtype, rows):
    # the plain K-quants multiply in fp32 (their matvec, and the sgemm past MAX_ROWS): with
    # int8 activations they take x on its int8 grid, bit for bit as quantize_activations
    # rounds it, so that a prompt's logits do not depend on which path its rows took
    k = BLOCK[qtype] * 2
    packed, _ = weight(qtype, 24, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2))
    rounded = quant_linear(quantize_activations(x), packed, qtype, k)
    assert torch.equal(quant_linear(x, packed, qtype, k, int8_activations=True), rounded)
    assert not torch.equal(quant_linear(x, packed, qtype, k), rounded)


def test_quantize_activations_rounds_each_block_to_127_levels():
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-2.0, 1.0, 32)
    x[0, 32:] = 0.5 / 127 * torch.arange(32)  # codes 0..31 at scale 0.5/127 x 127/31
    got = quantize_activations(x)
    assert torch.equal(got[1], torch.zeros(64))  # an all-zero block stays zero
    d = 2.0 / 127
    assert torch.allclose(got[0, :32], torch.round(x[0, :32] / d) * d, atol=1e-7)
    assert got[0, 0] == -2.0 and got[0, :32].abs().max() == 2.0
    assert (got[0, 32:] - x[0, 32:]).abs().max() <= 0.5 * x[0, 32:].max() / 127 + 1e-7
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_activations(torch.zeros(1, 48))


@pytest.mark.parametrize("rows", [2, 12])
def test_agrees_with_the_torch_reference_and_fills_out(rows):
    packed, _ = weight("q4_1", 40, 64)
    x = torch.randn(rows, 64)
    wide = torch.full((rows, 50), float("nan"))
    out = wide[:, 5:45]  # rows strided by 50
    got = quant_linear(x, packed, "q4_1", 64, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert wide[:, :5].isnan().all() and wide[:, 45:].isnan().all()
    assert relative_error(out, quant_linear_ref(x, packed, "q4_1", 64)) < 1e-5


BAD_CALLS = [
    (dict(qtype="q5_0"), "unknown quantized weight type 'q5_0'"),
    (dict(k=48), "multiples of 32 weights, got K=48"),
    (dict(packed=torch.zeros(4, 36, dtype=torch.uint8)), r"uint8 \[N, 40\]"),
    (dict(packed=torch.zeros(4, 40, dtype=torch.int8)), r"uint8 \[N, 40\]"),
    (dict(x=torch.zeros(2, 32)), r"x must be \[M, 64\]"),
    (dict(x=torch.zeros(2, 64, dtype=torch.float16)), "x must be one of"),
    (dict(bias=torch.zeros(5)), r"bias must be \[4\] torch.float32"),
    (dict(bias=torch.zeros(4, dtype=torch.bfloat16)), r"bias must be \[4\] torch.float32"),
    (dict(out=torch.zeros(2, 5)), r"out must be a torch.float32 tensor of shape \(2, 4\) on cpu"),
]


def test_no_rows_give_an_empty_result():
    # a step where no request needs logits runs lm_head on zero rows
    out = quant_linear(torch.zeros(0, 64), weight("q4_1", 4, 64)[0], "q4_1", 64)
    assert out.shape == (0, 4)


@pytest.mark.parametrize("change,message", BAD_CALLS)
def test_bad_arguments_raise_value_errors_naming_them(change, message):
    args = dict(x=torch.zeros(2, 64), packed=weight("q4_1", 4, 64)[0], qtype="q4_1", k=64)
    with pytest.raises(ValueError, match=message):
        quant_linear(**{**args, **change})


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1x16", "q8_0x16"])
@pytest.mark.parametrize("rows", [1, 4, 45, 183, 777])
def test_every_row_is_written_once_however_the_pool_splits_the_work(rows, qtype):
    # the pool cuts a call's chunks into one part per thread and threads take what is left of
    # the others' parts: chunk counts below, equal to and not divisible by the thread count
    # (q4_1x16: groups of 16 rows, and the rows past the last group in the plain layout)
    packed, w = weight(qtype, rows, 576)
    x = torch.randn(1, 576, generator=torch.Generator().manual_seed(rows))
    expected = x @ w.T
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3, 5, 8):
            torch.set_num_threads(count)
            for _ in range(20):
                out = torch.full((1, rows), float("nan"))
                quant_linear(x, packed, qtype, 576, out=out)
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(threads)


def test_threads_and_concurrent_callers_do_not_change_the_result():
    # the kernel's work pool: any number of helper threads, callers on several threads at
    # once (one runs on the pool, the others alone) and a pool idle long enough to sleep all
    # give the same bits
    packed, _ = weight("q4_1", 777, 576)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(9))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        expected = quant_linear(x, packed, "q4_1", 576, int8_activations=True)
        for count in (2, 3, 5):
            torch.set_num_threads(count)
            assert torch.equal(
                quant_linear(x, packed, "q4_1", 576, int8_activations=True), expected
            )
        time.sleep(0.01)  # the helpers go to sleep; the next call wakes them
        assert torch.equal(quant_linear(x, packed, "q4_1", 576, int8_activations=True), expected)
        small, _ = weight("q8_0", 40, 64)
        small_x = x[:, :64]
        small_expected = quant_linear(small_x, small, "q8_0", 64)

        def call(i: int) -> bool:  # jobs of 1 to 25 chunks, back to back from 4 threads
            if i % 2:
                return torch.equal(quant_linear(small_x, small, "q8_0", 64), small_expected)
            got = quant_linear(x, packed, "q4_1", 576, int8_activations=True)
            return torch.equal(got, expected)

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(call, range(2000)))
    finally:
        torch.set_num_threads(threads)
