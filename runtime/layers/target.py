"""What the ops are chosen for: the device, the dtype, whether Triton kernels run and the
precision of the quantized matmuls' activations."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from radixflow.kernels import cpu_build
from radixflow.kernels.cpu_build import cpu_kernels_available

CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class OpsTarget:
    """triton: run the Triton kernels (on CUDA, or the interpreter under TRITON_INTERPRET); it
    follows the attention backend, so the model's ops and its attention agree."""

    device: torch.device
    dtype: torch.dtype
    triton: bool = False
    # the CPU kernels' packed matmuls round x to int8 per block of 32 (--quant-activations int8)
    int8_activations: bool = False

    @functools.cached_property
    def cpu_kernels(self) -> bool:
        """The C++ CPU kernels apply: a CPU model in one of their dtypes, and the library built
        for this CPU's instruction set (compiled here on first use)."""
        return (
            self.device.type == "cpu"
            and self.dtype in CPU_KERNEL_DTYPES
            and cpu_kernels_available()
        )

    def describe(self) -> str:
        """Device, dtype and, on the CPU, the C++ kernels' ISA or why they are off, e.g.
        `cpu float32, CPU kernels avx512+bf16` (for the ops log line and the startup summary)."""
        where = f"{self.device} {str(self.dtype).removeprefix('torch.')}"
        if self.device.type != "cpu":
            return where
        if self.cpu_kernels:
            return f"{where}, CPU kernels {cpu_build.loaded().describe()}"
        if self.dtype not in CPU_KERNEL_DTYPES:
            return f"{where}, CPU kernels off (they take float32 and bfloat16)"
        return f"{where}, CPU kernels off ({cpu_build.loaded().reason})"
