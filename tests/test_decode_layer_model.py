"""Tiny seeded models of every family decode the same greedy tokens (and nearly the same
logprobs) through the fused CPU decode layers as through the layer-by-layer path: Llama with
GQA, Qwen2 with q/k/v bias and a sliding window, Qwen3 with q/k norm, tied embeddings, float and
packed weights, float32 and bfloat16, one request and a ragged batch."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.kernels.cpu_build import current_choice
from radixflow.runtime.layers.decode_block import DecodeStack

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)

PROMPTS = [[5, 9, 17, 33, 2, 8], [40, 41, 42], list(range(3, 30))]
GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
CASES = {  # name: (arch, model overrides, engine dtype, quantization)
    "llama-fp32-float": ("llama", {}, "float32", "none"),
    "llama-fp32-q4_1-tied": ("llama", {"tie_word_embeddings": True}, "float32", "q4_1"),
    "llama-bf16-q4_0": ("llama", {}, "bfloat16", "q4_0"),
    "qwen2-fp32-q8_0-window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
        "float32",
        "q8_0",
    ),
    "qwen3-bf16-float": ("qwen3", {}, "bfloat16", "none"),
    "qwen3-fp32-q4_1": ("qwen3", {}, "float32", "q4_1"),
}


def outputs(engine: rf.Engine, batched: bool) -> tuple[list[list[int]], list[list[float]]]:
    prompts = [PROMPTS] if batched else [[ids] for ids in PROMPTS]
    tokens, logprobs = [], []
    for group in prompts:
        outs = engine.generate(input_ids=group, sampling_params=GREEDY, return_logprob=True)
        for out in outs:
            tokens.append(out["output_ids"])
            logprobs.append([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    return tokens, logprobs


@pytest.mark.parametrize("case", list(CASES))
def test_fused_decode_gives_the_layer_by_layer_tokens(tmp_path, monkeypatch, case):
    arch, overrides, dtype, quantization = CASES[case]
    path = make_tiny_model_dir(tmp_path / "m", arch, seed=5, **overrides)
    fused_steps = []
    forward = DecodeStack.forward
    monkeypatch.setattr(
        DecodeStack, "forward", lambda self, x, b: fused_steps.append(1) or forward(self, x, b)
    )
    engine = rf.Engine(str(path), dtype=dtype, quantization=quantization, max_total_tokens=1024)
    try:
        stack = engine.runner.model.decode_stack
        assert stack.reason == ""
        for batched in (False, True):
            stack.enabled = True
            fused = outputs(engine, batched)
            assert fused_steps, "the fused path did not run"
            engine.flush_cache()
            stack.enabled = False
            steps = len(fused_steps)
            plain = outputs(engine, batched)
            assert len(fused_steps) == steps
            engine.flush_cache()
            assert fused[0] == plain[0]
            tolerance = 1e-4 if dtype == "float32" else 5e-2
            for ours, ref in zip(fused[1], plain[1], strict=True):
                assert ours == pytest.approx(ref, abs=tolerance)
    finally:
        engine.shutdown()
