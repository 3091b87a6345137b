"""The model's projections: the compiled small-row CPU kernel for a few rows, F.linear otherwise.

A step with at most `MAX_ROWS` tokens (decode of a few requests, speculative verification) is
bound by reading the weights; on the CPU the small-row kernel (kernels/cpu_linear.py) streams
them much faster than `F.linear`. Prefill, large batches, other dtypes and autograd go to
`F.linear` (kernels/reference.py `linear_ref`); on CUDA everything does.

Weights kept packed in ggml blocks (GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K, or quantized at load) live in
`QuantLinear`, bound to a `QuantLinearImpl` (reference: kernels/reference.py `quant_linear_ref`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.kernels import quant_linear
from radixflow.kernels.cpu_linear import DTYPES, MAX_ROWS, small_linear
from radixflow.kernels.quant_formats import (
    INTERLEAVE_ROWS,
    INTERLEAVED,
    QTYPES,
    PackedWeight,
    deinterleave_rows,
    interleave_rows,
    interleaved_qtype,
    row_bytes,
)
from radixflow.kernels.reference import linear_ref, quant_linear_ref
from radixflow.runtime.layers.target import OpsTarget

LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class LinearImpl:
    name: str
    fn: LinearFn


def _small_rows_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the small-row kernel for the shapes it takes."""
    if (
        x.dim() == 2
        and 1 <= x.shape[0] <= MAX_ROWS
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and (bias is None or bias.dtype == x.dtype)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return small_linear(x, weight, bias)
    return linear_ref(x, weight, bias)


def choose_linear(target: OpsTarget) -> LinearImpl:
    if target.cpu_kernels:
        return LinearImpl("cpu-small-rows", _small_rows_linear)
    return LinearImpl("torch", linear_ref)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict names) whose forward runs the bound impl."""

    def __init__(self, in_features: int, out_features: int, bias: bool, impl: LinearImpl) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl.fn(x, self.weight, self.bias)


# -- packed (quantized) weights ---------------------------------------------------------------
QuantLinearFn = Callable[[torch.Tensor, torch.Tensor, str, int, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class QuantLinearImpl:
    """`fn(x, packed, qtype, k, bias)` = kernels/reference.py `quant_linear_ref` (with
    `int8_activations`). `qtypes`: the types it runs without dequantizing the whole weight per
    call (the reference runs every type, but `quantization=auto` keeps GGUF weights packed only
    where this set has their type). `int8_activations`: its q4_0/q4_1/q8_0 products take x
    rounded to int8 per block of 32 (kernels/quant_linear.py); the fused decode ops follow it.
    `interleaved`: plain qtypes it reads faster interleaved by 16 rows (quant_formats.py), which
    layers store so once loaded."""

    name: str
    fn: QuantLinearFn
    qtypes: frozenset[str]
    int8_activations: bool = False
    interleaved: frozenset[str] = frozenset()


def _cpu_quant_linear(int8_activations: bool) -> QuantLinearFn:
    """The compiled CPU kernel (kernels/quant_linear.py) for the dtypes it takes."""

    def cpu_quant_linear(
        x: torch.Tensor, packed: torch.Tensor, qtype: str, k: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if (
            x.dim() == 2
            and x.dtype in quant_linear.DTYPES
            and (bias is None or bias.dtype == x.dtype)
        ):
            return quant_linear.quant_linear(
                x, packed, qtype, k, bias, int8_activations=int8_activations
            )
        return quant_linear_ref(x, packed, qtype, k, bias, int8_activations=int8_activations)

    return cpu_quant_linear


def choose_quant_linear(target: OpsTarget) -> QuantLinearImpl:
    """Triton (W8A16/W4A16: q8_0, q4_0, q4_1) on CUDA with the Triton kernels, the compiled
    CPU kernel (every qtype) where the CPU kernels are built (also under the Triton
    interpreter, as the other matmuls; int8 activations as the target says), else the
    reference, which dequantizes the whole weight on every call (no type counts as fast
    there)."""
    if target.triton and target.device.type == "cuda":
        from radixflow.kernels import quant_triton

        def triton_quant_linear(
            x: torch.Tensor, packed: torch.Tensor, qtype: str, k: int, bias: torch.Tensor | None
        ) -> torch.Tensor:
            if qtype in quant_triton.QTYPES and x.dim() == 2 and x.dtype in quant_triton.DTYPES:
                return quant_triton.quant_linear_triton(x, packed, qtype, k, bias)
            return quant_linear_ref(x, packed, qtype, k, bias)

        return QuantLinearImpl("triton", triton_quant_linear, frozenset(quant_triton.QTYPES))
    if target.cpu_kernels and quant_linear.quant_linear_available():
        int8 = target.int8_activations
        name = "cpu-int8-activations" if int8 else "cpu"
        interleaved = frozenset(INTERLEAVED.values())
        return QuantLinearImpl(name, _cpu_quant_linear(int8), frozenset(QTYPES), int8, interleaved)
    return QuantLinearImpl("torch-dequantize", quant_linear_ref, frozenset())


# Rows (a multiple of INTERLEAVE_ROWS) (de)interleaved at a time: a copy of a whole segment (the
# 49152-row embedding: 29 MiB, three times over) would raise the peak RSS of loading.
_LAYOUT_CHUNK_ROWS = 64 * INTERLEAVE_ROWS


def _in_place(packed: torch.Tensor, convert: Callable, qtype: str) -> None:
    """packed's rows through `convert` (interleave_rows or deinterleave_rows), a chunk of whole
    groups at a time (a group's bytes stay within its rows)."""
    for start in range(0, packed.shape[0], _LAYOUT_CHUNK_ROWS):
        part = packed[start : start + _LAYOUT_CHUNK_ROWS]
        part.copy_(convert(part, qtype))


class QuantLinear(nn.Module):
    """A projection whose weight stays packed (kernels/quant_formats.py), run by the bound impl.

    A fused projection (q|k|v, gate|up) may mix qtypes, as GGUF K-quant files do: its output
    rows are held in segments of one qtype each, one buffer `packed<i>` [rows, row_bytes] per
    segment, and the segments' outputs are concatenated. Weights load in the file's layout;
    `interleave_rows` then stores the segments the impl reads faster interleaved so.
    """

    def __init__(
        self, in_features: int, parts: list[tuple[int, str]], bias: bool, impl: QuantLinearImpl
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = sum(rows for rows, _ in parts)
        self.impl = impl
        self.segments: list[tuple[str, int, int]] = []  # (qtype, first output row, rows)
        start = 0
        for rows, qtype in parts:
            if self.segments and self.segments[-1][0] == qtype:
                first = self.segments[-1][1]
                self.segments[-1] = (qtype, first, start + rows - first)
            else:
                self.segments.append((qtype, start, rows))
            start += rows
        for i, (qtype, _, rows) in enumerate(self.segments):
            nbytes = row_bytes(qtype, in_features)
            self.register_buffer(f"packed{i}", torch.empty(rows, nbytes, dtype=torch.uint8))
        self.bias = nn.Parameter(torch.zeros(self.out_features)) if bias else None

    def packed(self, i: int) -> torch.Tensor:
        return getattr(self, f"packed{i}")

    def load(self, weight: PackedWeight, row_offset: int | None = None) -> None:
        """Copy a packed weight in: the whole weight (`row_offset` None), or one part of a
        fused one starting at output row `row_offset`."""
        rows, k = weight.shape
        start = row_offset or 0
        whole = row_offset is None and rows != self.out_features
        for i, (qtype, first, count) in enumerate(self.segments):
            if first <= start < first + count:
                if qtype in INTERLEAVED:  # loading again: back to the file's layout first
                    qtype = INTERLEAVED[qtype]
                    _in_place(self.packed(i), deinterleave_rows, self.segments[i][0])
                    self.segments[i] = (qtype, first, count)
                if (
                    whole
                    or weight.qtype != qtype
                    or k != self.in_features
                    or start + rows > first + count
                ):
                    raise ValueError(
                        f"packed {weight.qtype} weight {list(weight.shape)} does not fit rows "
                        f"{first}-{first + count} ({qtype}, K={self.in_features}) at row {start}"
                    )
                self.packed(i)[start - first : start - first + rows].copy_(weight.data)
                return
        raise ValueError(f"row {start} is outside this layer's {self.out_features} rows")

    def interleave_rows(self) -> None:
        """Store each segment whose qtype the impl reads interleaved (`QuantLinearImpl.
        interleaved`) in that layout; called once every weight is loaded."""
        for i, (qtype, first, count) in enumerate(self.segments):
            if qtype in self.impl.interleaved:
                _in_place(self.packed(i), interleave_rows, qtype)
                self.segments[i] = (interleaved_qtype(qtype), first, count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, (qtype, first, count) in enumerate(self.segments):
            bias = None if self.bias is None else self.bias[first : first + count]
            outs.append(self.impl.fn(x, self.packed(i), qtype, self.in_features, bias))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
