"""Weights kept packed in the model: quantized at load (q8_0/q4_0/q4_1) or a GGUF's own blocks
(mixed types, K-quants, tied embedding), against the same model with the dequantized weights."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_model_loader import random_model, write_gguf
from tiny_models import make_tiny_model_dir, stored_qtype

import radixflow as rf
from radixflow.kernels.quant_formats import QTYPES, PackedWeight, dequantize, quantize, row_bytes
from radixflow.kernels.reference import quant_linear_ref
from radixflow.runtime import gguf_convert, model_loader
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.gguf_convert import PACKED_METADATA_KEY
from radixflow.runtime.layers.embedding import QuantEmbedding
from radixflow.runtime.layers.linear import QuantLinear, QuantLinearImpl, choose_quant_linear
from radixflow.runtime.layers.target import OpsTarget
from radixflow.runtime.model_loader import QUANTIZATIONS, load_checkpoint, transformers_dir
from radixflow.runtime.speculative.layer_skip import write_layer_skip_draft

PROMPTS = [[5, 9, 17, 33, 2, 8], [40, 41, 42], list(range(3, 30))]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(autouse=True)
def isolated_gguf_cache(tmp_path, monkeypatch):
    """Conversions go to tmp_path; the compiled CPU kernels stay in the shared cache."""
    monkeypatch.setattr(gguf_convert, "cache_root", lambda: tmp_path / "gguf-cache")


@pytest.fixture
def every_type_has_a_kernel(monkeypatch):
    """`quantization=auto` keeps a GGUF's types packed where a quantized kernel runs them;
    bind the reference as that kernel, so these tests see the packed model on any machine."""
    impl = QuantLinearImpl("reference", quant_linear_ref, frozenset(QTYPES))
    monkeypatch.setattr(model_loader, "choose_quant_linear", lambda target: impl)


def run(engine: rf.Engine) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens and prompt logprobs for PROMPTS."""
    tokens, logprobs = [], []
    for ids in PROMPTS:
        out = engine.generate(
            input_ids=ids, sampling_params=GREEDY, return_logprob=True, logprob_start_len=0
        )
        tokens.append(out["output_ids"])
        logprobs.append([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    return tokens, logprobs


def generate(path, **config) -> tuple[list[list[int]], list[list[float]], torch.nn.Module]:
    # float activations unless a test says otherwise: the packed weights' products are then the
    # dequantized model's within fp32 rounding
    config.setdefault("quant_activations", "float")
    engine = rf.Engine(str(path), dtype="float32", max_total_tokens=1024, **config)
    try:
        return (*run(engine), engine.runner.model)
    finally:
        engine.shutdown()


def assert_same_outputs(got, expected) -> None:
    assert got[0] == expected[0]
    for ours, ref in zip(got[1], expected[1], strict=True):
        assert ours == pytest.approx(ref, abs=1e-4)


def dequantized_copy(src, dst, qtype: str):
    """The float checkpoint `src` with each weight replaced by what `qtype` keeps of it."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    for name, w in weights.items():
        if name.endswith("_proj.weight") or name in ("model.embed_tokens.weight", "lm_head.weight"):
            kept = qtype if name.endswith("_proj.weight") else "q8_0"
            weights[name] = dequantize(quantize(w, kept), kept, w.shape[1])
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0", "int4"])
def test_quantized_at_load_equals_the_dequantized_model(tmp_path, quantization):
    path = make_tiny_model_dir(tmp_path / "float", "llama", seed=4)
    qtype = model_loader.QUANTIZE_TO[quantization]
    reference = dequantized_copy(path, tmp_path / "dequantized", qtype)
    *packed_out, model = generate(path, quantization=quantization)
    *float_out, float_model = generate(reference, quantization="none")
    assert_same_outputs(packed_out, float_out)

    layer = model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
    qkv = layer.self_attn.qkv_proj
    assert [s[0] for s in qkv.segments] == [stored_qtype(qkv, qtype)]
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.embed_tokens.qtype == "q8_0"
    assert isinstance(model.lm_head, QuantLinear)
    assert not any(isinstance(m, QuantLinear) for m in float_model.modules())
    # the packed model's weights: its uint8 blocks plus the float norms
    packed_bytes = sum(b.numel() for b in model.buffers() if b.dtype == torch.uint8)
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    cfg = model.config
    hidden, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * hidden // cfg.num_attention_heads
    rows_by_k = {hidden: layers * (2 * hidden + 2 * kv + 2 * inter), inter: layers * hidden}
    expected = sum(rows * row_bytes(qtype, k) for k, rows in rows_by_k.items())
    expected += 2 * cfg.vocab_size * row_bytes("q8_0", hidden)  # embedding and lm_head
    assert packed_bytes == expected
    assert float_bytes == 4 * (hidden * (2 * layers + 1))  # the RMSNorm weights only


def test_int8_activations_reach_every_quantized_product(tmp_path):
    # the knob's int8 rounding moves prompt logprobs a little (both the layer-by-layer prefill
    # and the fused decode layers take it), within what the rounding of x allows
    path = make_tiny_model_dir(tmp_path / "float", "llama", seed=4)
    tokens, int8_logprobs, model = generate(path, quantization="q8_0", quant_activations="int8")
    _, float_logprobs, _ = generate(path, quantization="q8_0")
    assert model.layers[0].mlp.down_proj.impl.int8_activations
    moved = max(
        abs(a - b)
        for ours, ref in zip(int8_logprobs, float_logprobs, strict=True)
        for a, b in zip(ours, ref, strict=True)
    )
    assert 1e-6 < moved < 0.2, moved  # measured 0.054
    assert all(len(t) == GREEDY["max_new_tokens"] for t in tokens)


def test_gguf_blocks_are_used_as_stored(tmp_path, every_type_has_a_kernel):
    """Mixed types inside fused q|k|v, K-quants, q/k row permutation, tied embedding/lm_head."""
    original = random_model(
        "llama", seed=2, hidden_size=256, intermediate_size=512, tie_word_embeddings=True
    )
    types = {"attn_q": Q.Q4_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_1, "ffn": Q.Q8_0, "token": Q.Q8_0}
    k_quant = {"blk.0.ffn_down.weight": Q.Q4_K, "blk.1.attn_output.weight": Q.Q6_K}
    path = write_gguf(tmp_path / "mixed.gguf", original, types, k_quant)
    *packed_out, model = generate(path)  # quantization auto
    *float_out, _ = generate(path, quantization="none")
    assert_same_outputs(packed_out, float_out)

    qkv = model.layers[0].self_attn.qkv_proj
    assert [(q, n) for q, _, n in qkv.segments] == [
        (stored_qtype(qkv, "q4_0"), 256),
        (stored_qtype(qkv, "q8_0"), 128),
        (stored_qtype(qkv, "q4_1"), 128),
    ]
    down = model.layers[0].mlp.down_proj
    assert down.segments[0][0] == stored_qtype(down, "q4_k")
    o_proj = model.layers[1].self_attn.o_proj
    assert o_proj.segments[0][0] == stored_qtype(o_proj, "q6_k")
    assert isinstance(model.embed_tokens, QuantEmbedding) and not hasattr(model, "lm_head")


def test_fused_layer_with_a_float_part_is_dequantized(tmp_path, every_type_has_a_kernel):
    original = random_model("llama", seed=3)
    path = write_gguf(tmp_path / "f16v.gguf", original, {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0})
    *packed_out, model = generate(path)
    *float_out, _ = generate(path, quantization="none")
    assert_same_outputs(packed_out, float_out)
    assert not isinstance(model.layers[0].self_attn.qkv_proj, QuantLinear)  # v is F32


def test_converted_cache_holds_the_gguf_bytes(tmp_path):
    original = random_model("llama", seed=1)
    path = write_gguf(tmp_path / "q.gguf", original, {"attn": Q.Q4_1, "ffn_up": Q.Q8_0})
    ckpt = load_checkpoint(path)
    with safe_open(ckpt.model_dir / "model.safetensors", framework="pt") as f:
        metadata = f.metadata()[PACKED_METADATA_KEY]
        up = f.get_tensor("model.layers.0.mlp.up_proj.weight")
    assert '"model.layers.0.self_attn.q_proj.weight": {"qtype": "q4_1", "shape": [64, 64]}' in (
        metadata
    )
    assert up.dtype == torch.uint8 and up.shape == (128, row_bytes("q8_0", 64))
    # transformers' float twin holds exactly what `weights` dequantizes
    twin = load_file(transformers_dir(ckpt.model_dir) / "model.safetensors")
    for name, tensor in ckpt.weights(torch.float32):
        assert torch.equal(twin[name], tensor), name
    assert transformers_dir(transformers_dir(ckpt.model_dir)) == transformers_dir(ckpt.model_dir)


def test_quantization_plan_rules(tmp_path):
    path = make_tiny_model_dir(tmp_path / "m", "llama", seed=0)
    ckpt = load_checkpoint(path)
    cpu = OpsTarget(torch.device("cpu"), torch.float32)
    assert ckpt.quant_plan("none", cpu) == {}
    assert ckpt.quant_plan("auto", cpu) == {}  # a float checkpoint has nothing packed
    plan = ckpt.quant_plan("int8", cpu)
    assert set(plan.values()) == {"q8_0"} and "model.norm.weight" not in plan
    assert plan["lm_head.weight"] == ckpt.quant_plan("int4", cpu)["lm_head.weight"] == "q8_0"
    assert ckpt.quant_plan("int4", cpu)["model.layers.1.mlp.down_proj.weight"] == "q4_1"
    with pytest.raises(ValueError, match="quantization must be one of"):
        ckpt.quant_plan("awq", cpu)
    cuda = OpsTarget(torch.device("cuda"), torch.float16, triton=False)
    with pytest.raises(ValueError, match="needs the Triton kernels"):
        ckpt.quant_plan("int4", cuda)
    assert ckpt.quant_plan("auto", cuda) == {}


def test_quantization_knob_choices():
    assert EngineConfig.__dataclass_fields__["quantization"].metadata["choices"] == QUANTIZATIONS
    assert EngineConfig().quantization == "auto"
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="awq")
    assert EngineConfig.from_kwargs(quantization="int8").quantization == "int8"


def test_layer_skip_draft_of_a_gguf_keeps_its_packed_weights(tmp_path, every_type_has_a_kernel):
    original = random_model("llama", seed=5)
    path = write_gguf(tmp_path / "q.gguf", original, {"attn": Q.Q8_0, "ffn": Q.Q4_1})
    draft = write_layer_skip_draft(path, tmp_path / "draft", num_layers=1)
    cpu = OpsTarget(torch.device("cpu"), torch.float32)
    full = load_checkpoint(path).quant_plan("auto", cpu)
    layer0 = {n: q for n, q in full.items() if not n.startswith("model.layers.1.")}
    assert load_checkpoint(draft).quant_plan("auto", cpu) == layer0
    *_, model = generate(draft)
    assert isinstance(model.layers[0].mlp.gate_up_proj, QuantLinear)


def test_a_layer_loaded_again_after_interleaving_runs_the_new_weight():
    # the CPU kernels read q4_1 interleaved by 16 rows; loading a part again first puts the
    # segment back in the file's layout, so the rows that were not loaded again keep theirs
    impl = choose_quant_linear(OpsTarget(torch.device("cpu"), torch.float32))
    if "q4_1" not in impl.interleaved:
        pytest.skip(f"the {impl.name} quantized linear reads q4_1 in the file's layout")
    gen = torch.Generator().manual_seed(5)
    first, second, other = (torch.randn(32, 64, generator=gen) for _ in range(3))
    layer = QuantLinear(64, [(32, "q4_1"), (32, "q4_1")], False, impl)
    for rows, offset in ((first, 0), (other, 32)):
        layer.load(PackedWeight(quantize(rows, "q4_1"), "q4_1", (32, 64)), offset)
    layer.interleave_rows()
    assert layer.segments == [("q4_1x16", 0, 64)]
    layer.load(PackedWeight(quantize(second, "q4_1"), "q4_1", (32, 64)), 0)
    layer.interleave_rows()
    x = torch.randn(3, 64, generator=gen)
    weight = torch.cat([dequantize(quantize(w, "q4_1"), "q4_1", 64) for w in (second, other)])
    torch.testing.assert_close(layer(x), x @ weight.T, rtol=1e-5, atol=1e-5)
