"""One Llama-family decoder driven by a HF config: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3.

Differences between the families are config switches: q/k/v bias (Qwen2), per-head q/k
RMSNorm (Qwen3), tied embeddings, RoPE scaling, GQA. q/k/v and gate/up projections are
fused into one matmul each; attention goes through the AttentionBackend seam. On the CPU,
RMSNorm (with the residual add before it fused in), SiLU-and-mul and rotary run as compiled
kernels (kernels/cpu_elementwise.py) where they apply; on CUDA, norm and rotary use Triton.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels import cpu_elementwise
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.models.linear import Linear, linear
from radixflow.runtime.models.rope import RopeSpec, apply_rotary_neox

# (q, k) -> rotated (q, k), built once per forward for the batch's positions
Rotate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.use_triton = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_triton:
            from radixflow.kernels.norm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        if x.dim() == 2 and x.stride(-1) == 1 and cpu_elementwise.applies(x, self.weight):
            return cpu_elementwise.rms_norm(x, self.weight, self.eps)
        # torch's fused kernel accumulates in float32 for low-precision inputs, as HF does.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); on the CPU kernel path in one pass, the sum
        written over `residual`."""
        if (
            not self.use_triton
            and x.dim() == 2
            and x.stride(-1) == 1
            and residual.stride(-1) == 1
            and cpu_elementwise.applies(x, residual, self.weight)
        ):
            return cpu_elementwise.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self(residual), residual


class Attention(nn.Module):
    def __init__(self, config, layer_id: int, head_dim: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
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
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if gate_up.dim() == 2 and cpu_elementwise.applies(gate_up):
            return self.down_proj(cpu_elementwise.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, head_dim: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_id, head_dim, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

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
    """Decoder-only transformer; `forward` returns float32 logits for `batch.logits_indices`."""

    def __init__(self, config, backend: AttentionBackend, max_position: int) -> None:
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
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, head_dim, backend) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RopeSpec.from_config(config, head_dim)
        self.triton_kernels = False
        self.register_buffer(
            "cos_sin_cache", self.rope.cos_sin_cache(max_position), persistent=False
        )

    def use_triton_kernels(self, enabled: bool) -> None:
        """Run RMSNorm and rotary through the Triton kernels (the CUDA path)."""
        self.triton_kernels = enabled
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.use_triton = enabled

    def _rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotate:
        if self.triton_kernels:
            from radixflow.kernels.rotary import rotary_embedding

            def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, True)

            return rotate
        # Rotation in the activation dtype, as HF does.
        cos_sin = self.cos_sin_cache.index_select(0, positions).to(dtype)
        dim = self.rope.rotary_dim

        def rotate_in_place(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (
                cpu_elementwise.rotary_neox_(q, cos_sin, dim),
                cpu_elementwise.rotary_neox_(k, cos_sin, dim),
            )

        if cpu_elementwise.applies(cos_sin):
            return rotate_in_place

        def rotate_ref(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return apply_rotary_neox(cos_sin, q, dim), apply_rotary_neox(cos_sin, k, dim)

        return rotate_ref

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        rotate = self._rotation(batch.positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rotate, batch)
        rows = batch.logits_indices
        x, _ = self.norm.add_forward(x.index_select(0, rows), residual.index_select(0, rows))
        return linear(x, self.output_weight).float()

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
