"""Quickstart: load the default model (SmolLM2-135M-Instruct) and answer a few questions."""

import radixflow as rf


def main() -> None:
    engine = rf.Engine()
    questions = [
        "What is the capital of France?",
        "Name three primary colors.",
        "What is 12 plus 30?",
    ]
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    outputs = engine.generate(prompts, {"max_new_tokens": 48, "temperature": 0})
    for question, out in zip(questions, outputs, strict=True):
        meta = out["meta_info"]
        print(f"Q: {question}\nA: {out['text'].strip()}")
        print(f"   ({meta['completion_tokens']} tokens, finish: {meta['finish_reason']['type']})\n")
    engine.shutdown()


if __name__ == "__main__":
    main()
