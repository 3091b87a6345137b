"""One Llama-family decoder driven by a HF config: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3.

Differences between the families are config switches: q/k/v bias (Qwen2), per-head q/k
RMSNorm (Qwen3), tied embeddings, RoPE scaling, GQA. q/k/v and gate/up projections are
fused into one matmul each; attention goes through the AttentionBackend seam. The model never
chooses kernels: its ops (runtime/layers/) are bound once, here, from an OpsTarget, and the
choice is logged. Weights the loader's plan keeps packed (`packed`: HF name -> qtype) live in
QuantLinear / QuantEmbedding layers; a fused projection is packed when all its parts are.

On a tensor-parallel rank (`shards`, runtime/distributed/parallel_layers.py) the layers hold
this rank's heads, intermediate rows and vocabulary rows; o_proj and down_proj are followed by
an all-reduce, the embedding sums the ranks' rows and the logits are gathered from them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.kernels.quant_formats import PackedWeight
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.distributed.group import TPGroup
from radixflow.runtime.distributed.parallel_layers import ModelShards
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.layers.activation import SiluAndMulImpl, choose_silu_and_mul
from radixflow.runtime.layers.decode_block import DecodeStack
from radixflow.runtime.layers.embedding import (
    QuantEmbedding,
    VocabParallelEmbedding,
    VocabParallelQuantEmbedding,
)
from radixflow.runtime.layers.linear import (
    Linear,
    LinearImpl,
    QuantLinear,
    QuantLinearImpl,
    choose_linear,
    choose_quant_linear,
)
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
    quant_linear: QuantLinearImpl

    @classmethod
    def choose(cls, target: OpsTarget) -> ModelOps:
        return cls(
            rms_norm=choose_rms_norm(target),
            rotary=choose_rotary(target),
            silu_and_mul=choose_silu_and_mul(target),
            linear=choose_linear(target),
            quant_linear=choose_quant_linear(target),
        )

    def describe(self) -> str:
        """One line naming each op's implementation, e.g. `rms_norm=cpu rotary=cpu ...`."""
        ops = (self.rms_norm, self.rotary, self.silu_and_mul, self.linear, self.quant_linear)
        names = ("rms_norm", "rotary", "silu_and_mul", "linear", "quant_linear")
        return " ".join(f"{n}={op.name}" for n, op in zip(names, ops, strict=True))


def projection(
    in_features: int,
    parts: list[tuple[str, int]],
    bias: bool,
    ops: ModelOps,
    packed: Mapping[str, str],
) -> Linear | QuantLinear:
    """A (fused) projection of `parts` = (HF weight name, output rows) in order: packed when
    the plan packs every part, float otherwise (packed parts are then dequantized at load)."""
    qtypes = [packed.get(name) for name, _ in parts]
    if all(qtypes):
        segments = [(rows, str(q)) for (_, rows), q in zip(parts, qtypes, strict=True)]
        return QuantLinear(in_features, segments, bias, ops.quant_linear)
    return Linear(in_features, sum(rows for _, rows in parts), bias, ops.linear)


class Attention(nn.Module):
    def __init__(
        self,
        config,
        layer_id: int,
        shards: ModelShards,
        backend: AttentionBackend,
        ops: ModelOps,
        packed: Mapping[str, str],
    ) -> None:
        super().__init__()
        self.num_heads = shards.num_heads
        self.num_kv_heads = shards.num_kv_heads
        self.head_dim = head_dim = shards.head_dim
        self.tp = shards.tp
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        name = f"model.layers.{layer_id}.self_attn.{{}}_proj.weight".format
        qkv = [(name("q"), self.q_size), (name("k"), self.kv_size), (name("v"), self.kv_size)]
        self.qkv_proj = projection(config.hidden_size, qkv, bias, ops, packed)
        self.o_proj = projection(self.q_size, [(name("o"), config.hidden_size)], False, ops, packed)
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
        return self.tp.all_reduce(self.o_proj(out))


