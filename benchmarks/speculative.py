"""N-gram speculative decoding on the default model: speculation off vs on, in one run.

Workloads whose output copies the input (extraction, summarization, code edit) at batch 1 and
batch 16, and JSON with long constant keys under a JSON Schema (jump-forward on in both runs).
Greedy, so both runs produce the same tokens; the table reports tokens/s, the speed ratio and
the mean tokens per verify step (acceptance length; 1.0 = no draft accepted).

    python benchmarks/speculative.py [--dtype bfloat16] [--max-new 128] [--num-tokens 4]
"""

from __future__ import annotations

import argparse
import json
import time

from common import print_table
from constrained_throughput import LONG_KEYS

import radixflow as rf

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


def run(engine: rf.Engine, prompts: list[str], params: dict, one_by_one: bool) -> dict:
    engine.flush_cache()
    start = time.perf_counter()
    if one_by_one:
        outs = [engine.generate(p, params) for p in prompts]
    else:
        outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    accept = [o["meta_info"].get("spec_accept_length", 1.0) for o in outs]
    return {
        "tok_s": tokens / seconds,
        "accept": sum(accept) / len(accept),
        "ids": [o["output_ids"] for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--num-tokens", type=int, default=4, help="speculative_num_tokens")
    args = ap.parse_args()
    common = {"dtype": args.dtype, "max_total_tokens": 32768}
    greedy = {"max_new_tokens": args.max_new, "temperature": 0}
    json_params = {
        "max_new_tokens": 256,
        "temperature": 0,
        "json_schema": json.dumps(LONG_KEYS),
    }
    configs = {
        "off": {"speculative_algorithm": "none"},
        "ngram": {"speculative_algorithm": "ngram", "speculative_num_tokens": args.num_tokens},
        "ngram, max_batch 16": {
            "speculative_algorithm": "ngram",
            "speculative_num_tokens": args.num_tokens,
            "speculative_max_batch": 16,
        },
    }
    results: dict[str, dict[str, dict]] = {}
    for name, options in configs.items():
        engine = rf.Engine(**common, **options)
        try:
            copy_prompts = [chat(engine, t) for t in TASKS]
            batch16 = [chat(engine, f"{t}\n(Request {i}.)") for i in range(4) for t in TASKS]
            json_prompts = [
                chat(engine, f"Invent customer number {i} and describe them as JSON.")
                for i in range(4)
            ]
            engine.generate(copy_prompts[0], {"max_new_tokens": 8})  # warm-up
            results[name] = {}
            if name != "ngram, max_batch 16":
                results[name]["copy, batch 1"] = run(engine, copy_prompts, greedy, True)
                results[name]["JSON long keys, batch 1"] = run(
                    engine, json_prompts, json_params, True
                )
            results[name]["copy, batch 16"] = run(engine, batch16, greedy, False)
        finally:
            engine.shutdown()
    rows = []
    for workload, base in results["off"].items():
        for name in ("ngram", "ngram, max_batch 16"):
            res = results[name].get(workload)
            if res is None:
                continue
            rows.append(
                [
                    workload,
                    name,
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
