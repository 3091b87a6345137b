"""Python's cyclic collector while radixflow compiles and walks JSON Schemas, as
`grammar_bench.py`'s worker does (collector frozen after setup), in this one process: how many
full collections ran, the time all collections took, how much of it landed inside compiles,
and the compile times with and without it.

    .venv/bin/python benchmarks/grammar_gc.py --limit 60

What a cache of walked grammars keeps decides what a full collection walks; the compile p99 of
the harness is where those collections (and the evictions of walked grammars) show.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from common import percentile, print_table
from grammar_bench import BENCH, SUBSETS, Radixflow, load_tokenizer, run_schema


class CollectorClock:
    """Time in the collector (`gc.callbacks`), full collections counted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        self.full += info["generation"] == 2


def measure(tok_name: str, subsets: list[str], limit: int) -> list[object]:
    tok = load_tokenizer(tok_name)
    engine = Radixflow(tok, max(len(tok), max(tok.get_vocab().values()) + 1))
    clock = CollectorClock()
    compiles: list[tuple[float, float]] = []  # (seconds, of which in the collector)

    def timed(schema, compile=engine.compile):
        in_gc, start = clock.seconds, time.perf_counter()
        try:
            return compile(schema)
        finally:
            compiles.append((time.perf_counter() - start, clock.seconds - in_gc))

    engine.compile = timed
    gc.collect()
    gc.freeze()  # as the harness's worker (and the engine) do after setup
    gc.callbacks.append(clock)
    try:
        for subset in subsets:
            for path in sorted((BENCH / subset).glob("*.json"))[:limit]:
                run_schema(engine, tok, json.loads(path.read_text()))
    finally:
        gc.callbacks.remove(clock)
        gc.unfreeze()
    total = [t * 1e3 for t, _ in compiles]
    outside = [(t - g) * 1e3 for t, g in compiles]
    return [
        tok_name,
        len(compiles),
        clock.full,
        f"{clock.seconds * 1e3:.0f}",
        f"{sum(g for _, g in compiles) * 1e3:.0f}",
        f"{percentile(total, 50):.2f} / {percentile(total, 99):.2f}",
        f"{percentile(outside, 50):.2f} / {percentile(outside, 99):.2f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--limit", type=int, default=60, help="schemas per subset (sorted by name)")
    ap.add_argument("--subsets", default=",".join(SUBSETS))
    ap.add_argument("--tokenizers", default="smollm")
    args = ap.parse_args()
    rows = [measure(t, args.subsets.split(","), args.limit) for t in args.tokenizers.split(",")]
    print_table(
        [
            "tokenizer",
            "schemas",
            "full collections",
            "collector ms",
            "of it in compiles ms",
            "compile p50 / p99 ms",
            "less the collector",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
