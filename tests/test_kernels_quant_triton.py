"""The Triton W8A16 / W4A16 matmul over GGUF blocks (interpreter on the CPU; conftest sets
TRITON_INTERPRET) against gguf's own dequantize followed by F.linear, and the torch reference."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels import quant_triton
from radixflow.kernels.quant_triton import QTYPES, quant_linear_triton
from radixflow.kernels.reference import quant_linear_ref
from radixflow.kernels.testing import random_gguf_weight, relative_error

# fp32: exact weights, fp32 sums; fp16: x and the weights rounded to fp16 before the products.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = list(TOLERANCE)


@functools.cache
def weight(qtype: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return random_gguf_weight(qtype, n, k, torch.Generator().manual_seed(n + k))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 3, 9, 20])
def test_matches_gguf_dequantize_then_linear(rows, qtype, with_bias, dtype):
    n, k = 70, 64  # two column tiles, the second ragged; two blocks along K
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    got = quant_linear_triton(x, packed, qtype, k, bias)
    assert got.shape == (rows, n) and got.dtype == dtype and not got.isnan().any()
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert relative_error(got, exact) < TOLERANCE[dtype]
    assert relative_error(got, quant_linear_ref(x, packed, qtype, k, bias)) < TOLERANCE[dtype]


@pytest.mark.parametrize("split_k", [2, 3, 8])
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [3, 20], ids=["scale-after-dot", "dequantized-tile"])
def test_k_split_over_programs_gives_the_unsplit_result(rows, qtype, split_k):
    n, k = 40, 320  # ten blocks: 3 shares of 4, 4 and 2 blocks; 8 shares become 5 of 2
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(split_k)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    whole = quant_linear_triton(x, packed, qtype, k, bias, split_k=1)
    split = quant_linear_triton(x, packed, qtype, k, bias, split_k=split_k)
    assert relative_error(split, whole) < 1e-6
    assert relative_error(split, F.linear(x.double(), w.double(), bias.double())) < 1e-5


def test_split_k_grows_only_while_the_gpu_has_idle_multiprocessors(monkeypatch):
    monkeypatch.setattr(quant_triton, "_multiprocessors", lambda device: 132)
    cuda = torch.device("cuda")  # 8 programs per multiprocessor wanted: 1056
    assert quant_triton.PROGRAMS_PER_MULTIPROCESSOR == 8
    assert quant_triton.choose_split_k(224, 128, cuda) == 8  # 224 x 8 tiles >= 1056
    assert quant_triton.choose_split_k(132, 4096, cuda) == 8
    assert quant_triton.choose_split_k(1100, 448, cuda) == 1  # enough tiles already
    assert quant_triton.choose_split_k(1, 40, cuda) == 4  # shares keep 8 blocks at least
    assert quant_triton.choose_split_k(64, 448, cuda) == quant_triton.MAX_SPLIT_K


def test_writes_into_out_with_strided_rows():
    packed, w = weight("q8_0", 70, 64)
    x = torch.randn(5, 64)
    wide = torch.full((5, 80), float("nan"))
    got = quant_linear_triton(x, packed, "q8_0", 64, out=wide[:, 3:73])
    assert got.data_ptr() == wide[:, 3:73].data_ptr()
    assert wide[:, :3].isnan().all() and wide[:, 73:].isnan().all()
    assert relative_error(wide[:, 3:73], F.linear(x, w)) < 1e-5


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(qtype="q4_k"), r"takes \['q8_0', 'q4_0', 'q4_1'\], got 'q4_k'"),
        (dict(k=40), "multiples of 32 weights, got K=40"),
        (dict(x=torch.zeros(2, 64, dtype=torch.float64)), "x must be one of"),
        (dict(x=torch.zeros(2, 32)), r"x must be \[M, 64\]"),
        (dict(bias=torch.zeros(3)), r"bias must be \[4\]"),
        (dict(out=torch.zeros(4, 2)), r"out must be a torch.float32 tensor of shape \(2, 4\)"),
        (dict(split_k=0), "split_k must be at least 1, got 0"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(change, message):
    args = dict(x=torch.zeros(2, 64), packed=weight("q8_0", 4, 64)[0], qtype="q8_0", k=64)
    with pytest.raises(ValueError, match=message):
        quant_linear_triton(**{**args, **change})
