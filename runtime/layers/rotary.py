"""Rotary position embeddings: the cos/sin table for the HF RoPE variants, and its application.

    torch    rotate-half in the activation dtype (cos/sin rounded to it first, as HF does)
    cpu      kernels/cpu_elementwise.py, in place, the same rounding
    triton   kernels/rotary.py, in place, fp32 cos/sin rounded once at the end

The table is built once per model (fp32, on the model's device); a forward binds the batch's
positions once (`RotaryEmbedding.rotation`) and every layer rotates its q and k with that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixflow.kernels import cpu_elementwise
from radixflow.runtime.layers.target import OpsTarget

# (q, k) -> rotated (q, k), built once per forward for the batch's positions
Rotate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (positions, cos_sin_cache fp32, activation dtype, head_dim) -> Rotate
BindRotation = Callable[[torch.Tensor, torch.Tensor, torch.dtype, int], Rotate]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    rotary_dim: int
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    @classmethod
    def from_config(cls, config, head_dim: int) -> RopeSpec:
        """Read RoPE settings from a HF config (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        scaling = getattr(config, "rope_scaling", None) or {}
        params = {**scaling, **params}
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}"
            )
        partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        return cls(
            theta=float(theta),
            rotary_dim=int(head_dim * (partial or 1.0)),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0) or 1.0),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position=int(params.get("original_max_position_embeddings", 8192)),
        )

    def inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64) / self.rotary_dim
        inv_freq = 1.0 / (self.theta**exponents)
        if self.rope_type == "linear":
            inv_freq = inv_freq / self.factor
        elif self.rope_type == "llama3":
            inv_freq = self._llama3_scale(inv_freq)
        return inv_freq

    def _llama3_scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        low_wavelen = self.original_max_position / self.low_freq_factor
        high_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)

    def cos_sin_cache(self, max_position: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """[max_position, rotary_dim] float32: cos in the first half, sin in the second."""
        t = torch.arange(max_position, dtype=torch.float64)
        freqs = torch.outer(t, self.inv_freq())
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(torch.float32).to(device)


def torch_rotary_neox(cos_sin: torch.Tensor, x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """x [T, heads, head_dim] rotated (a new tensor) in the rotate-half layout by each token's
    cos | sin row of cos_sin [T, rotary_dim], in cos_sin's dtype; dims past rotary_dim stay."""
    half = rotary_dim // 2
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:]
    rot = x[..., :rotary_dim]
    x1, x2 = rot[..., :half], rot[..., half:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    if rotary_dim == x.shape[-1]:
        return out
    return torch.cat([out, x[..., rotary_dim:]], dim=-1)


def _bind_torch(
    positions: torch.Tensor, cache: torch.Tensor, dtype: torch.dtype, head_dim: int
) -> Rotate:
    cos_sin = cache.index_select(0, positions).to(dtype)
    dim = cache.shape[1]

    def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch_rotary_neox(cos_sin, q, dim), torch_rotary_neox(cos_sin, k, dim)

    return rotate


def _bind_cpu(
    positions: torch.Tensor, cache: torch.Tensor, dtype: torch.dtype, head_dim: int
) -> Rotate:
    cos_sin = cache.index_select(0, positions).to(dtype)
    dim = cache.shape[1]

    def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            cpu_elementwise.rotary_neox_(q, cos_sin, dim),
            cpu_elementwise.rotary_neox_(k, cos_sin, dim),
        )

    return rotate


@dataclass(frozen=True)
class RotaryImpl:
    name: str
    bind: BindRotation


def choose_rotary(target: OpsTarget) -> RotaryImpl:
    if target.triton:
        from radixflow.kernels.rotary import rotary_embedding

        def bind_triton(
            positions: torch.Tensor, cache: torch.Tensor, dtype: torch.dtype, head_dim: int
        ) -> Rotate:
            def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return rotary_embedding(positions, q, k, cache, head_dim, True)

            return rotate

        return RotaryImpl("triton", bind_triton)
    if target.cpu_kernels:
        return RotaryImpl("cpu", _bind_cpu)
    return RotaryImpl("torch", _bind_torch)


class RotaryEmbedding:
    """The model's RoPE table and its bound implementation (neox layout, as HF Llama).

    The table stays float32 whatever the model's dtype: it is a plain attribute, not a module
    buffer, so `Module.to(dtype)` leaves it alone. It is made on the current default device.
    """

    def __init__(self, spec: RopeSpec, head_dim: int, max_position: int, impl: RotaryImpl) -> None:
        self.spec = spec
        self.head_dim = head_dim
        self.impl = impl
        self.cos_sin_cache = spec.cos_sin_cache(max_position, torch.get_default_device())

    def rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotate:
        """The rotation of this batch's positions, for activations of `dtype`."""
        return self.impl.bind(positions, self.cos_sin_cache, dtype, self.head_dim)
