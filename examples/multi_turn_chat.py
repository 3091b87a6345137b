"""Multi-turn chat with the model's own chat template; the last answer is streamed."""

import radixflow as rf


@rf.function
def chat(s, turns):
    s += rf.system("You are a friendly, concise assistant.")
    for i, turn in enumerate(turns):
        s += rf.user(turn)
        s += rf.assistant(rf.gen(f"answer_{i}", max_tokens=48))


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    turns = [
        "Hi! Can you suggest a name for a pet goldfish?",
        "Why did you pick that name?",
        "Give me one more idea, in a single word.",
    ]
    state = chat.run(turns, temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content'].strip()}")

    print("\nstreaming a fresh conversation:")
    state = chat.run(turns[:1], temperature=0, stream=True)
    print("assistant: ", end="", flush=True)
    for chunk in state.text_iter("answer_0"):
        print(chunk, end="", flush=True)
    print()

    runtime.shutdown()


if __name__ == "__main__":
    main()
