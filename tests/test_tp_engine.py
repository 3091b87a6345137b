"""Tensor parallelism through rf.Engine: 2 ranks over gloo on the CPU give the tokens one rank
gives (float32, tiny seeded Llama / Qwen2 (bias) / Qwen3 (q/k norm) models), with prefix
caching, chunked prefill and a JSON Schema constraint, and leave every KV page free.

One tp=2 engine per architecture (each start spawns a worker process); the process holds one
tensor-parallel group at a time, so the engines of this module never overlap.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf

COMMON = {"dtype": "float32", "max_total_tokens": 2048, "num_threads": 1}
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT_LENGTHS = [3, 41, 9, 27]  # 41 and 27 take several chunks of 16
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "fast": {"type": "boolean"}},
    "required": ["name", "fast"],
    "additionalProperties": False,
}


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def engines(request, tmp_path_factory):
    """(tp=1 reference answers, a tp=2 engine with small prefill chunks) for one model."""
    arch = request.param
    # a vocabulary padded past the tokenizer's, as real checkpoints have
    path = make_tiny_model_dir(tmp_path_factory.mktemp(arch), arch, seed=1, vocab_size=384)
    with rf.Engine(str(path), **COMMON) as ref:
        prompts = _prompts(ref.vocab_size)
        expected = {
            "greedy": ref.generate(input_ids=prompts, sampling_params=GREEDY),
            "json": ref.generate(
                "Answer in JSON:",
                {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)},
            ),
        }
    engine = rf.Engine(str(path), tp_size=2, chunked_prefill_size=16, **COMMON)
    yield prompts, expected, engine
    engine.shutdown()


def test_greedy_tokens_equal_one_rank(engines):
    prompts, expected, engine = engines
    assert engine.runner.tp.size == 2
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected["greedy"]]
    assert_kv_released(engine)


def test_repeated_prefix_is_cached_and_answers_the_same(engines):
    prompts, expected, engine = engines
    engine.flush_cache()
    first = engine.generate(input_ids=prompts[1], sampling_params=GREEDY)
    again = engine.generate(input_ids=prompts[1], sampling_params=GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] >= len(prompts[1]) - 1
    assert first["output_ids"] == again["output_ids"] == expected["greedy"][1]["output_ids"]
    assert_kv_released(engine)


def test_json_schema_output_validates_and_equals_one_rank(engines):
    _, expected, engine = engines
    out = engine.generate(
        "Answer in JSON:",
        {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)},
    )
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert out["output_ids"] == expected["json"]["output_ids"]
    assert_kv_released(engine)
