"""The compiled CPU small-row linear against F.linear, and the model's choice between them."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.cpu_build import current_choice
from radixflow.kernels.cpu_linear import MAX_ROWS, small_linear
from radixflow.kernels.testing import relative_error
from radixflow.runtime.layers import linear as model_linear
from radixflow.runtime.layers.target import OpsTarget

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = list(TOLERANCE)
# The default model's projections (qkv, o, gate_up, down), then sizes that leave a ragged
# block of rows and a masked tail of K (bf16 lines hold 32 elements, fp32 ones 16).
MODEL_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
ODD_SHAPES = [(37, 33), (5, 1000), (17, 100), (1, 7), (203, 65)]


@functools.cache
def weights(n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n * 7919 + k)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    return w.to(dtype), torch.randn(n, generator=gen).to(dtype)


def check(rows: int, n: int, k: int, dtype: torch.dtype, with_bias: bool) -> None:
    w, b = weights(n, k, dtype)
    bias = b if with_bias else None
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
    out = torch.full((rows, n), float("nan"), dtype=dtype)
    got = small_linear(x, w, bias, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    # torch's own bf16 linear accumulates differently per platform (on aarch64 ~1e-2 from the
    # exact result): the reference is the same inputs multiplied in fp32, rounded once
    fp32 = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert relative_error(got, fp32.to(dtype)) < TOLERANCE[dtype]
    exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert relative_error(got, exact) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", MODEL_SHAPES + ODD_SHAPES)
def test_matches_f_linear_for_every_row_count(shape, with_bias, dtype):
    for rows in range(1, MAX_ROWS + 1):
        check(rows, *shape, dtype, with_bias)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lm_head_logits_cast_to_float(dtype):
    w, _ = weights(49152, 576, dtype)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(3)).to(dtype)
    logits = small_linear(x, w).float()
    assert relative_error(logits, F.linear(x, w).float()) < TOLERANCE[dtype]
    # the token picked is the best one, up to the output dtype's rounding of near-ties
    exact = F.linear(x.double(), w.double())
    picked = exact.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)
    gap = exact.max(-1).values - picked
    assert (gap <= TOLERANCE[dtype] * exact.abs().max(-1).values).all(), gap


def test_strided_rows_of_x_and_out():
    w, b = weights(96, 80, torch.float32)
    wide = torch.randn(4, 200)
    x = wide[:, 50:130]  # row stride 200
    out_wide = torch.full((4, 300), float("nan"))
    small_linear(x, w, b, out=out_wide[:, 100:196])
    assert relative_error(out_wide[:, 100:196], F.linear(x, w, b)) < 1e-5
    assert out_wide[:, :100].isnan().all() and out_wide[:, 196:].isnan().all()


def test_bad_arguments_raise_value_errors():
    w, b = weights(16, 32, torch.float32)
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match="rows"):
        small_linear(torch.randn(MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="weight"):
        small_linear(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="dtype"):
        small_linear(x.bfloat16(), w)
    with pytest.raises(ValueError, match="dtype"):
        small_linear(x.double(), w.double())
    with pytest.raises(ValueError, match="bias"):
        small_linear(x, w, b[:8])
    with pytest.raises(ValueError, match="contiguous"):
        small_linear(x, torch.randn(32, 16).t())
    with pytest.raises(ValueError, match="out"):
        small_linear(x, w, out=torch.empty(2, 15))


def test_model_linear_uses_the_kernel_only_for_few_rows(monkeypatch):
    calls = []

    def recording(x, weight, bias=None):
        calls.append(x.shape[0])
        return small_linear(x, weight, bias)

    monkeypatch.setattr(model_linear, "small_linear", recording)
    impl = model_linear.choose_linear(OpsTarget(torch.device("cpu"), torch.float32))
    assert impl.name == "cpu-small-rows"
    layer = model_linear.Linear(64, 48, True, impl)
    with torch.inference_mode():
        for rows in (1, MAX_ROWS, MAX_ROWS + 1):
            x = torch.randn(rows, 64)
            assert relative_error(layer(x), F.linear(x, layer.weight, layer.bias)) < 1e-5
        layer(torch.randn(2, 64))
        layer.double()(torch.randn(2, 64, dtype=torch.float64))  # no fp64 kernel: F.linear
    assert calls == [1, MAX_ROWS, 2]
    # autograd needs F.linear's backward
    layer.float()(torch.randn(2, 64)).sum().backward()
    assert calls == [1, MAX_ROWS, 2] and layer.weight.grad is not None
