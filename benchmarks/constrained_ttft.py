"""Constrained time to first token, end to end: JSON Schema requests against the same prompts
unconstrained, on the default model (rf.Engine, CPU), in one run.

A batch of `--requests` requests arrives at once; `--repeats` batches, each with new schemas,
and the figures are over all their requests. Each constrained request carries its own
JSONSchemaBench Github_hard schema that this process has never compiled, so its time to first
token covers compiling it (on the engine's grammar pool), queueing, prefill and the first
masked token. The schemas are the first ones (by file name) that compile within
`--compile-limit` seconds, tried in a child process so that none is cached here. Every run
starts from an empty radix cache, after one warm-up request of each kind (the tokenizer's
grammar index is built once per engine, not per request); the unconstrained run goes first. A
third run, with the same grammars compiled beforehand (their masks not yet built), separates
compile time from the rest; the three runs take turns, so the machine's drift hits them alike.

    .venv/bin/python benchmarks/constrained_ttft.py --requests 16 --max-new-tokens 8 --repeats 3

`--gc-threshold 20000` sets the engine's `gc_threshold` knob (Python's collector runs less
often while grammars compile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import percentile, print_table
from constrained_throughput import prompts
from grammar_bench import BENCH, load_tokenizer

import radixflow as rf

WARM_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@dataclass
class Picked:
    schemas: list[dict]
    compile_seconds: list[float]  # each one's compile time in the child, one at a time
    tried: int


def compiling_schemas(files: list[Path], n: int, limit: float) -> Picked:
    """The first `n` schemas of `files` that compile within `limit` seconds (run in a child
    process: it leaves the caller's caches cold)."""
    from radixflow.grammars import GrammarCompiler

    compiler = GrammarCompiler(load_tokenizer("smollm"), compile_timeout=limit)
    compiler.compile_json_schema(WARM_SCHEMA)  # builds the tokenizer's index
    picked = Picked([], [], 0)
    for path in files:
        if len(picked.schemas) == n:
            break
        picked.tried += 1
        schema = json.loads(path.read_text())["schema"]
        start = time.perf_counter()
        try:
            compiler.compile_json_schema(schema)
        except (ValueError, RecursionError):
            continue
        picked.compile_seconds.append(time.perf_counter() - start)
        picked.schemas.append(schema)
    return picked


async def first_token_times(
    engine: rf.Engine, texts: list[str], params: list[dict[str, Any]]
) -> list[float | None]:
    """Seconds from the batch's arrival to each request's first token (None: refused)."""
    start = time.perf_counter()

    async def one(text: str, p: dict[str, Any]) -> float | None:
        first = None
        try:
            stream = await engine.async_generate(text, p, stream=True)
        except ValueError:  # its grammar failed to compile in the engine
            return None
        async for item in stream:
            if first is None and item["meta_info"]["completion_tokens"] > 0:
                first = time.perf_counter() - start
        return first

    return list(await asyncio.gather(*(one(t, p) for t, p in zip(texts, params, strict=True))))


def row(name: str, times: list[float | None], base: float | None) -> list[object]:
    done = [t for t in times if t is not None]
    p50, p90 = percentile(done, 50), percentile(done, 90)
    ratio = f"{p50 / base:.2f}x" if base else ""
    return [name, f"{len(done)}/{len(times)}", f"{p50 * 1e3:.0f}", f"{p90 * 1e3:.0f}", ratio]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--subset", default="Github_hard")
    parser.add_argument("--compile-limit", type=float, default=5.0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3, help="batches of new schemas")
    parser.add_argument("--no-jump-forward", action="store_true")
    parser.add_argument(
        "--gc-threshold", default=None, help="the engine's gc_threshold knob ('gen0[,gen1[,gen2]]')"
    )
    args = parser.parse_args()

    files = sorted((BENCH / args.subset).glob("*.json"))
    wanted = args.requests * args.repeats
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        picked = pool.submit(compiling_schemas, files, wanted, args.compile_limit).result()
    alone = picked.compile_seconds
    print(
        f"{args.subset}: {len(picked.schemas)} of the first {picked.tried} schemas compile within "
        f"{args.compile_limit:g} s; compiled alone, one at a time: p50 "
        f"{percentile(alone, 50) * 1e3:.0f} ms, p90 {percentile(alone, 90) * 1e3:.0f} ms"
    )

    engine = rf.Engine(
        dtype=args.dtype, jump_forward=not args.no_jump_forward, gc_threshold=args.gc_threshold
    )
    texts = prompts(engine, args.requests, "document")
    free = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    engine.generate(texts[0], free)
    engine.generate(texts[0], {**free, "json_schema": json.dumps(WARM_SCHEMA)})
    times: dict[str, list[float | None]] = {"free": [], "cold": [], "warm": []}
    for r in range(args.repeats):  # the three runs in turn, each repeat with new schemas
        sources = [json.dumps(s) for s in picked.schemas[r :: args.repeats]]
        constrained = [{**free, "json_schema": text} for text in sources]
        batch = texts[: len(sources)]
        engine.flush_cache()
        times["free"] += asyncio.run(first_token_times(engine, batch, [free] * len(batch)))
        engine.flush_cache()
        times["cold"] += asyncio.run(first_token_times(engine, batch, constrained))
        engine.flush_cache()  # empties the grammar cache too: compile them again, untimed
        for text in sources:
            engine.grammars.compiler.compile("json_schema", text)
        times["warm"] += asyncio.run(first_token_times(engine, batch, constrained))
    engine.shutdown()

    base = percentile([t for t in times["free"] if t is not None], 50)
    print_table(
        ["requests", "first token", "TTFT p50 ms", "TTFT p90 ms", "p50 vs unconstrained"],
        [
            row("unconstrained", times["free"], None),
            row(f"JSON Schema ({args.subset}), compile included", times["cold"], base),
            row(f"JSON Schema ({args.subset}), already compiled", times["warm"], base),
        ],
    )


if __name__ == "__main__":
    main()