class MLP(nn.Module):
    def __init__(
        self,
        hidden: int,
        layer_id: int,
        shards: ModelShards,
        ops: ModelOps,
        packed: Mapping[str, str],
    ) -> None:
        super().__init__()
        intermediate = shards.intermediate_size
        self.tp = shards.tp
        name = f"model.layers.{layer_id}.mlp.{{}}_proj.weight".format
        gate_up = [(name("gate"), intermediate), (name("up"), intermediate)]
        self.gate_up_proj = projection(hidden, gate_up, False, ops, packed)
        self.down_proj = projection(intermediate, [(name("down"), hidden)], False, ops, packed)
        self.act = ops.silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.act.fn(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config,
        layer_id: int,
        shards: ModelShards,
        backend: AttentionBackend,
        ops: ModelOps,
        packed: Mapping[str, str],
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, ops.rms_norm)
        self.self_attn = Attention(config, layer_id, shards, backend, ops, packed)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, ops.rms_norm)
        self.mlp = MLP(config.hidden_size, layer_id, shards, ops, packed)

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
    `packed` (HF weight name -> qtype, from `Checkpoint.quant_plan`, on a tensor-parallel rank
    passed through `ModelShards.quant_plan`) names the weights kept packed; `shards` is this
    rank's part of the model (None: the whole model, no collectives).
    """

    def __init__(
        self,
        config,
        backend: AttentionBackend,
        target: OpsTarget,
        max_position: int,
        packed: Mapping[str, str] | None = None,
        shards: ModelShards | None = None,
    ) -> None:
        super().__init__()
        archs = getattr(config, "architectures", None) or ["LlamaForCausalLM"]
        if archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs[0]!r}; supported: {SUPPORTED_ARCHITECTURES}"
            )
        self.config = config
        self.shards = shards = shards or ModelShards.of(config, TPGroup.single())
        self.tp = shards.tp
        self.head_dim = head_dim = shards.head_dim
        packed = packed or {}
        self.ops = ModelOps.choose(target)
        logger.info("ops for %s: %s", target.describe(), self.ops.describe())
        hidden, vocab = config.hidden_size, shards.vocab_rows
        self.embed_tokens = self._embedding(
            hidden, packed.get("model.embed_tokens.weight"), target.dtype
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, shards, backend, self.ops, packed)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps, self.ops.rms_norm)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head: nn.Linear | QuantLinear = (
                projection(hidden, [("lm_head.weight", vocab)], False, self.ops, packed)
                if "lm_head.weight" in packed
                else nn.Linear(hidden, vocab, bias=False)
            )
        self.rotary = RotaryEmbedding(
            RopeSpec.from_config(config, head_dim), head_dim, max_position, self.ops.rotary
        )
        self.decode_stack = DecodeStack(self.layers, backend, self.rotary, target)

    def _embedding(
        self, hidden: int, qtype: str | None, dtype: torch.dtype
    ) -> nn.Embedding | QuantEmbedding:
        """The token embedding: this rank's vocabulary rows on a tensor-parallel rank."""
        rows, impl, tp = self.shards.vocab_rows, self.ops.quant_linear, self.tp
        if tp.size > 1 and qtype:
            return VocabParallelQuantEmbedding(
                rows, hidden, qtype, dtype, impl, self.shards.vocab, tp
            )
        if tp.size > 1:
            return VocabParallelEmbedding(rows, hidden, self.shards.vocab, tp)
        return (
            QuantEmbedding(rows, hidden, qtype, dtype, impl)
            if qtype
            else nn.Embedding(rows, hidden)
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] -> logits [T, vocab] through lm_head (or the tied
        embedding), in the model's dtype; on a tensor-parallel rank gathered from the ranks'
        vocabulary slices, the padded tail cut off."""
        head = self.embed_tokens if self.tie_word_embeddings else self.lm_head
        if isinstance(head, QuantEmbedding):
            logits = head.linear(x)
        elif isinstance(head, QuantLinear):
            logits = head(x)
        else:
            logits = self.ops.linear.fn(x, head.weight, None)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits, dim=-1)[:, : self.config.vocab_size]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        fused = self.decode_stack.applies(batch)  # runtime/layers/decode_block.py
        if fused:
            x, residual = self.decode_stack.forward(x, batch)
        else:
            rotate = self.rotary.rotation(batch.positions, x.dtype)
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual, rotate, batch)
        rows = batch.logits_indices
        x, _ = self.norm.add_forward(x.index_select(0, rows), residual.index_select(0, rows))
        logits = self.logits(x).float()
        if fused:
            self.decode_stack.warm()
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | PackedWeight]]) -> None:
        """Copy HF-named weights in, fusing q/k/v and gate/up; every parameter must be set.
        Packed weights go into packed layers as they are (then interleaved where the kernels
        read them faster so), into float layers dequantized."""
        params = self._weight_targets()
        loaded: set[str] = set()
        for name, value in weights:
            if "rotary_emb" in name:
                continue
            target, row_offset = self._fused_target(name, params)
            if target is None:
                if name == "lm_head.weight" and self.tie_word_embeddings:
                    continue
                raise ValueError(f"checkpoint has unexpected weight {name!r}")
            param = params[target]
            if isinstance(param, QuantLinear):
                if not isinstance(value, PackedWeight):
                    raise ValueError(f"weight {name!r} is a float tensor but its layer is packed")
                param.load(value, row_offset)
                loaded.add(name)
                continue
            tensor = value.dequantize() if isinstance(value, PackedWeight) else value
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
        for module in self.modules():
            if isinstance(module, QuantLinear):
                module.interleave_rows()

    def _weight_targets(self) -> dict[str, nn.Parameter | QuantLinear]:
        """Our weight names -> their float parameter or packed layer (`<layer>.weight`)."""
        targets: dict[str, nn.Parameter | QuantLinear] = dict(self.named_parameters())
        for module_name, module in self.named_modules():
            if isinstance(module, QuantLinear):
                targets[f"{module_name}.weight"] = module
        return targets

    def _fused_target(
        self, name: str, params: Mapping[str, nn.Parameter | QuantLinear]
    ) -> tuple[str | None, int | None]:
        """Map a HF weight name to (our parameter, row offset into a fused parameter)."""
        stem = name.removeprefix("model.")
        for part in ("q_proj", "k_proj", "v_proj"):
            if f".self_attn.{part}." in stem:
                attn = self.layers[0].self_attn
                offset = {"q_proj": 0, "k_proj": attn.q_size, "v_proj": attn.q_size + attn.kv_size}
                return stem.replace(part, "qkv_proj"), offset[part]
        for part, offset in (("gate_proj", 0), ("up_proj", self.shards.intermediate_size)):
            if f".mlp.{part}." in stem:
                return stem.replace(part, "gate_up_proj"), offset
        # a rank's vocabulary slice fills the first rows of its (padded) embedding / lm_head
        vocab_offset = 0 if self.tp.size > 1 else None
        if name == "lm_head.weight":
            return (None if self.tie_word_embeddings else "lm_head.weight"), vocab_offset
        if name == "model.embed_tokens.weight":
            return stem, vocab_offset
        if stem in params:
            return stem, None
        return None, None

    def _expected_names(self) -> set[str]:
        names = set()
        for pname in self._weight_targets():
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
