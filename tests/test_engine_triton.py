"""The engine with the Triton attention backend (interpreted on the CPU) matches the torch one."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model_dir

import radixflow as rf


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_backend_generates_same_tokens_as_torch(tmp_path, page_size):
    path = make_tiny_model_dir(tmp_path, "llama", seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 300, (n,), generator=g).tolist() for n in (5, 19, 2)]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    outputs = {}
    for backend in ("torch", "triton"):
        engine = rf.Engine(
            str(path),
            dtype="float32",
            attention_backend=backend,
            page_size=page_size,
            max_total_tokens=512,
            chunked_prefill_size=8,
        )
        try:
            outputs[backend] = [
                o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)
            ]
        finally:
            engine.shutdown()
    assert outputs["triton"] == outputs["torch"]
