"""N-gram speculation on the default model: same greedy tokens, fewer steps on copying tasks."""

from __future__ import annotations

import pytest

import radixflow as rf

pytestmark = pytest.mark.slow

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
    "The council voted five to two to keep the lanes and to add two loading zones for shops."
)


def test_copying_output_is_identical_and_accepts_drafts():
    prompts = [
        "Rewrite this Python function, renaming the variable `users` to `records`. Output only "
        f"the code.\n\n{CODE}",
        f"Copy every sentence of this article that mentions the council, word for word.\n\n{ARTICLE}",
    ]
    params = {"max_new_tokens": 64, "temperature": 0}
    outs, stats = {}, {}
    for algorithm in ("none", "ngram"):
        engine = rf.Engine(dtype="float32", max_total_tokens=4096, speculative_algorithm=algorithm)
        try:
            texts = [
                engine.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in prompts
            ]
            outs[algorithm] = [engine.generate(t, params) for t in texts]
            stats[algorithm] = dict(engine.stats)
            engine.flush_cache()
            assert engine.kv_pages_free() == engine.kv_pages_total()
        finally:
            engine.shutdown()
    for plain, spec in zip(outs["none"], outs["ngram"], strict=True):
        assert spec["output_ids"] == plain["output_ids"]
        assert spec["meta_info"]["spec_accept_length"] > 1.2
    assert stats["ngram"]["steps"] < 0.8 * stats["none"]["steps"]
