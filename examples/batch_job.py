"""A batch job with a progress bar: classify the sentiment of reviews with `select`."""

import time

import radixflow as rf

REVIEWS = [
    ("The food was delicious and the staff were lovely.", "positive"),
    ("Terrible service, cold food, never coming back.", "negative"),
    ("I loved every minute of this film.", "positive"),
    ("The battery died after two days. Very disappointed.", "negative"),
    ("Great value for the price, works perfectly.", "positive"),
    ("The hotel room was dirty and noisy.", "negative"),
    ("Absolutely wonderful experience, highly recommended!", "positive"),
    ("It broke the first time I used it. Waste of money.", "negative"),
    ("Fast delivery and the quality is excellent.", "positive"),
    ("Boring plot and awful acting.", "negative"),
    ("My kids adore this game.", "positive"),
    ("The app crashes constantly and support never answers.", "negative"),
]


@rf.function
def sentiment(s, review):
    s += rf.system("You label the sentiment of product reviews as positive or negative.")
    for example, label in [
        ("Works great, I love it!", "positive"),
        ("Awful. It broke.", "negative"),
    ]:
        s += rf.user(f"Review: {example}") + rf.assistant(label)
    s += rf.user(f"Review: {review}")
    s += rf.assistant(rf.select("label", ["positive", "negative"]))


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    start = time.perf_counter()
    states = sentiment.run_batch([{"review": r} for r, _ in REVIEWS], progress_bar=True)
    seconds = time.perf_counter() - start
    correct = 0
    for (review, label), state in zip(REVIEWS, states, strict=True):
        correct += state["label"] == label
        mark = "ok " if state["label"] == label else "BAD"
        print(f"[{mark}] {state['label']:<8} {review}")
    print(f"\naccuracy {correct}/{len(REVIEWS)}, {len(REVIEWS) / seconds:.1f} programs/s")

    runtime.shutdown()


if __name__ == "__main__":
    main()
