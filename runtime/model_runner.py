"""Owns the model, its KV pool and attention backend; turns a ScheduledStep into logits."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from radixflow.kernels import cpu_build
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.distributed.group import TPGroup
from radixflow.runtime.distributed.parallel_layers import ModelShards
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.layers.attention import choose_attention_backend
from radixflow.runtime.layers.target import OpsTarget
from radixflow.runtime.memory_plan import KVPlan, available_memory, module_bytes, plan_kv_pool
from radixflow.runtime.model_loader import Checkpoint
from radixflow.runtime.models.llama import LlamaForCausalLM
from radixflow.runtime.scheduler import ScheduledStep

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, packed_weights: bool = False) -> torch.dtype:
    """`auto` on the CPU: float32 for packed (quantized) weights, whose kernels read the packed
    bytes and sum in float32 whatever the activations' dtype (bfloat16 would only lose
    accuracy); else bfloat16 where its matmuls beat float32 (kernels/cpu_build.py
    `FAST_BF16`: AVX512-BF16, AMX, Arm bf16), else float32."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if packed_weights:
        return torch.float32
    return torch.bfloat16 if cpu_build.fast_bf16() else torch.float32


class SkipRandomInit(TorchFunctionMode):
    """nn.Linear / nn.Embedding skip their random initialisation: the checkpoint sets every
    parameter next (`load_weights` checks), and the fills would write the whole model in
    float32. A torch function mode, so it holds in this thread only (unlike patching
    torch.nn.init)."""

    FILLS = frozenset(
        {torch.nn.init.kaiming_uniform_, torch.nn.init.uniform_, torch.nn.init.normal_}
    )

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in self.FILLS:
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


class ModelRunner:
    """The model, its KV pool and attention backend; on a tensor-parallel rank (`tp` of more
    than one rank) this rank's shard of them (runtime/distributed/parallel_layers.py): its
    heads, rows and vocabulary slice read from the checkpoint, and its KV heads in the pool.

    Every rank's pool gets the same number of pages (the smallest any rank planned: rank 0's
    cache manager hands out the slots all ranks write), agreed by one collective at the end of
    `__init__`, which every rank reaches even when its own build failed (it then re-raises), so
    a failure never leaves the other ranks waiting."""

    def __init__(
        self, config: EngineConfig, checkpoint: Checkpoint, tp: TPGroup | None = None
    ) -> None:
        self.tp = tp or TPGroup.single()
        self.device = resolve_device(config.device)
        try:
            kv_plan = self._build(config, checkpoint)
        except Exception:
            self.tp.min_over_ranks(0, self.device)
            raise
        self.kv_plan = self._agree(kv_plan)
        logger.info(
            "KV pool: %d tokens (%.2f GiB%s), set by %s",
            self.kv_plan.tokens,
            self.kv_plan.gib,
            ", taken from RAM as tokens fill it" if self.device.type == "cpu" else "",
            self.kv_plan.reason,
        )
        self.pool.allocate(self.kv_plan.num_pages)

    def _build(self, config: EngineConfig, checkpoint: Checkpoint) -> KVPlan:
        """Build the model and the (unallocated) pool, load the weights; the pool's plan."""
        self.dtype = resolve_dtype(
            config.dtype, self.device, checkpoint.keeps_packed(config.quantization)
        )
        hf = checkpoint.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        model_max = getattr(hf, "max_position_embeddings", None) or 4096
        if config.context_length is not None and config.context_length > model_max:
            raise ValueError(
                f"context_length {config.context_length} exceeds the model's {model_max}"
            )
        self.context_length = config.context_length or model_max
        self.shards = ModelShards.of(hf, self.tp)
        # measured before the weights load: mem_fraction_static covers weights + KV pool
        available = None if config.max_total_tokens is not None else available_memory(self.device)
        self.pool = KVPool(  # its K/V buffers are sized once the weights are loaded
            num_layers=hf.num_hidden_layers,
            page_size=config.page_size,
            num_kv_heads=self.shards.num_kv_heads,
            head_dim=self.shards.head_dim,
            dtype=self.dtype,
            device=self.device,
            max_reqs=config.max_running_requests,
            max_context=self.context_length,
        )
        self.attention_backend, self.backend = choose_attention_backend(
            config.attention_backend, self.pool, self.device
        )
        target = OpsTarget(
            self.device,
            self.dtype,
            triton=self.attention_backend == "triton",
            int8_activations=config.quant_activations == "int8",
        )
        packed = self.shards.quant_plan(checkpoint.quant_plan(config.quantization, target))
        # Large empty tensors take no RAM until written: built without its random init and cast
        # before loading, the model is written once, in its dtype, weight by weight.
        with torch.device(self.device), SkipRandomInit():
            model = LlamaForCausalLM(
                hf,
                self.backend,
                target,
                max_position=self.context_length,
                packed=packed,
                shards=self.shards,
            )
        self.model = model.to(self.dtype).eval()
        slicing = self.shards.weight_slice if self.tp.size > 1 else None
        self.model.load_weights(checkpoint.weights(self.dtype, packed, slicing))
        return plan_kv_pool(
            bytes_per_token=self.pool.bytes_per_token(),
            page_size=config.page_size,
            context_length=self.context_length,
            max_running_requests=config.max_running_requests,
            mem_fraction_static=config.mem_fraction_static,
            available=available,
            weight_bytes=module_bytes(self.model),
            max_total_tokens=config.max_total_tokens,
        )

    def _agree(self, plan: KVPlan) -> KVPlan:
        """`plan` cut to the smallest pool any rank planned (0 from a rank that failed)."""
        tokens = self.tp.min_over_ranks(plan.tokens, self.device)
        if tokens == 0:
            raise RuntimeError("another tensor-parallel rank failed to build its model")
        if tokens == plan.tokens:
            return plan
        reason = f"{plan.reason}; the smallest of the {self.tp.size} tensor-parallel ranks' pools"
        return dataclasses.replace(plan, tokens=tokens, reason=reason)

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
        if not self.model.decode_stack.applies(batch):  # the fused layers read the batch itself
            self.backend.init_forward_metadata(batch)
        return self.model(batch)
