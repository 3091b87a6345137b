"""The SGLang paper's program shapes on the default model, run three ways in one process.

    python benchmarks/programs.py [--quick] [--dtype float32|bfloat16|auto]

Workloads: MMLU-style 5-shot `select`, JSON extraction, tree of thought (2 plans, each carried
out twice, each result rated: nested forks), a ReAct agent loop, multi-turn chat (4 turns of
~250-token user messages with 8-token answers, as in SGLang's multi-turn benchmark). Executors: radixflow (Runtime), radixflow with the radix cache off, and a
plain executor over transformers that re-encodes the whole prompt for every call and runs one
program at a time (what guidance or LMQL do). The same @function programs run on all three; all
decoding is greedy. Prints programs/s, latency p50 and the prompt-token cache hit rate.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import passage, print_table  # noqa: E402

import radixflow as rf  # noqa: E402
from radixflow.frontend.backend import Backend, Prompt, RequestError  # noqa: E402
from radixflow.frontend.choices import call_method  # noqa: E402
from radixflow.frontend.ir import GenArgs  # noqa: E402
from radixflow.runtime.model_loader import transformers_dir  # noqa: E402

# -- workloads --------------------------------------------------------------------------------
SHOTS = [
    (
        "Which gas do plants absorb from the air?",
        ["Oxygen", "Carbon dioxide", "Helium", "Neon"],
        "B",
    ),
    ("What is 7 times 8?", ["54", "56", "64", "48"], "B"),
    ("Which organ pumps blood through the body?", ["Lungs", "Liver", "Heart", "Kidney"], "C"),
    ("Who wrote 'Romeo and Juliet'?", ["Shakespeare", "Dickens", "Austen", "Tolstoy"], "A"),
    ("What is the boiling point of water at sea level?", ["50 C", "80 C", "90 C", "100 C"], "D"),
]
QUESTIONS = [
    ("What is the largest planet in the solar system?", ["Mars", "Jupiter", "Venus", "Earth"]),
    ("How many continents are there?", ["Five", "Six", "Seven", "Eight"]),
    ("What is the chemical symbol for gold?", ["Ag", "Au", "Gd", "Go"]),
    ("Which ocean is the largest?", ["Atlantic", "Indian", "Arctic", "Pacific"]),
    ("What is the square root of 81?", ["7", "8", "9", "10"]),
    ("Which animal is known as the king of the jungle?", ["Lion", "Tiger", "Bear", "Wolf"]),
    ("What is the freezing point of water?", ["0 C", "10 C", "-10 C", "32 C"]),
    ("Which language has the most native speakers?", ["English", "Spanish", "Mandarin", "Hindi"]),
]


def _mmlu_block(question: str, options: list[str]) -> str:
    lines = [f"Question: {question}"]
    lines += [f"{letter}. {opt}" for letter, opt in zip("ABCD", options, strict=True)]
    return "\n".join(lines) + "\nAnswer:"


@rf.function
def mmlu(s, question, options):
    s += "The following are multiple choice questions about general knowledge.\n\n"
    for q, opts, answer in SHOTS:
        s += _mmlu_block(q, opts) + f" {answer}\n\n"
    s += _mmlu_block(question, options)
    s += rf.select("answer", [" A", " B", " C", " D"])


PEOPLE = [
    "Maria Lopez is a 34-year-old architect who lives in Madrid.",
    "At 27, Tom Becker moved to Berlin to work as a chef.",
    "Yuki Tanaka, aged 45, teaches mathematics in Osaka.",
    "The painter Ana Silva, 52, has her studio in Lisbon.",
    "Omar Haddad is 39 and runs a bakery in Amman.",
    "Lena Novak, a 23-year-old student, rents a flat in Prague.",
    "Grace Kim, 61, retired to a small house near Busan.",
    "Paul Martin, 30, is a nurse at a hospital in Lyon.",
]
SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, '
    '"city": {"type": "string"}}, "required": ["name", "age", "city"]}'
)


@rf.function
def json_extract(s, text):
    s += rf.system("You extract facts from text as JSON with the keys name, age and city.")
    s += rf.user(f"Text: {text}")
    s += rf.assistant(rf.gen("json", max_tokens=32, json_schema=SCHEMA))


@rf.function
def tree_of_thought(s, question):
    """The paper's deep tree: 2 plans, each carried out twice, each result rated (8 leaves)."""
    s += rf.system("You are a careful problem solver who thinks before answering.")
    s += rf.user(
        f"Question: {question}\nFirst propose a plan: which approach would you take, and why? "
        "Name the steps in a few words each, but do not carry them out yet."
    )
    plans = s.fork(2)
    plans += rf.assistant(rf.gen("plan", max_tokens=24))
    plans += rf.user("Good. Now carry out your plan step by step and state the outcome.")
    for plan in plans:
        runs = plan.fork(2)
        runs += rf.assistant(rf.gen("solution", max_tokens=24))
        runs += rf.user("Rate how well that solution answers the question, from 1 to 5.")
        runs += rf.assistant(rf.gen("score", max_tokens=4))
        runs.join()
    plans.join()


