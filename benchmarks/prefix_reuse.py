"""Prefix reuse: the radix cache on vs off vs transformers `generate`, in one run.

  (a) few-shot: 64 questions after a shared ~1,500-token 5-shot prefix, 16 output tokens each
  (b) multi-turn chat: 16 conversations x 4 turns, 24 output tokens per turn
  (c) tree search: one prompt forked into 8 branches, each forked again into 4 (24 tokens each)

Requests of one "wave" are submitted together; a wave's prompts may depend on earlier waves'
outputs (chat history, tree branches). The theoretical hit rate counts, for each prompt, the
longest prefix it shares with anything an earlier request computed (earlier waves' prompts and
outputs, earlier prompts of the same wave), over all prompt tokens.

    python benchmarks/prefix_reuse.py [--dtype bfloat16] [--quick]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch
import transformers
from common import passage, print_table

import radixflow as rf
from radixflow.runtime.model_loader import transformers_dir

Wave = list[tuple[list[int], int]]  # (prompt ids, output tokens)
Workload = Callable[[Callable[[Wave], list[list[int]]]], list[Wave]]

TOPICS = ["rivers", "volcanoes", "bridges", "forests", "satellites", "deserts", "glaciers"]


def few_shot(tokenizer, n_questions: int) -> Callable:
    rng = random.Random(0)
    shots = "".join(
        f"Passage: {passage(rng, 230)}\nQuestion: What is this passage about?\n"
        f"Answer: It is about {rng.choice(TOPICS)}.\n\n"
        for _ in range(5)
    )
    prompts = [
        tokenizer.encode(
            shots + f"Passage: {passage(rng, 25)}\nQuestion: What is this about?\nAnswer:"
        )
        for _ in range(n_questions)
    ]

    def run(generate):
        generate([(p, 16) for p in prompts])

    return run


def multi_turn(tokenizer, n_conversations: int, turns: int = 4) -> Callable:
    rng = random.Random(1)
    questions = [
        [f"Tell me one fact about {rng.choice(TOPICS)} number {c}-{t}." for t in range(turns)]
        for c in range(n_conversations)
    ]

    def run(generate):
        histories = [
            [{"role": "system", "content": "You are a concise assistant."}] for _ in questions
        ]
        for t in range(turns):
            prompts = []
            for hist, qs in zip(histories, questions, strict=True):
                hist.append({"role": "user", "content": qs[t]})
                text = tokenizer.apply_chat_template(
                    hist, tokenize=False, add_generation_prompt=True
                )
                prompts.append(tokenizer.encode(text))
            outputs = generate([(p, 24) for p in prompts])
            for hist, out in zip(histories, outputs, strict=True):
                hist.append(
                    {
                        "role": "assistant",
                        "content": tokenizer.decode(out, skip_special_tokens=True),
                    }
                )

    return run


def tree_search(tokenizer, branches: int = 8, leaves: int = 4) -> Callable:
    rng = random.Random(2)
    root = tokenizer.encode(
        "Problem: plan a trip that visits three cities by train. " + passage(rng, 150) + "\nStep 1:"
    )

    def run(generate):
        firsts = generate([(root, 24)] * branches)
        second = [
            (root + f + tokenizer.encode("\nStep 2:"), 24) for f in firsts for _ in range(leaves)
        ]
        generate(second)

    return run


class Recorder:
    """Wraps a generate function: counts prompt tokens and the ideal reusable prefix."""

    def __init__(self, generate: Callable[[Wave], list[list[int]]]) -> None:
        self.generate = generate
        self.seen: list[list[int]] = []
        self.prompt_tokens = 0
        self.ideal_cached = 0

    def __call__(self, wave: Wave) -> list[list[int]]:
        wave_seen = list(self.seen)
        for prompt, _ in wave:
            best = max((_lcp(prompt, s) for s in wave_seen), default=0)
            self.ideal_cached += min(best, len(prompt) - 1)
            self.prompt_tokens += len(prompt)
            wave_seen.append(prompt)
        outputs = self.generate(wave)
        self.seen.extend(p + o for (p, _), o in zip(wave, outputs, strict=True))
        return outputs


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def engine_generate(engine: rf.Engine) -> Callable[[Wave], list[list[int]]]:
    def generate(wave: Wave) -> list[list[int]]:
        outs = engine.generate(
            input_ids=[p for p, _ in wave],
            sampling_params=[
                {"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for _, n in wave
            ],
        )
        return [o["output_ids"] for o in outs]

    return generate


def hf_generate(model, batch_size: int = 16, pad_id: int = 2) -> Callable[[Wave], list[list[int]]]:
    def generate(wave: Wave) -> list[list[int]]:
        results = []
        for i in range(0, len(wave), batch_size):
            chunk = wave[i : i + batch_size]
            width = max(len(p) for p, _ in chunk)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
            new = max(n for _, n in chunk)
            with torch.inference_mode():
                out = model.generate(
                    ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=pad_id,
                )  # fmt: skip
            results.extend(
                row[width : width + n].tolist() for row, (_, n) in zip(out, chunk, strict=True)
            )
        return results

    return generate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    args = parser.parse_args()
    on = rf.Engine(dtype=args.dtype)
    off = rf.Engine(dtype=args.dtype, disable_radix_cache=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        transformers_dir(on.model_dir), dtype=getattr(torch, args.dtype)
    ).eval()
    tok = on.tokenizer
    workloads = {
        "(a) few-shot": few_shot(tok, 16 if args.quick else 64),
        "(b) multi-turn": multi_turn(tok, 4 if args.quick else 16),
        "(c) tree search": tree_search(tok, 4 if args.quick else 8, 2 if args.quick else 4),
    }
    rows = []
    for name, run in workloads.items():
        times = {}
        for label, target in (("radix on", on), ("radix off", off), ("transformers", hf)):
            generate = (
                engine_generate(target) if isinstance(target, rf.Engine) else hf_generate(target)
            )
            recorder = Recorder(generate)
            before = dict(target.stats) if isinstance(target, rf.Engine) else None
            start = time.perf_counter()
            run(recorder)
            times[label] = time.perf_counter() - start
            if label == "radix on":
                cached = target.stats["cached_tokens"] - before["cached_tokens"]
                hit = cached / recorder.prompt_tokens
                ideal = recorder.ideal_cached / recorder.prompt_tokens
                requests = target.stats["requests"] - before["requests"]
                target.flush_cache()
        rows.append(
            [
                name,
                requests,
                f"{requests / times['radix on']:.2f}",
                f"{requests / times['radix off']:.2f}",
                f"{requests / times['transformers']:.2f}",
                f"{times['radix off'] / times['radix on']:.1f}x",
                f"{times['transformers'] / times['radix on']:.1f}x",
                f"{hit:.1%}",
                f"{ideal:.1%}",
                f"{hit / ideal:.0%}",
            ]
        )
    on.shutdown()
    off.shutdown()
    print_table(
        [
            "workload",
            "requests",
            "req/s radix on",
            "req/s radix off",
            "req/s transformers",
            "vs off",
            "vs transformers",
            "hit rate",
            "ideal hit rate",
            "of ideal",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
