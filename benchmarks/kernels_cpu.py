"""Every compiled CPU kernel on each instruction set this CPU runs, against its torch twin.

    python benchmarks/kernels_cpu.py [--repeats 9] [--threads N]

Each ISA's library loads once per process, so the script runs itself once per ISA
(`RADIXFLOW_CPU_ISA=avx512`, `=avx2`, ... for the ISAs `cpu_build.runnable_isas()` lists) and
prints two tables. The first: per op and dtype, the median time of the torch path and of each
ISA's kernel (kernel and torch timed in turn in every repeat, so both see the same load on a
shared machine), and torch's time over the kernel's. Shapes are the default model's
(SmolLM2-135M): the row-wise ops over a 128-token prefill, the small-row linear over all 30
layers' weights (as in benchmarks/cpu_linear.py), decode attention for 16 requests of 512
tokens in one layer. Each ISA's run also limits torch itself to that ISA
(`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`), as on a CPU that has nothing better.

The second checks the bf16 table behind `dtype=auto` (kernels/cpu_build.py `FAST_BF16`): torch's
bfloat16 matmul time over its float32 one, per ISA, for a prefill (128 rows) and a decode
(1 row) through the 30 layers' MLP up-projections; below 1 means bf16 is faster there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import print_table
from cpu_linear import model_weights, paired_medians

from radixflow.kernels import cpu_build, cpu_elementwise
from radixflow.kernels.cpu_attention import decode_attention_cpu
from radixflow.kernels.cpu_linear import small_linear
from radixflow.kernels.reference import decode_attention_ref, rms_norm_ref, silu_and_mul_ref
from radixflow.kernels.testing import random_paged_table
from radixflow.runtime.layers.rotary import torch_rotary_neox

TOKENS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 128, 576, 1536, 9, 3, 64

Pair = tuple[Callable[[], object], Callable[[], object]]  # (kernel, torch)
# What limits torch to the ISA under test (on AVX-512 it keeps its own best choice).
TORCH_LIMITS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def cases(dtype: torch.dtype) -> dict[str, Pair]:
    """Each op's (kernel, torch) pair on the default model's shapes."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    x, residual, w = randn(TOKENS, HIDDEN), randn(TOKENS, HIDDEN), randn(HIDDEN)
    gate_up = randn(TOKENS, 2 * INTERMEDIATE)
    q = randn(TOKENS, HEADS, HEAD_DIM)
    cos_sin = randn(TOKENS, HEAD_DIM)
    layers, _ = model_weights(dtype)
    inputs = {k: randn(rows, k) for rows in (1, 4) for k in (HIDDEN, INTERMEDIATE)}

    def linear(fn: Callable[..., torch.Tensor], rows: int) -> Callable[[], object]:
        return lambda: [fn(inputs[w.shape[1]][:rows], w) for w in layers]

    lengths = [512] * 16
    table, rows, slots = random_paged_table(lengths, 16, gen, max_reqs=16)
    qd, k, v = (
        randn(16, HEADS, HEAD_DIM),
        randn(slots, KV_HEADS, HEAD_DIM),
        randn(slots, KV_HEADS, HEAD_DIM),
    )
    seq_lens = torch.tensor(lengths)
    args = (qd, k, v, table, rows, seq_lens, HEAD_DIM**-0.5)
    return {
        "add_rms_norm [128, 576]": (
            lambda: cpu_elementwise.add_rms_norm(x, residual.clone(), w, 1e-5),
            lambda: rms_norm_ref(x + residual.clone(), w, 1e-5),
        ),
        "silu_and_mul [128, 3072]": (
            lambda: cpu_elementwise.silu_and_mul(gate_up),
            lambda: silu_and_mul_ref(gate_up),
        ),
        "rotary [128, 9, 64]": (
            lambda: cpu_elementwise.rotary_neox_(q.clone(), cos_sin, HEAD_DIM),
            lambda: torch_rotary_neox(cos_sin, q.clone(), HEAD_DIM),
        ),
        "linear M=1, 30 layers": (linear(small_linear, 1), linear(F.linear, 1)),
        "linear M=4, 30 layers": (linear(small_linear, 4), linear(F.linear, 4)),
        "decode attention 16 x 512": (
            lambda: decode_attention_cpu(*args),
            lambda: decode_attention_ref(*args),
        ),
    }


def bf16_over_fp32(repeats: int) -> dict[str, float]:
    """torch's bf16 matmul time over its fp32 one, prefill and decode rows, MLP up-projections."""
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(2 * INTERMEDIATE, HIDDEN, generator=gen) for _ in range(30)]
    halves = [w.bfloat16() for w in weights]
    ratios = {}
    for rows in (TOKENS, 1):
        x = torch.randn(rows, HIDDEN, generator=gen)
        fp32, bf16 = paired_medians(
            [
                lambda x=x: [F.linear(x, w) for w in weights],
                lambda x=x: [F.linear(x.bfloat16(), w) for w in halves],
            ],
            repeats,
        )
        ratios[f"{rows} rows"] = bf16 / fp32
    return ratios


def worker(repeats: int) -> None:
    """Print this process's ISA, {op|dtype: [kernel s, torch s]} and the bf16 ratios as JSON."""
    if not cpu_build.cpu_kernels_available():
        raise SystemExit(f"no CPU kernels: {cpu_build.loaded().reason}")
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, pair in cases(dtype).items():
            key = f"{name}|{str(dtype).removeprefix('torch.')}"
            result[key] = paired_medians(list(pair), repeats)
    isa = cpu_build.loaded().describe()
    print(json.dumps({"isa": isa, "times": result, "bf16": bf16_over_fp32(repeats)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        worker(args.repeats)
        return
    runs = []
    for isa in cpu_build.runnable_isas():
        env = {**os.environ, "RADIXFLOW_CPU_ISA": isa, **TORCH_LIMITS.get(isa, {})}
        command = [sys.executable, __file__, "--worker", "--repeats", str(args.repeats)]
        command += ["--threads", str(args.threads)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not runs:
        raise SystemExit("this CPU runs none of the kernel ISAs; only the torch path exists")
    headers = ["op", "dtype", "torch ms"]
    for run in runs:
        headers += [f"{run['isa']} ms", f"torch / {run['isa']}"]
    rows = []
    for key, (_, torch_seconds) in runs[0]["times"].items():
        row: list[object] = [*key.split("|"), f"{torch_seconds * 1e3:.3f}"]
        for run in runs:
            kernel, paired_torch = run["times"][key]
            row += [f"{kernel * 1e3:.3f}", f"{paired_torch / kernel:.2f}x"]
        rows.append(row)
    print(f"threads: {torch.get_num_threads()}; median of {args.repeats} repeats")
    print_table(headers, rows)
    print("\ntorch bf16 matmul time / fp32 (below 1: bf16 faster)")
    print_table(
        ["ISA", *runs[0]["bf16"]],
        [[run["isa"], *(f"{r:.2f}" for r in run["bf16"].values())] for run in runs],
    )


if __name__ == "__main__":
    main()
