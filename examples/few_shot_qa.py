"""Few-shot question answering: a fixed prefix of worked examples, then each question.

The examples form a constant prefix that every question shares: `run_batch` computes it once
(found by tracing the program) and each question reuses it from the radix cache.
"""

import radixflow as rf

EXAMPLES = [
    ("What is the capital of Italy?", "Rome"),
    ("How many legs does a spider have?", "Eight"),
    ("What color is a ripe banana?", "Yellow"),
    ("Which planet is closest to the Sun?", "Mercury"),
]


@rf.function
def few_shot_qa(s, question):
    s += "Answer each question with a short phrase.\n\n"
    for q, a in EXAMPLES:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += "Question: " + question + "\nAnswer:"
    s += rf.gen("answer", max_tokens=12, stop="\n")


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    questions = [
        "What is the capital of France?",
        "How many days are in a week?",
        "What is the largest ocean on Earth?",
        "What do bees make?",
    ]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], temperature=0)
    for q, state in zip(questions, states, strict=True):
        meta = state.get_meta_info("answer")
        print(f"Q: {q}\nA: {state['answer'].strip()}")
        print(f"   ({meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} from cache)\n")

    runtime.shutdown()


if __name__ == "__main__":
    main()
