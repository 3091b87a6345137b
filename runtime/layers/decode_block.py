"""The decode step's layer stack on the CPU through the fused sublayer ops
(kernels/decode_layer.py): two compiled calls per layer instead of a dozen small ops, each
through Python, the dispatcher and its own thread fork/join.

A batch of at most `MAX_ROWS` requests adding one token each runs here; everything else
(prefill, larger batches, CUDA, other dtypes, attention backends other than the CPU paged one)
keeps the model's layer-by-layer path, and a model that cannot use the fused ops at all says
why once, when it is built. On a tensor-parallel rank the layers hold this rank's heads and
rows, and each sublayer's output is all-reduced here, as the unfused layers do.

    for each layer:  a = attention_block(x, residual)   [all-reduce]   (residual += x inside)
                     x = mlp_block(a, residual)         [all-reduce]   (residual += a inside)

Without tensor parallelism the whole loop is one call (kernels/decode_layer.py `DecodeLayers`);
a rank calls the two sublayer ops per layer, all-reducing between them.

The sublayer weights are gathered once, at the first fused step (after the weights loaded).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.kernels import decode_layer
from radixflow.kernels.decode_layer import AttentionWeights, MlpWeights, PagedKV, Projection
from radixflow.runtime.attention.sdpa_backend import TorchPagedBackend
from radixflow.runtime.distributed.group import TPGroup
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.layers.linear import Linear, QuantLinear
from radixflow.runtime.layers.target import OpsTarget

logger = logging.getLogger(__name__)

MAX_ROWS = decode_layer.MAX_ROWS


def projection_of(layer: nn.Module) -> Projection:
    """The weight segments of a (fused) projection layer, float or packed."""
    if isinstance(layer, QuantLinear):
        weights = tuple(layer.packed(i) for i in range(len(layer.segments)))
        return Projection(weights, tuple(q for q, _, _ in layer.segments), layer.bias)
    if isinstance(layer, Linear):
        return Projection((layer.weight,), ("",), layer.bias)
    raise TypeError(f"no fused decode path for a {type(layer).__name__} projection")


@dataclass(frozen=True)
class _Layer:
    attention: AttentionWeights
    mlp: MlpWeights
    layer_id: int
    tp: TPGroup  # read once here: nn.Module attribute lookups cost ~1 us each, per layer and step


class DecodeStack:
    """The model's decoder layers as fused decode ops; `applies(batch)` says when to use it.
    `enabled = False` keeps every batch on the layer-by-layer path (tests and
    benchmarks/decode_speed.py compare the two)."""

    def __init__(
        self, layers: Sequence[nn.Module], backend: object, rotary: object, target: OpsTarget
    ) -> None:
        self.layers = layers
        self.backend = backend
        self.rotary = rotary
        self._bound: list[_Layer] | None = None
        self._native: decode_layer.DecodeLayers | None = None  # one call per step (tp = 1)
        self.enabled = True
        self.reason = self._unusable(target)
        if self.reason:
            logger.info("fused CPU decode layers off: %s", self.reason)
        else:
            logger.info("fused CPU decode layers on for decode batches of up to %d", MAX_ROWS)

    def _unusable(self, target: OpsTarget) -> str:
        """Why the fused ops cannot run this model ("" when they can)."""
        if not target.cpu_kernels:
            return f"the CPU kernels do not apply ({target.describe()})"
        if not isinstance(self.backend, TorchPagedBackend) or not self.backend.uses_kernel:
            return "the attention backend is not the CPU paged kernel"
        return ""

    def applies(self, batch: ForwardBatch) -> bool:
        return (
            self.enabled
            and not self.reason
            and batch.mode is ForwardMode.DECODE
            and batch.batch_size <= MAX_ROWS
            and not torch.is_grad_enabled()
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings x [B, hidden] through every layer: (last MLP output, the residual stream
        without it), as the layer-by-layer loop returns them."""
        layers = self._bound if self._bound is not None else self._bind()
        pool = self.backend.pool
        cache = self.rotary.cos_sin_cache
        cos_sin = cache.index_select(0, batch.positions).to(x.dtype)
        x = x.contiguous()
        if self._native is not None:
            return self._native.forward(
                x, cos_sin, pool.k_buffers, pool.v_buffers, batch.out_cache_loc,
                batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
            )  # fmt: skip
        residual: torch.Tensor | None = None
        for layer in layers:
            kv = PagedKV(
                pool.k_buffers[layer.layer_id],
                pool.v_buffers[layer.layer_id],
                batch.out_cache_loc,
                batch.req_to_token,
                batch.req_pool_indices,
                batch.seq_lens,
            )
            attn = decode_layer.decode_attention_block(x, residual, layer.attention, cos_sin, kv)
            if residual is None:
                residual = x
            attn = layer.tp.all_reduce(attn)
            x = layer.tp.all_reduce(decode_layer.decode_mlp_block(attn, residual, layer.mlp))
        assert residual is not None  # the model has at least one layer
        return x, residual

    def warm(self) -> None:
        """After a fused step's logits: have a helper thread pull the first layer's weights
        towards the caches while this thread samples and does the engine's bookkeeping."""
        if self._native is not None:
            self._native.warm_first()

    def _bind(self) -> list[_Layer]:
        self._bound = [_bind_layer(module) for module in self.layers]
        if all(layer.tp.size == 1 for layer in self._bound):
            self._native = decode_layer.DecodeLayers(
                [(layer.attention, layer.mlp, layer.layer_id) for layer in self._bound]
            )
        return self._bound


def _int8_activations(*layers: nn.Module) -> bool:
    """Whether the layers' quantized kernel rounds x to int8 (the fused ops then do too)."""
    return any(isinstance(m, QuantLinear) and m.impl.int8_activations for m in layers)


def _bind_layer(module: nn.Module) -> _Layer:
    attn, mlp = module.self_attn, module.mlp
    spec = attn.spec
    norm = module.input_layernorm
    attention = AttentionWeights(
        norm=norm.weight,
        eps=norm.eps,
        qkv=projection_of(attn.qkv_proj),
        o=projection_of(attn.o_proj),
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
        scale=spec.scaling,
        q_norm=attn.q_norm.weight if attn.qk_norm else None,
        k_norm=attn.k_norm.weight if attn.qk_norm else None,
        logit_cap=spec.logit_cap,
        sliding_window=spec.sliding_window,
        int8_activations=_int8_activations(attn.qkv_proj, attn.o_proj),
    )
    post = module.post_attention_layernorm
    mlp_weights = MlpWeights(
        post.weight,
        post.eps,
        projection_of(mlp.gate_up_proj),
        projection_of(mlp.down_proj),
        int8_activations=_int8_activations(mlp.gate_up_proj, mlp.down_proj),
    )
    return _Layer(attention, mlp_weights, spec.layer_id, attn.tp)
