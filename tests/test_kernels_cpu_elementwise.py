"""The compiled CPU RMSNorm, SiLU-and-mul and rotary kernels against their torch references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels import cpu_elementwise
from radixflow.kernels.cpu_build import current_choice
from radixflow.runtime.layers.rotary import torch_rotary_neox

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)
DTYPES = [torch.float32, torch.bfloat16]
# The default model's hidden and MLP sizes, then ones that leave a masked tail of lanes.
WIDTHS = [576, 1536, 40, 7]


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to one rounding step of the dtype (sums taken in another order can round a
    value the other way), and for bfloat16 almost every element bit for bit."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
        assert (got != want).float().mean() < 0.01


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_rms_norm_matches_torch(dtype: torch.dtype, width: int) -> None:
    x = randn(33, width, dtype=dtype, seed=width)
    w = randn(width, dtype=dtype, seed=width + 1)
    assert_matches(cpu_elementwise.rms_norm(x, w, 1e-5), F.rms_norm(x, (width,), w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_updates_the_residual_in_place(dtype: torch.dtype) -> None:
    big = randn(19, 700, dtype=dtype, seed=1)
    x = big[:, 100:676]  # rows with a stride wider than the row: a column slice
    residual = randn(19, 576, dtype=dtype, seed=2)
    w = randn(576, dtype=dtype, seed=3)
    total = x + residual
    out, new_residual = cpu_elementwise.add_rms_norm(x, residual, w, 1e-6)
    assert new_residual.data_ptr() == residual.data_ptr()
    assert torch.equal(residual, total)
    assert_matches(out, F.rms_norm(total, (576,), w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_silu_and_mul_matches_torch(dtype: torch.dtype, width: int) -> None:
    gate_up = randn(21, 2 * width, dtype=dtype, seed=width, scale=4.0)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # saturated and zero gates
    want = F.silu(gate_up[:, :width]) * gate_up[:, width:]
    assert_matches(cpu_elementwise.silu_and_mul(gate_up), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 64), (128, 64), (48, 48)])
def test_rotary_matches_reference_in_place(dtype: torch.dtype, head_dim: int, rotary_dim: int):
    heads, kv_heads, tokens = 4, 2, 13
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=head_dim)
    q = qkv[:, : heads * head_dim].reshape(tokens, heads, head_dim)  # a strided view
    angles = torch.rand(tokens, rotary_dim // 2, generator=torch.Generator().manual_seed(5)) * 9
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
    want = torch_rotary_neox(cos_sin, q.clone(), rotary_dim)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    got = cpu_elementwise.rotary_neox_(q, cos_sin, rotary_dim)
    assert got.data_ptr() == q.data_ptr()
    assert_matches(q, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)  # v untouched


def test_bad_arguments_are_refused_with_the_reason() -> None:
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="one dtype"):
        cpu_elementwise.rms_norm(x, torch.ones(16, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_elementwise.silu_and_mul(torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="even last dim"):
        cpu_elementwise.silu_and_mul(torch.randn(4, 15))
    with pytest.raises(ValueError, match="must match"):
        cpu_elementwise.add_rms_norm(x, torch.randn(3, 16), torch.ones(16), 1e-5)
    with pytest.raises(ValueError, match="cos_sin"):
        cpu_elementwise.rotary_neox_(torch.randn(4, 2, 8), torch.randn(4, 6), 8)
    with pytest.raises(RuntimeError, match="weight"):
        cpu_elementwise.rms_norm(x, torch.ones(8), 1e-5)


def test_autograd_inputs_keep_the_torch_path() -> None:
    weight = torch.nn.Parameter(torch.ones(16))
    assert cpu_elementwise.applies(torch.randn(2, 16), weight.detach())
    assert not cpu_elementwise.applies(torch.randn(2, 16), weight)
    with torch.no_grad():
        assert cpu_elementwise.applies(torch.randn(2, 16), weight)
