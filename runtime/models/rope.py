"""Rotary position embeddings: the cos/sin table for the HF RoPE variants we support."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

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


def apply_rotary_neox(cos_sin: torch.Tensor, x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] in the rotate-half (neox / HF Llama) layout.

    cos_sin holds each token's row of the cache ([T, rotary_dim], already indexed by position).
    """
    half = rotary_dim // 2
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:]
    rot = x[..., :rotary_dim]
    x1, x2 = rot[..., :half], rot[..., half:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    if rotary_dim == x.shape[-1]:
        return out
    return torch.cat([out, x[..., rotary_dim:]], dim=-1)
