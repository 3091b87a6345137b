"""Speculative decoding on the default model: speculation off vs on, in one run.

Workloads whose output copies the input (extraction, summarization, code edit) at batch 1 and
batch 16, and JSON with long constant keys under a JSON Schema (jump-forward on in all runs).
Proposers: n-gram prompt lookup, and a draft model built here by layer skipping (the default
model's first --draft-layers decoder layers with its final norm and lm_head: same tokenizer,
no extra download). Greedy, so every run produces the target's tokens; the table reports
tokens/s, the speed ratio and the mean tokens per verify step (acceptance length; 1.0 = no
draft accepted). All engines are loaded together and each batch-1 prompt runs on every config
back to back, so a machine whose load drifts slows them alike.

    python benchmarks/speculative.py [--dtype bfloat16] [--max-new 128] [--num-tokens 4]
                                     [--draft-layers 8] [--prompts 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from common import print_table
from constrained_throughput import LONG_KEYS

import radixflow as rf
from radixflow.runtime.model_loader import resolve_model_dir
from radixflow.runtime.speculative.layer_skip import write_layer_skip_draft

CODE = """def load_users(path):
    users = []
    with open(path) as handle:
        for line in handle:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users
"""
ARTICLE = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
    "Council member Alice Moreno said the lanes reduced accidents by a third in the first year. "
    "Bob Chen, who owns a bakery on Main Street, said deliveries now take longer. "
    "The council voted five to two to keep the lanes and to add two loading zones for shops. "
    "The new loading zones will open in March, and the council will review the lanes again in "
    "December."
)
TASKS = [
    "Rewrite this Python function, renaming the variable `users` to `records`. Output only the "
    "code.\n\n" + CODE,
    "Copy every sentence of this article that mentions the council, word for word.\n\n" + ARTICLE,
    "Summarize this article in three sentences, quoting it where you can.\n\n" + ARTICLE,
    "Add a docstring to this function and otherwise output it unchanged.\n\n" + CODE,
]


def chat(engine: rf.Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def run(engines: dict[str, rf.Engine], prompts: list[str], params: dict, one_by_one: bool) -> dict:
    """{config: result} for one workload. At batch 1 each prompt runs on every engine back to
    back, so a burst of load on the machine lands on all configs, not on one."""
    groups = [[p] for p in prompts] if one_by_one else [prompts]
    seconds = dict.fromkeys(engines, 0.0)
    outs: dict[str, list[dict]] = {name: [] for name in engines}
    for group in groups:
        for name, engine in engines.items():
            engine.flush_cache()
            start = time.perf_counter()
            outs[name].extend(engine.generate(group, params))
            seconds[name] += time.perf_counter() - start
    results = {}
    for name, done in outs.items():
        tokens = sum(o["meta_info"]["completion_tokens"] for o in done)
        accept = [o["meta_info"].get("spec_accept_length", 1.0) for o in done]
        results[name] = {
            "tok_s": tokens / seconds[name],
            "accept": sum(accept) / len(accept),
            "ids": [o["output_ids"] for o in done],
        }
    return results


# (config, workload) pairs not run: batch 1 is the plain ngram row's; at batch 16 (above the
# default speculative_max_batch of 8) the draft would not run.
SKIPPED = {
    ("ngram, max_batch 16", "copy, batch 1"),
    ("ngram, max_batch 16", "JSON long keys, batch 1"),
    ("draft", "copy, batch 16"),
}


def measure(args: argparse.Namespace, draft_path: str) -> dict[str, dict[str, dict]]:
    """{config: {workload: run result}}, all engines loaded at once."""
    common = {"dtype": args.dtype, "max_total_tokens": 8192}
    spec = {"speculative_num_tokens": args.num_tokens}
    configs = {
        "off": {"speculative_algorithm": "none"},
        "ngram": {"speculative_algorithm": "ngram", **spec},
        "ngram, max_batch 16": {
            "speculative_algorithm": "ngram",
            "speculative_max_batch": 16,
            **spec,
        },
        "draft": {
            "speculative_algorithm": "draft",
            "speculative_draft_model": draft_path,
            **spec,
        },
    }
    engines: dict[str, rf.Engine] = {}
    try:
        for name, options in configs.items():
            engines[name] = rf.Engine(**common, **options)
        off = engines["off"]
        tasks = TASKS[: args.prompts]
        greedy = {"max_new_tokens": args.max_new, "temperature": 0}
        json_params = {
            "max_new_tokens": 256,
            "temperature": 0,
            "json_schema": json.dumps(LONG_KEYS),
        }
        json_prompts = [
            chat(off, f"Invent customer number {i} and describe them as JSON.")
            for i in range(len(tasks))
        ]
        workloads = {
            "copy, batch 1": ([chat(off, t) for t in tasks], greedy, True),
            "JSON long keys, batch 1": (json_prompts, json_params, True),
            "copy, batch 16": (
                [chat(off, f"{t}\n(Request {i}.)") for i in range(4) for t in TASKS],
                greedy,
                False,
            ),
        }
        for engine in engines.values():
            engine.generate(chat(off, TASKS[0]), {"max_new_tokens": 8})  # warm-up
        results: dict[str, dict[str, dict]] = {name: {} for name in configs}
        for workload, (prompts, params, one_by_one) in workloads.items():
            runs = {n: e for n, e in engines.items() if (n, workload) not in SKIPPED}
            for name, result in run(runs, prompts, params, one_by_one).items():
                results[name][workload] = result
        return results
    finally:
        for engine in engines.values():
            engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--num-tokens", type=int, default=4, help="speculative_num_tokens")
    ap.add_argument("--draft-layers", type=int, default=8, help="decoder layers of the draft")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per batch-1 workload, 1-4")
    args = ap.parse_args()
    if not 1 <= args.prompts <= len(TASKS):
        raise ValueError(f"--prompts must be in [1, {len(TASKS)}], got {args.prompts}")
    with tempfile.TemporaryDirectory() as tmp:
        draft = write_layer_skip_draft(None, tmp, args.draft_layers)
        results = measure(args, str(draft))
    total = json.loads((resolve_model_dir(None) / "config.json").read_text())["num_hidden_layers"]
    names = {
        "ngram": "ngram",
        "ngram, max_batch 16": "ngram, max_batch 16",
        "draft": f"draft: layer-skip, first {args.draft_layers}/{total} layers",
    }
    rows = []
    for workload, base in results["off"].items():
        for name, label in names.items():
            res = results[name].get(workload)
            if res is None:
                continue
            rows.append(
                [
                    workload,
                    label,
                    f"{base['tok_s']:.1f}",
                    f"{res['tok_s']:.1f}",
                    f"{res['tok_s'] / base['tok_s']:.2f}x",
                    f"{res['accept']:.2f}",
                    "yes" if res["ids"] == base["ids"] else "NO",
                ]
            )
    print_table(
        ["workload", "speculation", "off tok/s", "on tok/s", "speed-up", "accept len", "same ids"],
        rows,
    )


if __name__ == "__main__":
    main()
