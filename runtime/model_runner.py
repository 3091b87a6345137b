"""Owns the model, its KV pool and attention backend; turns a ScheduledStep into logits."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.layers.attention import choose_attention_backend
from radixflow.runtime.layers.target import OpsTarget
from radixflow.runtime.model_loader import Checkpoint
from radixflow.runtime.models.llama import LlamaForCausalLM
from radixflow.runtime.scheduler import ScheduledStep

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls beat fp32 at every batch size we measured."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


class ModelRunner:
    def __init__(self, config: EngineConfig, checkpoint: Checkpoint) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        hf = checkpoint.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        model_max = getattr(hf, "max_position_embeddings", None) or 4096
        if config.context_length is not None and config.context_length > model_max:
            raise ValueError(
                f"context_length {config.context_length} exceeds the model's {model_max}"
            )
        self.context_length = config.context_length or model_max
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        self.pool = KVPool(
            num_layers=hf.num_hidden_layers,
            num_pages=self._num_pages(config, hf.num_hidden_layers, kv_heads, head_dim),
            page_size=config.page_size,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
            max_reqs=config.max_running_requests,
            max_context=self.context_length,
        )
        self.attention_backend, self.backend = choose_attention_backend(
            config.attention_backend, self.pool, self.device
        )
        target = OpsTarget(self.device, self.dtype, triton=self.attention_backend == "triton")
        with torch.device(self.device):
            model = LlamaForCausalLM(hf, self.backend, target, max_position=self.context_length)
        model.load_weights(checkpoint.weights(torch.float32))
        self.model = model.to(self.dtype).eval()

    def _num_pages(self, config: EngineConfig, layers: int, kv_heads: int, head_dim: int) -> int:
        if config.max_total_tokens is not None:
            tokens = config.max_total_tokens
        else:
            bytes_per_token = 2 * layers * kv_heads * head_dim * self.dtype.itemsize
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = free * config.mem_fraction_static
            else:
                budget = config.kv_cache_gb * 2**30
            tokens = int(budget // bytes_per_token)
        return tokens // config.page_size + 1  # page 0 is reserved

    def build_batch(self, step: ScheduledStep, logits_indices: torch.Tensor) -> ForwardBatch:
        reqs, lens = step.reqs, step.extend_lens
        prefix = [r.kv.length for r in reqs]
        if all(n == 1 for n in lens):
            ids = [r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in reqs]
            positions = torch.tensor(prefix, dtype=torch.int64)
        else:
            seq = [p + n for p, n in zip(prefix, lens, strict=True)]
            ids = [t for r, p, s in zip(reqs, prefix, seq, strict=True) for t in r.fill_ids(p, s)]
            positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq, strict=True)])
        return ForwardBatch.build(
            ids,
            positions,
            step.out_cache_loc,
            self.pool.req_to_token,
            [r.kv.held_row for r in reqs],
            prefix,
            lens,
            logits_indices,
            self.device,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.backend.init_forward_metadata(batch)
        return self.model(batch)
