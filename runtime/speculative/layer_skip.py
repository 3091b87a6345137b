"""Layer-skip self-drafting: a model's first few decoder layers, its final norm and lm_head.

The result is an ordinary HF folder with the target's tokenizer, so it loads as
`speculative_draft_model` like any other draft: a cheap draft for a model that has no smaller
sibling.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from radixflow.runtime.gguf_convert import PACKED_METADATA_KEY
from radixflow.runtime.model_loader import resolve_model_dir, safetensors_files

_LAYER = re.compile(r"\.layers\.(\d+)\.")
_WEIGHT_FILES = ("config.json", "model.safetensors.index.json")


def write_layer_skip_draft(
    model_path: str | os.PathLike[str] | None, out_dir: str | os.PathLike[str], num_layers: int
) -> Path:
    """Save the first `num_layers` layers of `model_path` (None: the default model) to `out_dir`."""
    src = resolve_model_dir(model_path)
    config = json.loads((src / "config.json").read_text())
    total = config["num_hidden_layers"]
    if not 1 <= num_layers < total:
        raise ValueError(f"num_layers must be in [1, {total - 1}] for this model, got {num_layers}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():  # tokenizer and generation files travel unchanged
        if file.is_file() and file.suffix != ".safetensors" and file.name not in _WEIGHT_FILES:
            shutil.copy(file, out / file.name)
    config["num_hidden_layers"] = num_layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:num_layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    packed = {}  # a converted GGUF's packed weights: their qtype and shape travel with them
    for file in safetensors_files(src):
        with safe_open(file, framework="pt") as shard:
            packed.update(json.loads((shard.metadata() or {}).get(PACKED_METADATA_KEY, "{}")))
            for name in shard.keys():  # noqa: SIM118 (safe_open has no __iter__)
                layer = _LAYER.search(name)
                if layer is None or int(layer.group(1)) < num_layers:
                    tensors[name] = shard.get_tensor(name)
    kept = json.dumps({name: entry for name, entry in packed.items() if name in tensors})
    save_file(tensors, out / "model.safetensors", metadata={PACKED_METADATA_KEY: kept})
    return out
