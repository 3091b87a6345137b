"""Batch-1 (and small-batch) decode speed in process: the fused CPU decode layers
(runtime/layers/decode_block.py) against the layer-by-layer path, side by side in one engine.

Each round times, for each path, `decode tokens / (time for 1 + tokens outputs - time for 1)`
after a fresh prompt (greedy, ignore_eos), so prefill and the first step cancel; the rounds
alternate the paths, and the table gives each path's median tok/s and their ratio. With
--batch N, N requests decode together (tok/s counts all of them).

    python benchmarks/decode_speed.py [--model-path PATH] [--tokens 128] [--rounds 5] \\
        [--batch 1 4] [--dtype auto] [--quantization auto]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table  # noqa: E402

import radixflow as rf  # noqa: E402

PROMPT_TOKENS = 16


def decode_rate(engine: rf.Engine, batch: int, tokens: int, rng: random.Random) -> float:
    """Output tokens per second of `batch` requests decoding `tokens` each."""

    def run(n: int) -> float:
        prompts = [[rng.randrange(100, 20000) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]
        params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
        start = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        return time.perf_counter() - start

    return batch * tokens / (run(1 + tokens) - run(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    engine = rf.Engine(args.model_path, dtype=args.dtype, quantization=args.quantization)
    stack = engine.runner.model.decode_stack
    if stack.reason:
        raise SystemExit(f"the fused decode layers do not run here: {stack.reason}")
    rng = random.Random(0)
    rows = []
    try:
        decode_rate(engine, 1, 8, rng)  # warm up both paths' first calls
        for batch in args.batch:
            rates: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.rounds):
                for fused in (True, False):
                    stack.enabled = fused
                    rates[fused].append(decode_rate(engine, batch, args.tokens, rng))
            fused, unfused = (statistics.median(rates[f]) for f in (True, False))
            rows.append([batch, f"{unfused:.1f}", f"{fused:.1f}", f"{fused / unfused:.2f}x"])
    finally:
        stack.enabled = True
        engine.shutdown()
    print_table(["batch", "layer by layer tok/s", "fused tok/s", "ratio"], rows)


if __name__ == "__main__":
    main()
