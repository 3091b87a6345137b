"""One Llama-family decoder driven by a HF config: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3.

Differences between the families are config switches: q/k/v bias (Qwen2), per-head q/k
RMSNorm (Qwen3), tied embeddings, RoPE scaling, GQA. q/k/v and gate/up projections are
fused into one matmul each; attention goes through the AttentionBackend seam. The model never
chooses kernels: its ops (runtime/layers/) are bound once, here, from an OpsTarget, and the
choice is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.layers.activation import SiluAndMulImpl, choose_silu_and_mul
from radixflow.runtime.layers.linear import Linear, LinearImpl, choose_linear
from radixflow.runtime.layers.norm import RMSNorm, RMSNormImpl, choose_rms_norm
from radixflow.runtime.layers.rotary import (
    RopeSpec,
    RotaryEmbedding,
    RotaryImpl,
    Rotate,
    choose_rotary,
)
from radixflow.runtime.layers.target import OpsTarget

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class ModelOps:
    """The implementations the model's ops are bound to, chosen once from the target."""

    rms_norm: RMSNormImpl
    rotary: RotaryImpl
    silu_and_mul: SiluAndMulImpl
    linear: LinearImpl

    @classmethod
    def choose(cls, target: OpsTarget) -> ModelOps:
        return cls(
            rms_norm=choose_rms_norm(target),
            rotary=choose_rotary(target),
            silu_and_mul=choose_silu_and_mul(target),
            linear=choose_linear(target),
        )

    def describe(self) -> str:
        """One line naming each op's implementation, e.g. `rms_norm=cpu rotary=cpu ...`."""
        ops = (self.rms_norm, self.rotary, self.silu_and_mul, self.linear)
        names = ("rms_norm", "rotary", "silu_and_mul", "linear")
        return " ".join(f"{n}={op.name}" for n, op in zip(names, ops, strict=True))


class Attention(nn.Module):
    def __init__(
        self, config, layer_id: int, head_dim: int, backend: AttentionBackend, ops: ModelOps
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias, ops.linear)
        self.o_proj = Linear(self.q_size, config.hidden_size, False, ops.linear)
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, ops.rms_norm)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, ops.rms_norm)
        window = getattr(config, "sliding_window", None)
        use_window = window and getattr(config, "use_sliding_window", True)
        self.spec = AttentionLayerSpec(
            layer_id=layer_id,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=head_dim,
            scaling=head_dim**-0.5,
            sliding_window=int(window) if use_window else -1,
        )
        self.backend = backend

    def forward(self, x: torch.Tensor, rotate: Rotate, batch: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = rotate(q, k)
        out = self.backend.forward(
            q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, self.spec, batch
        )
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, ops: ModelOps) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, False, ops.linear)
        self.down_proj = Linear(intermediate, hidden, False, ops.linear)
        self.act = ops.silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act.fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(
        self, config, layer_id: int, head_dim: int, backend: AttentionBackend, ops: ModelOps
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, ops.rms_norm)
        self.self_attn = Attention(config, layer_id, head_dim, backend, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, ops.rms_norm)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, ops)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rotate: Rotate, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output; residual: the stream before it was added (None
        in the first layer, where x is the embedding). Returns the MLP output and the stream
        without it: the residual add is fused into the next norm."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, rotate, batch)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    """Decoder-only transformer; `forward` returns float32 logits for `batch.logits_indices`.

    Build it under `torch.device(target.device)`: the RoPE table is made on the default device.
    """

    def __init__(
        self, config, backend: AttentionBackend, target: OpsTarget, max_position: int
    ) -> None:
        super().__init__()
        archs = getattr(config, "architectures", None) or ["LlamaForCausalLM"]
        if archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs[0]!r}; supported: {SUPPORTED_ARCHITECTURES}"
            )
        self.config = config
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.head_dim = head_dim
        self.ops = ModelOps.choose(target)
        logger.info("ops for %s %s: %s", target.device, target.dtype, self.ops.describe())
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, head_dim, backend, self.ops)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.ops.rms_norm)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(
            RopeSpec.from_config(config, head_dim), head_dim, max_position, self.ops.rotary
        )

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        rotate = self.rotary.rotation(batch.positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rotate, batch)
        rows = batch.logits_indices
        x, _ = self.norm.add_forward(x.index_select(0, rows), residual.index_select(0, rows))
        return self.ops.linear.fn(x, self.output_weight, None).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up; every parameter must be set."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            target, row_offset = self._fused_target(name, params)
            if target is None:
                if name == "lm_head.weight" and self.tie_word_embeddings:
                    continue
                raise ValueError(f"checkpoint has unexpected weight {name!r}")
            param = params[target]
            with torch.no_grad():
                if row_offset is None:
                    if param.shape != tensor.shape:
                        raise ValueError(
                            f"weight {name!r} has shape {tuple(tensor.shape)}, "
                            f"expected {tuple(param.shape)}"
                        )
                    param.copy_(tensor)
                else:
                    param[row_offset : row_offset + tensor.shape[0]].copy_(tensor)
            loaded.add(name)
        missing = self._expected_names() - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:8]}")

    def _fused_target(
        self, name: str, params: dict[str, nn.Parameter]
    ) -> tuple[str | None, int | None]:
        """Map a HF weight name to (our parameter, row offset into a fused parameter)."""
        stem = name.removeprefix("model.")
        for part in ("q_proj", "k_proj", "v_proj"):
            if f".self_attn.{part}." in stem:
                attn = self.layers[0].self_attn
                offset = {"q_proj": 0, "k_proj": attn.q_size, "v_proj": attn.q_size + attn.kv_size}
                return stem.replace(part, "qkv_proj"), offset[part]
        for part, offset in (("gate_proj", 0), ("up_proj", self.config.intermediate_size)):
            if f".mlp.{part}." in stem:
                return stem.replace(part, "gate_up_proj"), offset
        if name == "lm_head.weight":
            return (None if self.tie_word_embeddings else "lm_head.weight"), None
        if stem in params:
            return stem, None
        return None, None

    def _expected_names(self) -> set[str]:
        names = set()
        for pname, _ in self.named_parameters():
            if pname == "lm_head.weight":
                names.add(pname)
                continue
            full = "model." + pname
            if ".qkv_proj." in pname:
                for part in ("q_proj", "k_proj", "v_proj"):
                    names.add(full.replace("qkv_proj", part))
            elif ".gate_up_proj." in pname:
                for part in ("gate_proj", "up_proj"):
                    names.add(full.replace("gate_up_proj", part))
            else:
                names.add(full)
        return names
