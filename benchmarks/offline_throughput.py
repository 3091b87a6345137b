"""Offline throughput: radixflow's engine against transformers `generate`, one run, same model.

64 prompts of seeded random lengths 32-512 tokens, outputs of 32-256 tokens (ignore_eos, so
lengths are exact), default model, for each dtype. transformers runs batches of 16 with left
padding; each batch runs to its longest request and only the requested tokens are counted.
Also batch-1 decode for both, and the fraction of this machine's roofline:

  throughput roofline = matmul rate / (2 * params) tokens/s, over prompt + output tokens
  batch-1 roofline    = memory bandwidth / weight bytes, decode tokens/s

    python benchmarks/offline_throughput.py [--dtypes float32 bfloat16] [--num-prompts 64]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import transformers
from common import matmul_rate, memory_bandwidth, print_table

import radixflow as rf
from radixflow.runtime.model_loader import transformers_dir


def workload(n: int, vocab: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(32, 512))] for _ in range(n)]
    outputs = [rng.randint(32, 256) for _ in range(n)]
    return prompts, outputs


def run_radixflow(engine: rf.Engine, prompts: list[list[int]], outputs: list[int]) -> float:
    params = [{"max_new_tokens": o, "ignore_eos": True, "temperature": 0} for o in outputs]
    start = time.perf_counter()
    results = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    assert [r["meta_info"]["completion_tokens"] for r in results] == outputs
    return elapsed


def run_transformers(
    model, prompts: list[list[int]], outputs: list[int], batch_size: int, pad_id: int
) -> float:
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch, outs = prompts[i : i + batch_size], outputs[i : i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(outs),
                min_new_tokens=max(outs),
                do_sample=False,
                pad_token_id=pad_id,
            )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    bandwidth = memory_bandwidth()
    print(f"memory bandwidth: {bandwidth / 1e9:.1f} GB/s, threads: {torch.get_num_threads()}")
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        rate = matmul_rate(dtype)
        engine = rf.Engine(dtype=dtype_name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            transformers_dir(engine.model_dir), dtype=dtype
        )
        params = sum(p.numel() for p in hf.parameters())
        weight_bytes = params * dtype.itemsize
        prompts, outputs = workload(args.num_prompts, engine.vocab_size, args.seed)
        processed = sum(map(len, prompts)) + sum(outputs)
        roof_tput = rate / (2 * params)  # tokens/s if every matmul ran at the measured rate
        roof_b1 = bandwidth / weight_bytes
        generated = sum(outputs)

        ours = run_radixflow(engine, prompts, outputs)
        theirs = run_transformers(hf, prompts, outputs, args.hf_batch_size, pad_id=2)
        one_prompt, one_out = prompts[:1], [64]
        ours_b1 = run_radixflow(engine, one_prompt, one_out)
        theirs_b1 = run_transformers(hf, one_prompt, one_out, 1, pad_id=2)
        engine.shutdown()

        print(
            f"{dtype_name}: matmul {rate / 1e9:.0f} GFLOP/s, {params / 1e6:.1f}M params, "
            f"rooflines {roof_tput:.0f} tok/s (compute) / {roof_b1:.0f} tok/s (batch-1 bandwidth)"
        )
        for name, secs, b1 in (("radixflow", ours, ours_b1), ("transformers", theirs, theirs_b1)):
            rows.append(
                [
                    dtype_name,
                    name,
                    f"{generated / secs:.0f}",
                    f"{processed / secs / roof_tput:.0%}",
                    f"{64 / b1:.1f}",
                    f"{64 / b1 / roof_b1:.0%}",
                ]
            )
        rows.append(
            [dtype_name, "ratio", f"{theirs / ours:.2f}x", "", f"{theirs_b1 / ours_b1:.2f}x", ""]
        )
    print()
    print_table(
        [
            "dtype",
            "engine",
            f"output tok/s ({args.num_prompts} prompts)",
            "of compute roofline",
            "batch-1 tok/s",
            "of bandwidth roofline",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
