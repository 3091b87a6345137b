"""On a CUDA GPU: the Triton kernels compiled for the device (not the interpreter) and the
engine end to end on the GPU, against torch references and transformers.

Skipped where torch sees no GPU, or when the Triton interpreter is on (conftest turns it on by
default; run `TRITON_INTERPRET=0 pytest tests/test_gpu.py` on a GPU machine).
"""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.kernels.testing import random_gguf_weight, relative_error

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="the Triton interpreter is on: run with TRITON_INTERPRET=0 on a GPU machine",
    ),
]

CUDA = torch.device("cuda")
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
# bf16: the weights and activations round to 8 bits of mantissa; fp16 to 11.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 7, 33, 300])
def test_triton_quant_matmul_matches_dequantize_then_linear(rows, qtype, dtype):
    from radixflow.kernels.quant_triton import quant_linear_triton
    from radixflow.kernels.reference import quant_linear_ref

    n, k = 1000, 4096  # small batches split K over programs
    packed, w = random_gguf_weight(qtype, n, k, torch.Generator().manual_seed(rows))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(8)).to(dtype)
    got = quant_linear_triton(x.to(CUDA), packed.to(CUDA), qtype, k, bias.to(CUDA))
    assert got.device.type == "cuda" and got.dtype == dtype and got.shape == (rows, n)
    exact = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert relative_error(got.cpu(), exact) < TOLERANCE[dtype]
    ref = quant_linear_ref(x, packed, qtype, k, bias)
    assert relative_error(got.cpu(), ref) < TOLERANCE[dtype]


def _hf_greedy(path, prompts: list[list[int]], dtype: torch.dtype) -> list[list[int]]:
    """transformers' argmax continuation; a plain loop, since generate's `min_new_tokens`
    would mask EOS, which ignore_eos lets the engine pick."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(CUDA).eval()
    outs = []
    for ids in prompts:
        seq = torch.tensor([ids], device=CUDA)
        for _ in range(GREEDY["max_new_tokens"]):
            with torch.no_grad():
                nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        outs.append(seq[0, len(ids) :].tolist())
    return outs


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 300, (n,), generator=g).tolist() for n in (5, 40, 3, 17)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_engine_on_cuda_matches_transformers_greedy(tmp_path, arch, backend):
    path = make_tiny_model_dir(tmp_path, arch, seed=5)
    prompts = _prompts()
    expected = _hf_greedy(path, prompts, torch.float32)
    engine = rf.Engine(
        str(path),
        device="cuda",
        dtype="float32",
        attention_backend=backend,
        page_size=16,
        max_total_tokens=2048,
        chunked_prefill_size=16,
    )
    try:
        assert engine.runner.device.type == "cuda"
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        assert_kv_released(engine)
    finally:
        engine.shutdown()


def test_engine_on_cuda_bf16_prefix_cache_and_speculation(tmp_path):
    path = make_tiny_model_dir(tmp_path, "llama", seed=6)
    shared = list(range(10, 90))
    prompts = [shared + [i + 100, i + 101] for i in range(6)]
    runs = {}
    for spec in (None, "ngram"):
        kwargs = {} if spec is None else {"speculative_algorithm": spec}
        engine = rf.Engine(str(path), device="cuda", dtype="bfloat16", page_size=16, **kwargs)
        try:
            first = engine.generate(input_ids=prompts[0], sampling_params=GREEDY)
            rest = engine.generate(input_ids=prompts[1:], sampling_params=GREEDY)
            assert min(o["meta_info"]["cached_tokens"] for o in rest) >= 64
            runs[spec] = [first["output_ids"]] + [o["output_ids"] for o in rest]
        finally:
            engine.shutdown()
    assert runs["ngram"] == runs[None]


def test_engine_on_cuda_quantized_weights_run_the_triton_matmul(tmp_path):
    path = make_tiny_model_dir(tmp_path, "llama", seed=7)
    prompts = _prompts()
    outs = {}
    for quantization in ("none", "int8"):
        engine = rf.Engine(
            str(path), device="cuda", dtype="float16", quantization=quantization, page_size=16
        )
        try:
            if quantization == "int8":
                assert engine.runner.model.ops.quant_linear.name == "triton"
            outs[quantization] = [
                o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)
            ]
        finally:
            engine.shutdown()
    same = sum(a == b for a, b in zip(outs["int8"], outs["none"], strict=True))
    assert same >= 3, f"int8 greedy tokens equal fp16's on {same} of {len(prompts)} prompts"


def test_engine_on_cuda_json_schema_output_validates(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    import json

    path = make_tiny_model_dir(tmp_path, "llama", seed=8)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    engine = rf.Engine(str(path), device="cuda", dtype="bfloat16")
    try:
        outs = engine.generate(
            ["a", "b", "c"],
            {"max_new_tokens": 64, "temperature": 1.0, "json_schema": json.dumps(schema)},
        )
        for out in outs:
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                jsonschema.validate(json.loads(out["text"]), schema)
    finally:
        engine.shutdown()
