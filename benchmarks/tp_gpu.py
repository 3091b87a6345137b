"""Tensor parallelism on CUDA GPUs: offline throughput at tp=1 and tp=N, same model, bf16.

Needs N visible GPUs (NCCL between them). Without --model-path a random Llama of about 0.9B
parameters is built from a transformers config (hidden 2048, 16 layers, 16 query / 8 KV
heads, intermediate 5632, vocabulary 32,000) with the tests' small tokenizer. The workload is
offline_throughput.py's: seeded prompts of 32-512 tokens, outputs of 32-256 (ignore_eos).
Printed per tp size: output and total tokens/s, batch-1 decode tokens/s, their ratio to tp=1,
and how many requests' first greedy token agrees with tp=1 (bf16 sums in another order across
ranks, so an occasional near-tie may differ; most should agree).

    python benchmarks/tp_gpu.py [--model-path M] [--tp 2] [--num-prompts 64]

Exits 2 with a message when fewer than N CUDA GPUs are visible or TRITON_INTERPRET=1 is set.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from common import print_table
from offline_throughput import run_radixflow, workload

import radixflow as rf

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from tiny_models import tiny_tokenizer  # noqa: E402

MODEL_CONFIG = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
DECODE_TOKENS = 128  # batch-1 decode length
FIRST_TOKEN_PROMPTS = 16  # prompts whose first greedy token is compared with tp=1


@dataclass
class Measured:
    tp: int
    seconds: float  # the whole workload
    decode_seconds: float  # one request of DECODE_TOKENS outputs, its prefill included
    first_tokens: list[int]


def machine_problem(tp: int) -> str | None:
    """Why this machine cannot run the check, or None."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: unset it to measure compiled kernels"
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < tp:
        return f"tp={tp} needs {tp} CUDA GPUs and {visible} are visible"
    return None


def build_model(path: Path) -> Path:
    """A random bf16 Llama of MODEL_CONFIG with the tests' tokenizer, saved to `path`."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.LlamaConfig(**MODEL_CONFIG)
        )
    model.to(torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def measure(model_path: str, tp: int, prompts: list[list[int]], outputs: list[int]) -> Measured:
    """One engine at `tp` ranks: the workload, a batch-1 decode, the first greedy tokens."""
    with rf.Engine(model_path, dtype="bfloat16", tp_size=tp) as engine:
        first = engine.generate(
            input_ids=prompts[:FIRST_TOKEN_PROMPTS],
            sampling_params={"temperature": 0, "max_new_tokens": 1},
        )  # also warms up every kernel shape the workload's first step needs
        engine.flush_cache()
        seconds = run_radixflow(engine, prompts, outputs)
        engine.flush_cache()
        decode_seconds = run_radixflow(engine, prompts[:1], [DECODE_TOKENS])
    result = Measured(tp, seconds, decode_seconds, [o["output_ids"][0] for o in first])
    del engine
    gc.collect()
    torch.cuda.empty_cache()  # the next engine plans its KV pool from free memory
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model-path", default=None, help="default: a random ~0.9B Llama")
    parser.add_argument("--tp", type=int, default=2, help="the tp size compared with tp=1")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.tp < 2:
        parser.error(f"--tp must be >= 2, got {args.tp}")
    problem = machine_problem(args.tp)
    if problem is not None:
        print(f"tp_gpu: {problem}", file=sys.stderr)
        return 2
    print(", ".join(torch.cuda.get_device_name(i) for i in range(args.tp)))
    with tempfile.TemporaryDirectory(prefix="radixflow-tp-gpu-") as tmp:
        model_path = args.model_path or str(build_model(Path(tmp)))
        vocab = transformers.AutoConfig.from_pretrained(model_path).vocab_size
        prompts, outputs = workload(args.num_prompts, vocab, args.seed)
        runs = [measure(model_path, tp, prompts, outputs) for tp in (1, args.tp)]
    generated, processed = sum(outputs), sum(outputs) + sum(map(len, prompts))
    base = runs[0]
    rows = [
        [
            f"tp={run.tp}",
            f"{generated / run.seconds:.0f}",
            f"{processed / run.seconds:.0f}",
            f"{base.seconds / run.seconds:.2f}x",
            f"{DECODE_TOKENS / run.decode_seconds:.1f}",
            f"{base.decode_seconds / run.decode_seconds:.2f}x",
            f"{sum(a == b for a, b in zip(run.first_tokens, base.first_tokens, strict=True))}"
            f"/{len(base.first_tokens)}",
        ]
        for run in runs
    ]
    print(f"\nmodel {args.model_path or 'random Llama ' + str(MODEL_CONFIG)}, bfloat16")
    print(f"{args.num_prompts} prompts, {processed} tokens processed, {generated} generated")
    print_table(
        ["ranks", "output tok/s", "total tok/s", "vs tp=1", "batch-1 tok/s", "vs tp=1",
         "first token = tp=1"],
        rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
