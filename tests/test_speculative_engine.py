"""N-gram speculative decoding through the engine on a tiny random model (float32).

Greedy output must equal plain decoding token for token; sampled output must follow the
target distribution; no KV page may leak after rejected drafts.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.speculative import NgramIndex

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "count": {"type": "integer"}},
    "required": ["name", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("spec"), "llama", seed=1)


def _engine(path, **options) -> rf.Engine:
    options = {"dtype": "float32", "max_total_tokens": 4096, **options}
    return rf.Engine(str(path), **options)


def _prompts(n: int) -> list[list[int]]:
    """Prompts that repeat themselves, so n-gram lookup has something to propose."""
    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(2, 300, (length,), generator=g).tolist() * 3 for length in range(3, 3 + n)
    ]


def _params(n: int) -> list[dict]:
    """Greedy with a mix of stop rules: EOS, a stop id, a stop string, a length limit."""
    kinds = [
        {"max_new_tokens": 48, "ignore_eos": True},
        {"max_new_tokens": 40},
        {"max_new_tokens": 44, "stop_token_ids": [7, 51, 120]},
        {"max_new_tokens": 36, "stop": ["e", "th"]},
    ]
    return [{"temperature": 0, **kinds[i % len(kinds)]} for i in range(n)]


def _generate(path, prompts, params, **options) -> tuple[list[dict], dict]:
    engine = _engine(path, **options)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert_kv_released(engine)
        return outs, dict(engine.stats)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("batch", "options"),
    [
        (1, {}),
        (8, {}),
        (1, {"disable_radix_cache": True}),
        (8, {"disable_radix_cache": True}),
        (8, {"page_size": 4, "chunked_prefill_size": 16}),
        (8, {"max_total_tokens": 260}),  # tight pool: drafts dropped, requests retracted
    ],
)
def test_greedy_output_equals_plain_decoding(model_dir, batch, options):
    prompts, params = _prompts(batch), _params(batch)
    plain, _ = _generate(model_dir, prompts, params, **options)
    spec, stats = _generate(model_dir, prompts, params, speculative_algorithm="ngram", **options)
    for a, b in zip(plain, spec, strict=True):
        assert b["output_ids"] == a["output_ids"]
        assert b["text"] == a["text"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        assert b["meta_info"]["spec_accept_length"] >= 1.0
    assert stats["spec_accepted_tokens"] > 0  # drafts were accepted ...
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"]  # ... and rejected


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_json_schema_output_equals_plain_decoding(model_dir, batch):
    text = '{"name": "radixflow", "fast": true, "count": 42} '
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok.encode(text * (2 + i % 3))[i:] for i in range(batch)]
    params = {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    plain, _ = _generate(model_dir, prompts, params)
    spec, stats = _generate(model_dir, prompts, params, speculative_algorithm="ngram")
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["spec_draft_tokens"] > 0
    for o in spec:
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            value = json.loads(o["text"])
            assert set(value) == {"name", "count"}


def test_requests_that_cannot_speculate_decode_plainly(model_dir):
    prompts = _prompts(4)
    params = [
        {"max_new_tokens": 20, "temperature": 0, "frequency_penalty": 0.5},
        {"max_new_tokens": 20, "temperature": 0, "logit_bias": {"5": 3.0}},
        {"max_new_tokens": 20, "temperature": 0, "min_new_tokens": 20},
        {"max_new_tokens": 20, "temperature": 0, "repetition_penalty": 1.3},
    ]
    plain, _ = _generate(model_dir, prompts, params)
    spec, stats = _generate(model_dir, prompts, params, speculative_algorithm="ngram")
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["spec_verify_steps"] == 0


def test_large_batches_do_not_speculate(model_dir):
    prompts = _prompts(6)
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    _, stats = _generate(
        model_dir, prompts, params, speculative_algorithm="ngram", speculative_max_batch=5
    )
    assert stats["spec_verify_steps"] == 0
    _, stats = _generate(
        model_dir, prompts, params, speculative_algorithm="ngram", speculative_max_batch=6
    )
    assert stats["spec_verify_steps"] > 0


def test_speculation_options_are_checked(model_dir):
    with pytest.raises(ValueError, match="speculative_num_tokens"):
        _engine(model_dir, speculative_algorithm="ngram", speculative_num_tokens=0)
    with pytest.raises(ValueError, match="speculative_algorithm"):
        _engine(model_dir, speculative_algorithm="medusa")


def _exact_tree(path, prompt: list[int], steps: int, top_k: int) -> dict[tuple, list[float]]:
    """Every continuation's probability under top-k sampling at temperature 1 (transformers).

    Maps each continuation of length <= steps to [probability, next tokens most likely first].
    """
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tree: dict[tuple, list] = {(): [1.0, []]}
    level = [()]
    for _ in range(steps):
        nxt = []
        for seq in level:
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + list(seq)])).logits[0, -1]
            vals, ids = logits.topk(top_k)
            tree[seq][1] = ids.tolist()
            for p, t in zip(torch.softmax(vals, -1).tolist(), ids.tolist(), strict=True):
                tree[seq + (t,)] = [tree[seq][0] * p, []]
                nxt.append(seq + (t,))
        level = nxt
    return tree


def assert_samples_follow_tree(outs: list[dict], tree: dict, steps: int, n: int) -> None:
    """Chi-square test: the n sampled outputs are drawn from the exact distribution `tree`."""
    counts: dict[tuple, int] = {}
    for o in outs:
        key = tuple(o["output_ids"])
        assert key in tree and len(key) == steps, f"{key} is outside the top-2 tree"
        counts[key] = counts.get(key, 0) + 1
    leaves = [seq for seq in tree if len(seq) == steps]
    observed = [counts.get(c, 0) for c in leaves]
    expected = [tree[c][0] * n for c in leaves]
    assert min(expected) > 1  # the chi-square approximation needs populated cells
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    df = len(observed) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))
    assert p_value > 1e-3, (stat, df, observed, expected)


def test_sampling_with_speculation_follows_the_target_distribution(model_dir, monkeypatch):
    """Chi-square of 4-token continuations (top_k=2: 16 outcomes) against the exact law.

    The proposer is replaced by one that knows the tree: its first draft is the likeliest next
    token, later ones the second likeliest, so verification accepts and rejects often.
    """
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(2, 300, (12,), generator=g).tolist()
    steps, n = 4, 1200
    tree = _exact_tree(model_dir, prompt, steps=steps, top_k=2)

    def propose(index: NgramIndex, k: int) -> list[int]:
        seq = tuple(index.tokens[len(prompt) :])
        drafts: list[int] = []
        while len(drafts) < k and tree.get(seq, [0, []])[1]:
            choices = tree[seq][1]
            drafts.append(choices[0] if not drafts else choices[1])
            seq = seq + (drafts[-1],)
        return drafts

    monkeypatch.setattr(NgramIndex, "propose", propose)
    params = {"max_new_tokens": steps, "temperature": 1.0, "top_k": 2, "ignore_eos": True}
    engine = _engine(
        model_dir,
        speculative_algorithm="ngram",
        speculative_max_batch=256,
        max_running_requests=256,
        random_seed=11,
    )
    try:
        outs = engine.generate(input_ids=[prompt] * n, sampling_params=params)
        stats = dict(engine.stats)
        engine.flush_cache()
        assert engine.kv_pages_free() == engine.kv_pages_total()
    finally:
        engine.shutdown()
    assert stats["spec_accepted_tokens"] > 300
    assert stats["spec_draft_tokens"] - stats["spec_accepted_tokens"] > 300
    assert_samples_follow_tree(outs, tree, steps, n)


def test_seeded_sampling_is_reproducible_with_speculation(model_dir):
    prompts = _prompts(3)
    params = {"max_new_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    runs = [
        _generate(model_dir, prompts, params, speculative_algorithm="ngram")[0] for _ in range(2)
    ]
    assert [o["output_ids"] for o in runs[0]] == [o["output_ids"] for o in runs[1]]


def test_stream_yields_every_accepted_token(model_dir):
    engine = _engine(model_dir, speculative_algorithm="ngram")
    try:
        prompt = _prompts(5)[4]
        params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
        full = engine.generate(input_ids=prompt, sampling_params=params)
        chunks = list(engine.generate(input_ids=prompt, sampling_params=params, stream=True))
        assert chunks[-1]["output_ids"] == full["output_ids"]
        assert len(chunks[-1]["output_ids"]) == 40
        lengths = [len(c["output_ids"]) for c in chunks]
        assert lengths == sorted(lengths)
    finally:
        engine.shutdown()


def test_acceptance_is_exported_as_metrics(model_dir):
    from prometheus_client.parser import text_string_to_metric_families

    from radixflow.runtime.server.metrics import ServerMetrics

    engine = _engine(model_dir, speculative_algorithm="ngram")
    try:
        metrics = ServerMetrics(engine)
        engine.generate(input_ids=_prompts(2), sampling_params=_params(2))
        stats = engine.stats
        values = {
            f.name: f.samples[0].value
            for f in text_string_to_metric_families(metrics.render().decode())
            if f.samples
        }
        expected = 1 + stats["spec_accepted_tokens"] / stats["spec_verify_steps"]
        assert values["radixflow_spec_accept_length"] == pytest.approx(expected)
        assert values["radixflow_spec_accept_length"] > 1
        rate = stats["spec_accepted_tokens"] / stats["spec_draft_tokens"]
        assert values["radixflow_spec_accept_rate"] == pytest.approx(rate)
        assert values["radixflow_pinned_tokens"] == 0
    finally:
        engine.shutdown()
