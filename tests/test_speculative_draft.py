"""Draft-model speculative decoding through the engine on tiny random models (float32).

Greedy output must equal plain decoding token for token, whatever the draft proposes; sampled
output must follow the target distribution; neither KV pool may leak a page.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from kv_checks import assert_kv_released
from test_speculative_engine import (
    SCHEMA,
    _exact_tree,
    _params,
    _prompts,
    assert_samples_follow_tree,
)
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.speculative.layer_skip import write_layer_skip_draft


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("target"), "llama", seed=1)


@pytest.fixture(scope="module")
def skip_draft(model_dir, tmp_path_factory):
    """The target's first layer, final norm and lm_head: proposals that are often right."""
    return write_layer_skip_draft(model_dir, tmp_path_factory.mktemp("skip"), num_layers=1)


def _engine(path, draft=None, **options) -> rf.Engine:
    options = {"dtype": "float32", "max_total_tokens": 4096, **options}
    if draft is not None:
        options.update(speculative_algorithm="draft", speculative_draft_model=str(draft))
    return rf.Engine(str(path), **options)


def assert_draft_kv_released(engine: rf.Engine) -> None:
    """Every page and row of the draft's pool is free again."""
    pool = engine.speculator.proposer.pool
    assert pool.available() == pool.capacity_pages
    assert pool.rows_available() == pool.req_to_token.shape[0]


def _generate(path, prompts, params, draft=None, **options) -> tuple[list[dict], dict]:
    engine = _engine(path, draft, **options)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        if draft is not None:
            assert_draft_kv_released(engine)
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
        (8, {"max_total_tokens": 260}),  # tight pools: drafts dropped, requests retracted
    ],
)
def test_greedy_output_equals_plain_decoding(model_dir, skip_draft, batch, options):
    prompts, params = _prompts(batch), _params(batch)
    plain, plain_stats = _generate(model_dir, prompts, params, **options)
    same, same_stats = _generate(model_dir, prompts, params, draft=model_dir, **options)
    skip, skip_stats = _generate(model_dir, prompts, params, draft=skip_draft, **options)
    for a, b, c in zip(plain, same, skip, strict=True):
        assert b["output_ids"] == a["output_ids"]
        assert c["output_ids"] == a["output_ids"]
        assert c["text"] == a["text"]
        assert c["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        assert c["meta_info"]["spec_accept_length"] >= 1.0
    # The target as its own draft is right every time ...
    assert same_stats["spec_draft_tokens"] > 0
    assert same_stats["spec_accepted_tokens"] == same_stats["spec_draft_tokens"]
    assert same_stats["steps"] < plain_stats["steps"]
    # ... a one-layer draft sometimes.
    assert 0 < skip_stats["spec_accepted_tokens"] < skip_stats["spec_draft_tokens"]


def test_a_full_draft_pool_only_costs_proposals(model_dir, skip_draft):
    """Eight copies of one prompt share its KV in the target's tree but not in the draft's
    pool (as large, in tokens): drafting runs out of pages, output stays the same."""
    prompts, params = [_prompts(8)[7] * 3] * 8, _params(8)
    plain, _ = _generate(model_dir, prompts, params, max_total_tokens=260)
    spec, stats = _generate(model_dir, prompts, params, skip_draft, max_total_tokens=260)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert 0 < stats["spec_verify_steps"] < stats["completion_tokens"] - 8


def test_a_draft_that_is_always_wrong_pauses_and_changes_nothing(model_dir, tmp_path):
    """An unrelated random draft: output still identical; its requests mostly decode plainly."""
    stranger = make_tiny_model_dir(tmp_path / "stranger", "llama", seed=7)
    prompts, params = _prompts(4), _params(4)
    plain, _ = _generate(model_dir, prompts, params)
    spec, stats = _generate(model_dir, prompts, params, draft=stranger)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["spec_accepted_tokens"] < 0.1 * stats["spec_draft_tokens"]
    assert 0 < stats["spec_verify_steps"] < 0.35 * stats["completion_tokens"]


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_json_schema_output_equals_plain_decoding(model_dir, skip_draft, batch):
    text = '{"name": "radixflow", "fast": true, "count": 42} '
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok.encode(text * (2 + i % 3))[i:] for i in range(batch)]
    params = {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    plain, _ = _generate(model_dir, prompts, params)
    for draft in (model_dir, skip_draft):
        spec, stats = _generate(model_dir, prompts, params, draft=draft)
        assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
        assert stats["spec_draft_tokens"] > 0
    for o in plain:
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            assert set(json.loads(o["text"])) == {"name", "count"}


def test_sampling_with_a_draft_follows_the_target_distribution(model_dir, skip_draft):
    """Chi-square of 4-token continuations (top_k=2: 16 outcomes) against the exact law."""
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(2, 300, (12,), generator=g).tolist()
    steps, n = 4, 1200
    tree = _exact_tree(model_dir, prompt, steps=steps, top_k=2)
    params = {"max_new_tokens": steps, "temperature": 1.0, "top_k": 2, "ignore_eos": True}
    engine = _engine(
        model_dir,
        skip_draft,
        speculative_max_batch=256,
        max_running_requests=256,
        random_seed=11,
    )
    try:
        outs = engine.generate(input_ids=[prompt] * n, sampling_params=params)
        stats = dict(engine.stats)
        assert_draft_kv_released(engine)
        assert_kv_released(engine)
    finally:
        engine.shutdown()
    assert stats["spec_accepted_tokens"] > 300
    assert stats["spec_draft_tokens"] - stats["spec_accepted_tokens"] > 300
    assert_samples_follow_tree(outs, tree, steps, n)


def test_aborted_and_finished_requests_free_the_draft_kv(model_dir, skip_draft):
    engine = _engine(model_dir, skip_draft)
    try:
        prompts = _prompts(3)
        params = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
        stream = engine.generate(input_ids=prompts[2], sampling_params=params, stream=True, rid="x")
        for _ in range(3):
            next(stream)
        pool = engine.speculator.proposer.pool
        assert pool.available() < pool.capacity_pages  # the draft holds KV for the request
        engine.abort("x")
        last = list(stream)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 20})
        assert_draft_kv_released(engine)
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_draft_options_are_checked(model_dir, skip_draft, tmp_path):
    with pytest.raises(ValueError, match="needs speculative_draft_model"):
        _engine(model_dir, speculative_algorithm="draft")
    with pytest.raises(ValueError, match="speculative_draft_model is set"):
        _engine(model_dir, speculative_draft_model=str(skip_draft))
    with pytest.raises(ValueError, match="does not exist"):
        _engine(model_dir, tmp_path / "missing")
    with pytest.raises(ValueError, match="num_layers must be in"):
        write_layer_skip_draft(model_dir, tmp_path / "all", num_layers=2)  # the whole model
    other = write_layer_skip_draft(model_dir, tmp_path / "vocab", num_layers=1)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 400}))
    with pytest.raises(ValueError, match="does not share the target's vocabulary"):
        _engine(model_dir, other)


def test_draft_runs_on_the_triton_backend(model_dir):
    """The draft goes through the same attention backend as the target (Triton, interpreted)."""
    prompts = _prompts(2)
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain, _ = _generate(model_dir, prompts, params)
    spec, stats = _generate(model_dir, prompts, params, model_dir, attention_backend="triton")
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"] > 0
