"""Tree of thought: fork several lines of reasoning, expand each, then pick the best.

The conversation so far is computed once; the branches share it through the radix cache
(their `cached_tokens` show it) and run concurrently, batched together in the engine.
"""

import radixflow as rf

ANGLES = ["a cheap", "a quick", "a creative"]


@rf.function
def tree_of_thought(s, problem):
    s += rf.system("You are a practical advisor. Answer in one or two sentences.")
    forks = s.fork(len(ANGLES))
    for angle, branch in zip(ANGLES, forks, strict=True):
        branch += rf.user(f"Suggest {angle} way to solve this: {problem}")
        branch += rf.assistant(rf.gen("idea", max_tokens=40))
        branch += rf.user("What is the main risk of that idea?")
        branch += rf.assistant(rf.gen("risk", max_tokens=30))
    forks.join()
    ideas = "\n".join(f"{i + 1}. {idea.strip()}" for i, idea in enumerate(s["idea"]))
    s += rf.user(f"Problem: {problem}\nIdeas:\n{ideas}\nWhich idea is best? Reply with its number.")
    s += rf.assistant(rf.select("best", [str(i + 1) for i in range(len(ANGLES))]))


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    problem = "traffic jams near a small town's school every morning"
    state = tree_of_thought.run(problem, temperature=0)
    for i, branch in enumerate(state.stream_executor.children):
        meta = branch.meta_info["idea"]
        print(
            f"branch {i + 1}: {ANGLES[i]} idea ({meta['cached_tokens']}/{meta['prompt_tokens']} prompt tokens cached)"
        )
        print(f"  idea: {state['idea'][i].strip()}\n  risk: {state['risk'][i].strip()}")
    print(f"\nthe model picks idea {state['best']}")
    runtime.shutdown()


if __name__ == "__main__":
    main()