PROBLEMS = [
    "How can a town reduce traffic near its school?",
    "How can I learn to cook on a small budget?",
    "How should a team plan a two-day hackathon?",
    "How can an office cut its paper use?",
    "How do I keep houseplants alive while travelling?",
    "How can a library attract more teenagers?",
    "How should I prepare for a 10 km run?",
    "How can neighbours share tools fairly?",
]

REACT_PROMPT = """Answer the question with tools: lookup[country] gives facts about a country;
calculator[expression] does arithmetic.

Question: What is the population of Egypt times 2?
Thought: I need Egypt's population.
Action: lookup
Action Input: Egypt
Observation: Egypt: capital Cairo, population about 105 million.
Thought: Now I multiply 105 by 2.
Action: calculator
Action Input: 105 * 2
Observation: 210
Thought: I know the answer.
Action: finish
Action Input: about 210 million

"""


def _tool(action: str, argument: str) -> str:
    if action == "lookup":
        return f"{argument.strip()}: capital unknown, population about 50 million."
    return "42"


@rf.function
def react(s, question):
    s += REACT_PROMPT + "Question: " + question + "\n"
    for _ in range(3):
        s += "Thought:" + rf.gen("thought", max_tokens=16, stop="\n") + "\n"
        s += "Action: " + rf.select("action", ["lookup", "calculator", "finish"]) + "\n"
        s += "Action Input:" + rf.gen("input", max_tokens=8, stop="\n") + "\n"
        if s["action"] == "finish":
            break
        s += f"Observation: {_tool(s['action'], s['input'])}\n"


COUNTRIES = ["Japan", "Brazil", "Kenya", "Canada", "Norway", "Chile", "India", "Spain"]


def chat_turns(seed: int) -> list[str]:
    """The paper's multi-turn chat shape: 4 turns of long user messages, short answers."""
    rng = random.Random(seed)
    return [
        f"Here is part {t + 1} of my notes: {passage(rng, 200)}\nWhat is this part about?"
        for t in range(4)
    ]


@rf.function
def chat(s, turns):
    s += rf.system("You are a friendly, concise assistant.")
    for turn in turns:
        s += rf.user(turn)
        s += rf.assistant(rf.gen("answer", max_tokens=8))


WORKLOADS: dict[str, tuple[rf.SglFunction, list[dict[str, Any]]]] = {
    "mmlu 5-shot select": (mmlu, [{"question": q, "options": o} for q, o in QUESTIONS]),
    "json extraction": (json_extract, [{"text": t} for t in PEOPLE]),
    "tree of thought": (tree_of_thought, [{"question": q} for q in PROBLEMS]),
    "react agent": (react, [{"question": f"What is the population of {c}?"} for c in COUNTRIES]),
    "multi-turn chat": (chat, [{"turns": chat_turns(seed)} for seed in range(8)]),
}


