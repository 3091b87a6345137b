"""The engine against transformers on tiny random Llama / Qwen2 / Qwen3 models (float32)."""

from __future__ import annotations

import pytest
import torch
import transformers
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf

PROMPT_LENGTHS = [3, 17, 5, 40, 1, 23, 9, 31]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), request.param, seed=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, hf


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _hf_greedy(hf, ids: list[int], max_new: int) -> list[int]:
    out = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def test_prompt_logprobs_match_transformers(tiny):
    path, hf = tiny
    engine = rf.Engine(str(path), dtype="float32", max_total_tokens=2048, chunked_prefill_size=8)
    try:
        for ids in _prompts(hf.config.vocab_size)[:5]:
            out = engine.generate(
                input_ids=ids,
                sampling_params={"max_new_tokens": 1, "temperature": 0},
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=3,
            )
            with torch.no_grad():
                ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
            ours = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]]
            assert ours[0] is None and len(ours) == len(ids)
            expected = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
            assert ours[1:] == pytest.approx(expected, abs=1e-4)
            first = out["meta_info"]["output_token_logprobs"][0]
            assert first[1] == int(ref[-1].argmax())
            assert first[0] == pytest.approx(ref[-1].max().item(), abs=1e-4)
            top = out["meta_info"]["output_top_logprobs"][0]
            assert [t for _, t, _ in top] == ref[-1].topk(3).indices.tolist()
        assert_kv_released(engine)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "options",
    [
        {"page_size": 1, "chunked_prefill_size": -1},
        {"page_size": 1, "chunked_prefill_size": 16},
        {"page_size": 16, "chunked_prefill_size": -1},
        {"page_size": 16, "chunked_prefill_size": 16},
        # A pool far too small for 8 requests of up to 64 tokens: forces retraction.
        {"page_size": 1, "chunked_prefill_size": 16, "max_total_tokens": 96},
        {"page_size": 16, "chunked_prefill_size": -1, "max_total_tokens": 96},
    ],
    ids=["p1", "p1-chunk", "p16", "p16-chunk", "p1-retract", "p16-retract"],
)
def test_batch_greedy_matches_transformers(tiny, options):
    path, hf = tiny
    prompts = _prompts(hf.config.vocab_size, seed=1)
    retract = options.get("max_total_tokens", 4096) < 200
    max_new = 40 if retract else 16
    expected = [_hf_greedy(hf, ids, max_new) for ids in prompts]
    engine = rf.Engine(str(path), dtype="float32", **{"max_total_tokens": 4096, **options})
    try:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
        )
        assert [o["output_ids"] for o in outs] == expected
        assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
        if retract:
            assert engine.scheduler.num_retractions > 0
        assert_kv_released(engine)
    finally:
        engine.shutdown()
