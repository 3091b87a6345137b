"""The engine on the default model (SmolLM2-135M-Instruct) against transformers, float32."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
import transformers
from kv_checks import assert_kv_released

import radixflow as rf
from radixflow.runtime.model_loader import transformers_dir

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4,",
    "The three primary colors are red, yellow and",
    "Q: What is the largest planet in the solar system?\nA:",
    "Water boils at",
    "import numpy as np\nx = np.arange(10)\nprint(",
]


@pytest.fixture(scope="module")
def engine():
    # float activations: the packed weights' products are then transformers' within fp32
    # rounding (int8 activations round x, tests/test_quant_default_model.py bounds that)
    eng = rf.Engine(
        dtype="float32", max_total_tokens=8192, chunked_prefill_size=64, quant_activations="float"
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf(engine):
    return transformers.AutoModelForCausalLM.from_pretrained(
        transformers_dir(engine.model_dir), dtype=torch.float32
    ).eval()


@pytest.fixture(autouse=True)
def _pages_free_after(engine):
    yield
    assert_kv_released(engine)


def _hf_generate(hf, ids: list[int], max_new: int, **kwargs) -> list[int]:
    out = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=2,
        **kwargs,
    )
    return out[0, len(ids) :].tolist()


def test_config_of_default_model(engine):
    cfg = engine.runner.hf_config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (576, 30, 49152)


def test_prompt_logits_match_transformers(engine, hf):
    ids = engine.tokenizer.encode(PROMPTS[2] + " young princess who loved to read books.")
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
    ours = torch.tensor([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    expected = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert (ours - expected).abs().max() < 1e-4


def test_batch_greedy_matches_transformers(engine, hf):
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    expected = [_hf_generate(hf, i, 12, eos_token_id=None) for i in ids]
    outs = engine.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    )
    assert [o["output_ids"] for o in outs] == expected
    assert outs[0]["text"] == engine.tokenizer.decode(expected[0])


def test_repetition_penalty_matches_transformers(engine, hf):
    ids = engine.tokenizer.encode(PROMPTS[3])
    expected = _hf_generate(hf, ids, 12, eos_token_id=None, repetition_penalty=1.5)
    out = engine.generate(
        input_ids=ids,
        sampling_params={
            "max_new_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "repetition_penalty": 1.5,
        },
    )
    assert out["output_ids"] == expected


def test_quickstart_answer_is_sensible(engine):
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    out = engine.generate(prompt, {"max_new_tokens": 24, "temperature": 0})
    assert "Paris" in out["text"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}


def test_stop_string_is_trimmed_and_found_across_tokens(engine):
    base = engine.generate(PROMPTS[3], {"max_new_tokens": 16, "temperature": 0})
    text = base["text"]
    assert "6, 7" in text
    out = engine.generate(PROMPTS[3], {"max_new_tokens": 16, "temperature": 0, "stop": ["6, 7"]})
    assert out["text"] == text[: text.index("6, 7")]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "6, 7"}
    kept = engine.generate(
        PROMPTS[3],
        {"max_new_tokens": 16, "temperature": 0, "stop": "6, 7", "no_stop_trim": True},
    )
    assert kept["text"] == text[: text.index("6, 7") + 4]


def test_stop_token_ids_and_min_new_tokens(engine):
    base = engine.generate(PROMPTS[3], {"max_new_tokens": 8, "temperature": 0})
    ids = base["output_ids"]
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    stop_id = ids[cut]
    out = engine.generate(
        PROMPTS[3], {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop_id]}
    )
    assert out["output_ids"] == ids[: cut + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    chat = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True
    )
    short = engine.generate(chat, {"max_new_tokens": 64, "temperature": 0})
    n = short["meta_info"]["completion_tokens"]
    assert short["meta_info"]["finish_reason"]["type"] == "stop"
    longer = engine.generate(
        chat, {"max_new_tokens": 64, "temperature": 0, "min_new_tokens": n + 5}
    )
    assert longer["meta_info"]["completion_tokens"] >= n + 5


def test_seed_reproduces_regardless_of_neighbours(engine):
    params = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 1234}
    alone = engine.generate(PROMPTS[0], params)
    batch = engine.generate(
        [PROMPTS[1], PROMPTS[0], PROMPTS[2]],
        [{"max_new_tokens": 20, "temperature": 0.7}, params, {"max_new_tokens": 5}],
    )
    assert batch[1]["output_ids"] == alone["output_ids"]
    other = engine.generate(PROMPTS[0], {**params, "seed": 4321})
    assert other["output_ids"] != alone["output_ids"]


def test_n_samples_and_top_logprobs(engine):
    outs = engine.generate(
        PROMPTS[0],
        {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "seed": 7},
        return_logprob=True,
        top_logprobs_num=2,
    )
    assert len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    for o in outs:
        lps = o["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in lps] == o["output_ids"]
        for (lp, _, _), top in zip(lps, o["meta_info"]["output_top_logprobs"], strict=True):
            assert len(top) == 2 and top[0][0] >= top[1][0] and lp <= top[0][0] + 1e-6


def test_streaming_is_cumulative_and_ends_with_final(engine):
    final = engine.generate(PROMPTS[2], {"max_new_tokens": 12, "temperature": 0})
    chunks = list(
        engine.generate(PROMPTS[2], {"max_new_tokens": 12, "temperature": 0}, stream=True)
    )
    assert len(chunks) > 2
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert chunks[-1]["text"] == final["text"]
    assert chunks[-1]["output_ids"] == final["output_ids"]


async def test_async_generate_and_stream(engine):
    results = await asyncio.gather(
        *[engine.async_generate(p, {"max_new_tokens": 8, "temperature": 0}) for p in PROMPTS[:4]]
    )
    sync = engine.generate(PROMPTS[:4], {"max_new_tokens": 8, "temperature": 0})
    assert [r["output_ids"] for r in results] == [s["output_ids"] for s in sync]
    stream = await engine.async_generate(
        PROMPTS[0], {"max_new_tokens": 8, "temperature": 0}, stream=True
    )
    last = None
    async for chunk in stream:
        last = chunk
    assert last["output_ids"] == sync[0]["output_ids"]


def test_abort_finishes_request_and_frees_kv(engine):
    got = {}

    def run():
        got["out"] = engine.generate(
            PROMPTS[0], {"max_new_tokens": 2000, "ignore_eos": True}, rid="to-abort"
        )

    thread = threading.Thread(target=run)
    thread.start()
    while not engine.scheduler.running:
        threading.Event().wait(0.01)
    engine.abort("to-abort")
    thread.join(timeout=60)
    assert got["out"]["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"max_token": 5}}, "max_token"),
        ({"prompt": "hi", "sampling_params": {"stop": ["ok", 3]}}, "stop"),
        ({"prompt": "hi", "sampling_params": {"n": 10_000}}, "n"),
        ({"input_ids": [1, 2, 10**9]}, "input_ids"),
        ({"input_ids": list(range(9000))}, "context length"),
    ],
)
def test_bad_input_names_the_field_and_spares_others(engine, kwargs, field):
    done = {}
    thread = threading.Thread(
        target=lambda: done.setdefault(
            "out", engine.generate(PROMPTS[0], {"max_new_tokens": 8, "temperature": 0})
        )
    )
    thread.start()
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    thread.join(timeout=60)
    assert done["out"]["meta_info"]["finish_reason"]["type"] == "length"