# -- the transformers executor ----------------------------------------------------------------
class TransformersBackend(Backend):
    """Every call re-encodes its whole prompt with transformers; nothing is shared or batched."""

    def __init__(self, model_dir: Path, tokenizer: Any, chat_template: rf.ChatTemplate, dtype):
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model.eval()
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.prompt_tokens = 0

    def generate(self, prompt: Prompt, args: GenArgs) -> tuple[str, dict[str, Any]]:
        ids = self.tokenizer.encode(prompt.text)
        self.prompt_tokens += len(ids)
        stop = [args.stop] if isinstance(args.stop, str) else list(args.stop or [])
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                stop_strings=stop or None,
                tokenizer=self.tokenizer if stop else None,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        text = self.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
        for s in stop:
            text = text.split(s)[0]
        return text, {"prompt_tokens": len(ids), "cached_tokens": 0}

    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        text, meta = self.generate(prompt, args)
        yield text, meta

    def select(self, prompt, choices, temperature, method):
        scored = []
        prefix_len = len(self.tokenizer.encode(prompt.text))
        for choice in choices:
            ids = self.tokenizer.encode(prompt.text + choice)
            self.prompt_tokens += len(ids)
            with torch.no_grad():
                logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
            start = min(prefix_len, len(ids) - 1)
            scored.append(
                [(float(logp[i - 1, ids[i]]), ids[i], None) for i in range(start, len(ids))]
            )
        if method.requires_unconditional_logprobs:
            raise RequestError("the transformers executor scores conditional logprobs only")
        return call_method(method, choices, scored)

    def pin_prefix(self, text: str) -> None:
        """Nothing is cached: this executor re-encodes every prompt."""

    def flush_cache(self) -> None:
        """Nothing is cached."""

    def get_server_info(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": 0}

    def shutdown(self) -> None:
        """Nothing to release."""


# -- running ----------------------------------------------------------------------------------
def run_workload(
    program: rf.SglFunction, batch: list[dict[str, Any]], backend: Backend, concurrency: int
) -> dict[str, Any]:
    before = dict(backend.get_server_info())
    latencies: list[float] = []
    errors: list[str] = []

    def one(kwargs: dict[str, Any]) -> None:
        start = time.perf_counter()
        try:
            program.run(**kwargs, temperature=0, backend=backend)
        except rf.ProgramError as exc:
            errors.append(str(exc).splitlines()[0])
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    prefix = program.trace(backend=backend).prefix  # what run_batch does: pin it once
    pin = backend.pin_prefix(prefix) if prefix else None
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, batch))
    backend.unpin_prefix(pin)
    wall = time.perf_counter() - start
    after = backend.get_server_info()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {
        "programs/s": len(batch) / wall,
        "p50": statistics.median(latencies),
        "hit": cached / max(1, prompt),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 programs per workload")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    opts = parser.parse_args()
    n = 4 if opts.quick else 8
    on = rf.Runtime(dtype=opts.dtype)
    off = rf.Runtime(dtype=opts.dtype, disable_radix_cache=True)
    hf_dtype = torch.float32 if opts.dtype == "float32" else on.engine.runner.dtype
    hf = TransformersBackend(
        transformers_dir(on.engine.model_dir), on.tokenizer, on.chat_template, hf_dtype
    )
    executors = [("radixflow", on, n), ("radixflow, cache off", off, n), ("transformers", hf, 1)]
    rows = []
    for name, (program, batch) in WORKLOADS.items():
        if opts.only and name not in opts.only:
            continue
        results = {}
        for label, backend, concurrency in executors:
            r = run_workload(program, batch[:n], backend, concurrency)
            results[label] = r
            for err in r["errors"][:1]:
                print(
                    f"  {name} on {label}: {len(r['errors'])} failed, e.g. {err}", file=sys.stderr
                )
        base = results["transformers"]["programs/s"]
        for label, r in results.items():
            rows.append(
                [
                    name,
                    label,
                    f"{r['programs/s']:.2f}",
                    f"{r['p50']:.2f}",
                    f"{100 * r['hit']:.0f}%",
                    f"{r['programs/s'] / base:.1f}x",
                    len(r["errors"]),
                ]
            )
        print(f"done: {name}", file=sys.stderr)
    print(f"\n{n} programs per workload, dtype {opts.dtype}, {torch.get_num_threads()} threads\n")
    print_table(
        [
            "workload",
            "executor",
            "programs/s",
            "p50 latency s",
            "cache hit",
            "vs transformers",
            "errors",
        ],
        rows,
    )
    on.shutdown()
    off.shutdown()


if __name__ == "__main__":
    main()
