"""Batch-1 (and small-batch) decode speed in process: the fused CPU decode layers
(runtime/layers/decode_block.py) against the layer-by-layer path, side by side in one engine.

With the default `--quant-activations int8 float`, one engine with each (the packed matmuls'
x rounded to int8, or kept fp32) runs the same rounds, one after the other. Each round times,
for each path, `decode tokens / (time for 1 + tokens outputs - time for 1)`
after a fresh prompt (greedy, ignore_eos), so prefill and the first step cancel; the rounds
alternate the paths, and the table gives each path's median tok/s and their ratio, and the
fused path's share of the batch-1 bound: memory bandwidth (as
benchmarks/cpu_peer.py) over the model's weight bytes, which every decode step reads. With
--batch N, N requests decode together (tok/s counts all of them).

--breakdown adds where one fused batch-1 decode step's time goes, timed in the engine thread
(`breakdown`; "rest of the step" is the step less its stages: the scheduler, batch building,
KV bookkeeping, the embedding and the final norm).

    python benchmarks/decode_speed.py [--model-path PATH] [--tokens 128] [--rounds 5] \\
        [--batch 1 4] [--dtype auto] [--quantization auto] [--quant-activations int8 float] \\
        [--num-threads N] [--breakdown]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import memory_bandwidth, print_table  # noqa: E402

import radixflow as rf  # noqa: E402
from radixflow.runtime.memory_plan import module_bytes  # noqa: E402

PROMPT_TOKENS = 16


def generate(engine: rf.Engine, batch: int, n: int, rng: random.Random) -> float:
    """Seconds for `batch` fresh prompts to generate `n` tokens each."""
    prompts = [[rng.randrange(100, 20000) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]
    params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - start


def decode_rate(engine: rf.Engine, batch: int, tokens: int, rng: random.Random) -> float:
    """Output tokens per second of `batch` requests decoding `tokens` each."""
    return (
        batch
        * tokens
        / (generate(engine, batch, 1 + tokens, rng) - generate(engine, batch, 1, rng))
    )


@contextlib.contextmanager
def timed(stages: dict[str, tuple[Any, str]], log: list[dict[str, int]]) -> Iterator[None]:
    """Time each stage's method (label -> (object, method name)) while inside; `log` gets one
    dict of nanoseconds per call of the first stage (the step), holding the stages it ran."""

    def wrap(label: str, fn: Callable[..., Any], first: bool) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            if first:
                log.append({})
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                log[-1][label] = log[-1].get(label, 0) + time.perf_counter_ns() - start

        return timed_call

    for i, (label, (obj, name)) in enumerate(stages.items()):
        setattr(obj, name, wrap(label, getattr(obj, name), i == 0))
    try:
        yield
    finally:
        for obj, name in stages.values():
            delattr(obj, name)  # the instance attribute goes; the class's method is back


def breakdown(engine: rf.Engine, tokens: int, rng: random.Random) -> list[list[str]]:
    """Mean ms per stage of one request's fused batch-1 decode steps, and its share. The means
    are over the quieter half of the steps (at or below the median step time): they add up,
    and most stalls of a shared machine stay out."""
    model = engine.runner.model
    stages = {
        "engine step": (engine, "step"),
        "fused decoder layers": (model.decode_stack, "forward"),
        "lm_head (logits)": (model, "logits"),
        "output processing (sample, stop checks)": (engine.outputs, "process"),
    }
    log: list[dict[str, int]] = []
    with timed(stages, log):
        generate(engine, 1, 1 + tokens, rng)
    # decode steps only, without the last: the caller may wake before that step's timer stops
    steps = [dict(s) for s in log[:-1] if "fused decoder layers" in s]
    median = statistics.median(s["engine step"] for s in steps)
    quiet = [s for s in steps if s["engine step"] <= median]
    for s in quiet:
        inner = sum(ns for label, ns in s.items() if label != "engine step")
        s["rest of the step"] = s["engine step"] - inner
    total = statistics.fmean(s["engine step"] for s in quiet)
    rows = []
    for label in [*list(stages)[1:], "rest of the step", "engine step"]:
        ns = statistics.fmean(s[label] for s in quiet)
        rows.append([label, f"{ns / 1e6:.2f}", f"{ns / total:.0%}"])
    return rows


def measure(args: argparse.Namespace, activations: str) -> tuple[list[list], list[list]]:
    """Table rows (and the step breakdown, with --breakdown) of one engine."""
    engine = rf.Engine(
        args.model_path,
        dtype=args.dtype,
        quantization=args.quantization,
        quant_activations=activations,
        num_threads=args.num_threads,
    )
    stack = engine.runner.model.decode_stack
    if stack.reason:
        engine.shutdown()
        raise SystemExit(f"the fused decode layers do not run here: {stack.reason}")
    weight_bytes = module_bytes(engine.runner.model)
    bandwidth = memory_bandwidth()
    bound = bandwidth / weight_bytes
    print(
        f"{activations} activations: {weight_bytes / 2**20:.0f} MiB of weights; memory bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s; batch-1 decode bound {bound:.0f} tok/s"
    )
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
            share = f"{fused / bound:.0%}" if batch == 1 else ""
            rows.append(
                [activations, batch, f"{unfused:.1f}", f"{fused:.1f}", f"{fused / unfused:.2f}x"]
                + [share]
            )
        stack.enabled = True
        steps = breakdown(engine, args.tokens, rng) if args.breakdown else []
    finally:
        stack.enabled = True
        engine.shutdown()
    return rows, [[activations, *step] for step in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the default model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument(
        "--quant-activations",
        nargs="+",
        default=["int8", "float"],
        choices=["int8", "float"],
        help="one engine each, one after the other",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="default: torch's")
    parser.add_argument("--breakdown", action="store_true", help="time a step's stages")
    args = parser.parse_args()
    rows, steps = [], []
    for activations in args.quant_activations:
        engine_rows, engine_steps = measure(args, activations)
        rows += engine_rows
        steps += engine_steps
    headers = ["activations", "batch", "layer by layer tok/s", "fused tok/s", "ratio"]
    print_table([*headers, "fused / bound"], rows)
    if steps:
        print()
        print_table(["activations", "batch-1 decode step stage", "ms", "share"], steps)


if __name__ == "__main__":
    main()
