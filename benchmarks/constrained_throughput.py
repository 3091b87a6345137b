"""Constrained decoding cost and jump-forward gain on the default model, in one run.

Table 1: 32 JSON-Schema-constrained requests (jump-forward off, so only the mask cost shows)
against unconstrained generation of exactly the same output lengths (ignore_eos).
Table 2: a schema with long constant keys, jump-forward off vs on: forward passes, tokens/s
and requests/s.

Every timed run starts from an empty radix cache (so both sides prefill their prompts), and the
two sides of each table run in turn `--repeats` times; the figures are medians.

    python benchmarks/constrained_throughput.py [--batch 32] [--dtype bfloat16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import print_table

import radixflow as rf

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
    },
    "required": ["name", "age", "email", "role", "tags"],
    "additionalProperties": False,
}
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_legal_name": {"type": "string", "maxLength": 24},
        "customer_age_in_complete_years": {"type": "integer", "minimum": 0, "maximum": 120},
        "customer_is_premium_subscription_member": {"type": "boolean"},
        "customer_primary_home_city_name": {"type": "string", "maxLength": 16},
        "customer_preferred_contact_channel": {"enum": ["email", "phone", "post"]},
    },
    "required": [
        "customer_full_legal_name",
        "customer_age_in_complete_years",
        "customer_is_premium_subscription_member",
        "customer_primary_home_city_name",
        "customer_preferred_contact_channel",
    ],
    "additionalProperties": False,
}
NAMES = ["Ada", "Bob", "Chen", "Dana", "Eve", "Farid", "Gita", "Hugo"]


def prompts(engine: rf.Engine, n: int, what: str) -> list[str]:
    return [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a JSON {what} for {NAMES[i % 8]} (#{i})."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def timed(engine: rf.Engine, texts: list[str], params: list[dict]) -> tuple[float, list[dict], int]:
    """Seconds, outputs and forward passes of one batch, from an empty radix cache."""
    engine.flush_cache()
    steps = engine.stats["steps"]
    start = time.perf_counter()
    outs = engine.generate(texts, params)
    return time.perf_counter() - start, outs, engine.stats["steps"] - steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    mask_cost_table(args)
    print()
    jump_forward_table(args)


def mask_cost_table(args: argparse.Namespace) -> None:
    engine = rf.Engine(dtype=args.dtype, jump_forward=False)
    texts = prompts(engine, args.batch, "user record")
    schema = {
        "max_new_tokens": 96,
        "temperature": 0.7,
        "seed": 1,
        "json_schema": json.dumps(PERSON),
    }
    engine.generate(texts[:2], schema)  # compile the grammar and warm up once
    con_times, free_times = [], []
    for _ in range(args.repeats):
        seconds, outs, _ = timed(engine, texts, [schema] * len(texts))
        con_times.append(seconds)
        lengths = [o["meta_info"]["completion_tokens"] for o in outs]
        free = [
            {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.7, "seed": 1}
            for n in lengths
        ]
        free_times.append(timed(engine, texts, free)[0])
    engine.shutdown()
    valid = sum(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs)
    tokens = sum(lengths)
    t_con, t_free = statistics.median(con_times), statistics.median(free_times)
    print_table(
        ["generation", "requests", "output tokens", "tokens/s", "cost vs unconstrained"],
        [
            ["unconstrained", len(texts), tokens, f"{tokens / t_free:.0f}", ""],
            [
                f"JSON Schema ({valid} complete)",
                len(texts),
                tokens,
                f"{tokens / t_con:.0f}",
                f"{1 - t_free / t_con:+.1%}",
            ],
        ],
    )


def jump_forward_table(args: argparse.Namespace) -> None:
    params = {"max_new_tokens": 160, "temperature": 0, "json_schema": json.dumps(LONG_KEYS)}
    engines = {jump: rf.Engine(dtype=args.dtype, jump_forward=jump) for jump in (False, True)}
    texts = prompts(engines[False], args.batch, "customer record")
    for engine in engines.values():
        engine.generate(texts[:1], params)
    runs: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for jump, engine in engines.items():
            seconds, outs, steps = timed(engine, texts, [params] * len(texts))
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            runs[jump].append((seconds, steps, tokens))
    for engine in engines.values():
        engine.shutdown()
    rows = []
    seconds_of = {jump: statistics.median(r[0] for r in runs[jump]) for jump in runs}
    for jump in (False, True):
        seconds = seconds_of[jump]
        _, steps, tokens = runs[jump][0]  # greedy: the same passes and tokens every repeat
        rows.append(
            [
                "on" if jump else "off",
                steps,
                tokens,
                f"{tokens / seconds:.0f}",
                f"{len(texts) / seconds:.2f}",
            ]
        )
    (_, s_off, n_off), (_, s_on, n_on) = runs[False][0], runs[True][0]
    speedup = seconds_of[False] / seconds_of[True]
    rows.append(
        [
            "on vs off",
            f"{1 - s_on / s_off:.0%} fewer",
            "",
            f"{speedup * n_on / n_off:.2f}x",
            f"{speedup:.2f}x",
        ]
    )
    print_table(["jump-forward", "forward passes", "output tokens", "tokens/s", "requests/s"], rows)


if __name__ == "__main__":
    main()
