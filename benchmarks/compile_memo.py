"""Compile time of JSON Schemas whose sub-schemas earlier requests held (`json_schema_memo`):
each subset compiled once with the process's memo empty (cold), then again with the grammar
cache emptied and the memo kept (sub-schemas from the first pass reused), then again with the
memo emptied before every compile (no sharing across requests at all), all in this process.

    .venv/bin/python benchmarks/compile_memo.py --limit 60 --repeats 3

Each figure is the median of `--repeats` passes, per schema; the table gives their sum, p50
and p99 over a subset's schemas (schemas that fail to compile included, as the harness counts
them). WashingtonPost's schemas share most of their recursive definitions, Kubernetes' their
`$ref` targets.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time

from common import percentile, print_table
from grammar_bench import BENCH, SUBSETS, Radixflow, load_tokenizer

from radixflow.grammars import json_schema_memo


def _timed(engine: Radixflow, schema) -> float:
    start = time.perf_counter()
    with contextlib.suppress(ValueError):  # a refused schema counts its time, as in the harness
        engine.compile(schema)
    return time.perf_counter() - start


def _fresh_memo() -> None:
    json_schema_memo._shared = json_schema_memo.SubschemaMemo()


def passes(engine: Radixflow, schemas: list, repeats: int) -> dict[str, list[float]]:
    """Per schema, the median over `repeats` of its compile seconds in each kind of pass."""
    runs: dict[str, list[list[float]]] = {"cold": [], "memo kept": [], "no memo": []}
    for _ in range(repeats):
        engine.gc.clear_cache()
        _fresh_memo()
        runs["cold"].append([_timed(engine, s) for s in schemas])
        engine.gc.clear_cache()
        runs["memo kept"].append([_timed(engine, s) for s in schemas])
        engine.gc.clear_cache()
        no_memo = []
        for schema in schemas:
            _fresh_memo()
            no_memo.append(_timed(engine, schema))
        runs["no memo"].append(no_memo)
    return {kind: [statistics.median(t) for t in zip(*r, strict=True)] for kind, r in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60, help="schemas per subset")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--subsets", default=",".join(SUBSETS))
    args = parser.parse_args()
    tok = load_tokenizer("smollm")
    engine = Radixflow(tok, max(len(tok), max(tok.get_vocab().values()) + 1))
    gc.collect()
    gc.freeze()  # as the harness's workers and the engine do after setup
    rows = []
    for subset in args.subsets.split(","):
        files = sorted((BENCH / subset).glob("*.json"))[: args.limit]
        schemas = [json.loads(f.read_text())["schema"] for f in files]
        got = passes(engine, schemas, args.repeats)
        for kind, seconds in got.items():
            ms = [s * 1e3 for s in seconds]
            rows.append([subset, kind, f"{sum(ms):.0f}", f"{percentile(ms, 50):.2f}",
                         f"{percentile(ms, 99):.2f}",
                         f"{sum(seconds) / sum(got['cold']):.2f}x"])  # fmt: skip
    print_table(["subset", "pass", "sum ms", "p50 ms", "p99 ms", "vs cold"], rows)


if __name__ == "__main__":
    main()
