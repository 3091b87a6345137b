"""Convert a GGUF file once into a cached Hugging Face-format folder.

The folder holds `config.json`, the tokenizer files (converted by transformers) and the weights
as safetensors under Hugging Face parameter names, so the rest of the runtime sees one format.
2-D tensors of a type kept packed (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: kernels/quant_formats.py) are
stored as their GGUF bytes, uint8 [N, row_bytes], and named with their qtype and float shape in
the file's metadata (PACKED_METADATA_KEY); every other tensor is dequantized to float32.

    ~/.cache/radixflow/gguf/<stem>-<hash of the converter version and the file's sha256>/
        config.json  tokenizer.json  tokenizer_config.json  chat_template.jinja  model.safetensors

The folder is named by the file's content, so every copy of one GGUF (the default model's
package installed in several virtual environments, a reinstall, a copied file) shares one
conversion instead of adding hundreds of megabytes per copy. A file is read for its digest once:
the digest is remembered under `gguf_sources/`, keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm.auto import tqdm

from radixflow.cache import cache_dir, temporary_beside
from radixflow.kernels.quant_formats import PackedWeight, qtype_of_ggml

# Bump when the folder layout or the conversion changes, so old caches are not reused.
CONVERTER_VERSION = 3
SHARD_BYTES = 2 << 30
# safetensors metadata key: JSON {name: {"qtype": "q4_1", "shape": [N, K]}} of the packed tensors
PACKED_METADATA_KEY = "radixflow.packed"

SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    )
)  # fmt: skip

# GGUF architecture -> (HF model_type, HF architecture class)
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Tensors llama.cpp writes that HF recomputes from the config.
_DERIVED_TENSORS = {"rope_freqs.weight"}


def cache_root() -> Path:
    """Root of converted GGUF folders: `$RADIXFLOW_CACHE_DIR/gguf` or `~/.cache/radixflow/gguf`."""
    return cache_dir("gguf")


def cache_dir_for(gguf_path: str | os.PathLike[str]) -> Path:
    """The cache folder of one GGUF file, keyed by the converter's version and the file's
    content (`content_digest`)."""
    path = Path(gguf_path).resolve()
    ident = f"v{CONVERTER_VERSION}|{content_digest(path)}"
    return cache_root() / f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def content_digest(path: Path) -> str:
    """The sha256 of `path`'s bytes (hex), read once per path, size and mtime: later calls find
    it under `gguf_sources/` (a read-only or missing cache folder only costs the reading)."""
    st = path.stat()
    source = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    memo = cache_dir("gguf_sources") / hashlib.sha256(source.encode()).hexdigest()[:32]
    try:
        known = memo.read_text()
        if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    except OSError:
        pass
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    try:  # written beside it, then renamed: a reader never sees a partial digest
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_beside(memo)
        tmp.write_text(digest)
        tmp.replace(memo)
    except OSError:
        pass
    return digest


def convert_gguf(gguf_path: str | os.PathLike[str]) -> Path:
    """Return the HF-format folder for `gguf_path`, converting it first if it is not cached.

    The folder is built under a temporary name and renamed into place, so an interrupted or
    concurrent conversion never leaves a partial folder under the final name.
    """
    path = Path(gguf_path).resolve()
    if not path.is_file():
        raise ValueError(f"GGUF file not found: {path}")
    target = cache_dir_for(path)
    if not target.is_dir():
        build_atomically(target, lambda tmp: _convert(path, tmp))
    return target


def build_atomically(target: Path, build: Callable[[Path], None]) -> None:
    """Run `build` on a temporary folder beside `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(target)
    tmp.mkdir()
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # a concurrent build did not win the race: real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(path: Path, out: Path) -> None:
    reader = GGUFReader(path)
    config = hf_config(reader)
    _write_tokenizer(path, out)
    _write_weights(reader, config, out, desc=f"Converting {path.name}")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value as a Python scalar, string or list."""
    field = reader.fields.get(key)
    if field is None:
        return default

    def scalar(part: np.ndarray, kind: GGUFValueType) -> Any:
        return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part.tolist()[0]

    if field.types[0] == GGUFValueType.ARRAY:
        return [scalar(field.parts[i], field.types[-1]) for i in field.data]
    return scalar(field.parts[field.data[0]], field.types[0])


def _uniform(value: Any, key: str) -> int:
    """GGUF allows some per-layer arrays (e.g. head_count_kv); we need one value."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"GGUF metadata {key} varies per layer ({value}); not supported")
        return int(value[0])
    return int(value)


def _short_float(value: float) -> float:
    """GGUF stores float32: write 1e-05, not 9.999999747378752e-06."""
    return float(str(np.float32(value)))


def hf_config(reader: GGUFReader) -> dict[str, Any]:
    """Build an HF `config.json` dict from the metadata and tensor list of a GGUF file."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    if _field(reader, "split.count", 1) > 1:
        raise ValueError("split GGUF files are not supported; merge them with llama-gguf-split")
    model_type, hf_arch = ARCHITECTURES[arch]

    def meta(key: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata {arch}.{key} is missing")
        return value

    tensors = {t.name: t for t in reader.tensors}
    hidden = int(meta("embedding_length"))
    heads = _uniform(meta("attention.head_count"), f"{arch}.attention.head_count")
    kv_heads = _uniform(meta("attention.head_count_kv", heads), f"{arch}.attention.head_count_kv")
    head_dim = int(meta("attention.key_length", meta("rope.dimension_count", hidden // heads)))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = int(tensors["token_embd.weight"].shape[1])
    theta = _short_float(meta("rope.freq_base", 10000.0))
    max_pos = int(meta("context_length"))
    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": _uniform(meta("feed_forward_length"), f"{arch}.feed_forward_length"),
        "rms_norm_eps": _short_float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "max_position_embeddings": max_pos,
        "vocab_size": int(vocab),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v bias; Llama and Qwen3 have a flag
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    for key in ("bos", "eos", "padding"):
        token_id = _field(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(token_id)
    rope_scaling = _rope_scaling(reader, arch, head_dim, theta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    return config


def _rope_scaling(
    reader: GGUFReader, arch: str, head_dim: int, theta: float
) -> dict[str, Any] | None:
    kind = _field(reader, f"{arch}.rope.scaling.type")
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if kind in ("linear", "yarn"):
        scaling: dict[str, Any] = {
            "rope_type": kind,
            "factor": float(_field(reader, f"{arch}.rope.scaling.factor")),
        }
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    if kind not in (None, "none"):
        raise ValueError(f"GGUF rope scaling type {kind!r} is not supported")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is None:
        return None
    factors = dequantize(freqs.data, freqs.tensor_type).reshape(-1).astype(np.float64)
    # llama.cpp does not store Llama 3's original context; any value gives the same frequencies
    # (low/high are recovered relative to it), 8192 is Llama 3's own.
    return llama3_rope_scaling(factors, head_dim, theta, int(original or 8192))


def llama3_rope_scaling(
    factors: np.ndarray, head_dim: int, theta: float, original_context: int
) -> dict[str, Any] | None:
    """Recover HF's `llama3` rope parameters from llama.cpp's per-frequency divisors.

    llama.cpp stores `rope_freqs` = 1 for high frequencies, `factor` for low ones and
    1 / ((1 - s) / factor + s) in between, where s = (L / wavelen - low) / (high - low) is linear
    in 1 / wavelen. Two in-between points fix that line, hence `low` and `high` for L.
    All-ones divisors mean no scaling (None).
    """
    factor = float(factors.max())
    if factor <= 1 + 1e-6:
        return None
    inv_wavelen = (theta ** -(np.arange(0, head_dim, 2) / head_dim)) / (2 * math.pi)
    smooth = (1 / factors - 1 / factor) / (1 - 1 / factor)
    medium = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    if medium.sum() < 2:
        raise ValueError(
            "GGUF rope_freqs has too few interpolated entries to recover llama3 scaling"
        )
    slope, intercept = np.polyfit(inv_wavelen[medium], smooth[medium], 1)
    low = -intercept * original_context / slope
    high = low + original_context / slope
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": round(float(low), 4),
        "high_freq_factor": round(float(high), 4),
        "original_max_position_embeddings": original_context,
    }


def hf_tensor_name(gguf_name: str) -> str:
    """Map a llama.cpp tensor name (`blk.3.attn_q.weight`) to its HF name."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart")


def unpermute_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (HF's rotate-half layout -> interleaved pairs).

    Per head, llama.cpp reorders rows [r0..r(d/2-1) | r(d/2)..r(d-1)] as pairs
    (r0, r(d/2), r1, r(d/2+1), ...); this restores the original order.
    """
    half = weight.shape[0] // n_heads // 2
    rows = weight.reshape(n_heads, half, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def iter_tensors(
    reader: GGUFReader, config: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    """Tensors under HF names, in file order: 2-D tensors of a packed type as PackedWeight
    (their GGUF bytes), the rest dequantized to float32."""
    permute = config["model_type"] == "llama"
    for tensor in reader.tensors:
        if tensor.name in _DERIVED_TENSORS:
            continue
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, not supported; "
                f"supported: {sorted(t.name for t in SUPPORTED_TYPES)}"
            )
        name = hf_tensor_name(tensor.name)
        shape = tuple(int(d) for d in reversed(tensor.shape))
        qtype = qtype_of_ggml(tensor.tensor_type.name) if len(shape) == 2 else None
        # packed rows are whole output rows, so the row permutation applies to them unchanged
        weight = tensor.data if qtype else dequantize(tensor.data, tensor.tensor_type)
        weight = weight.reshape(shape[0], -1) if qtype else weight.reshape(shape)
        if permute and ".attn_q." in tensor.name:
            weight = unpermute_rotary(weight, config["num_attention_heads"])
        elif permute and ".attn_k." in tensor.name:
            weight = unpermute_rotary(weight, config["num_key_value_heads"])
        if qtype:
            data = torch.from_numpy(np.array(weight, dtype=np.uint8, order="C"))
            yield name, PackedWeight(data, qtype, (shape[0], shape[1]))
        else:
            yield name, torch.from_numpy(np.array(weight, dtype=np.float32, order="C"))


def _write_weights(reader: GGUFReader, config: dict[str, Any], out: Path, desc: str) -> None:
    write_weights(iter_tensors(reader, config), out, len(reader.tensors), desc)


def write_weights(
    weights: Iterable[tuple[str, torch.Tensor | PackedWeight]], out: Path, total: int, desc: str
) -> None:
    """Write `model.safetensors`, or shards of at most SHARD_BYTES plus an index when larger;
    packed weights as their bytes, named in the shard's metadata."""
    shards: list[list[str]] = []
    current: dict[str, torch.Tensor] = {}
    packed: dict[str, dict[str, Any]] = {}
    size = 0

    def flush() -> None:
        metadata = {"format": "pt", PACKED_METADATA_KEY: json.dumps(packed)}
        save_file(current, out / f"shard-{len(shards)}.safetensors", metadata=metadata)
        shards.append(list(current))

    for name, value in tqdm(weights, total=total, desc=desc):
        tensor = value.data if isinstance(value, PackedWeight) else value
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > SHARD_BYTES:
            flush()
            current, packed, size = {}, {}, 0
        current[name] = tensor
        if isinstance(value, PackedWeight):
            packed[name] = {"qtype": value.qtype, "shape": list(value.shape)}
        size += nbytes
    flush()
    if len(shards) == 1:
        (out / "shard-0.safetensors").rename(out / "model.safetensors")
        return
    weight_map = {}
    for i, names in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (out / f"shard-{i}.safetensors").rename(out / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out)
