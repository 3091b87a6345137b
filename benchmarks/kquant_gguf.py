"""Write a GGUF with a Q4_K_M file's tensor types at a 1B llama's shapes, for
`benchmarks/cpu_peer.py --gguf`: the weights are random (decode speed depends on their format
and shapes, not their values), the tokenizer and chat template are the default model's.

    python benchmarks/kquant_gguf.py [--out build/kquant-1b.gguf] [--layers 16]
    python benchmarks/cpu_peer.py --gguf build/kquant-1b.gguf --concurrency 16 \\
        --radixflow-flags "--quantization auto --quant-activations int8"

Types as llama.cpp's Q4_K_M recipe: q, k, o, gate and up in Q4_K; v and down in Q6_K in the
first and last eighth of the layers and every third layer between, else Q4_K; the tied token
embedding (the output) in Q6_K; norms in F32. Shapes as Llama-3.2-1B's (hidden 2048, 32 heads
of 64, 8 KV heads, intermediate 8192), with the default model's 49152-token vocabulary.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from radixflow.runtime.model_loader import default_model_path

Q = gguf.GGMLQuantizationType
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 2048, 32, 8, 64, 8192
# keys this file sets itself; every other key (general.*, tokenizer.*) comes from the default model
OWN_KEYS = ("GGUF.", "llama.", "general.architecture", "general.file_type")


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers whose v and down get Q6_K."""
    eighth = layers // 8
    return layer < eighth or layer >= layers - eighth or (layer - eighth) % 3 == 2


def random_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with small finite fp16 scales: uint8 [rows, row bytes]."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    scales = rng.uniform(0.0002, 0.001, size=(data.shape[0], 2)).astype(np.float16)
    if qtype == Q.Q6_K:  # ql, qh, int8 scales, then d
        data[:, -2:] = scales[:, :1].view(np.uint8)
    else:  # Q4_K: d, dmin, ...
        data[:, :4] = scales.view(np.uint8)
    return data.reshape(rows, -1)


def write(out: Path, layers: int, seed: int) -> None:
    source = gguf.GGUFReader(default_model_path())
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(out, "llama")
    for name, field in source.fields.items():
        if not name.startswith(OWN_KEYS):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_block_count(layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(seed)
    ones = np.ones(HIDDEN, dtype=np.float32)
    writer.add_tensor(
        "token_embd.weight", random_blocks(vocab, HIDDEN, Q.Q6_K, rng), raw_dtype=Q.Q6_K
    )
    writer.add_tensor("output_norm.weight", ones)
    for i in range(layers):
        wide = Q.Q6_K if more_bits(i, layers) else Q.Q4_K
        shapes = {
            "attn_q": (HEADS * HEAD_DIM, HIDDEN, Q.Q4_K),
            "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN, Q.Q4_K),
            "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN, wide),
            "attn_output": (HIDDEN, HEADS * HEAD_DIM, Q.Q4_K),
            "ffn_gate": (INTERMEDIATE, HIDDEN, Q.Q4_K),
            "ffn_up": (INTERMEDIATE, HIDDEN, Q.Q4_K),
            "ffn_down": (HIDDEN, INTERMEDIATE, wide),
        }
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        for part, (rows, cols, qtype) in shapes.items():
            data = random_blocks(rows, cols, qtype, rng)
            writer.add_tensor(f"blk.{i}.{part}.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "build" / "kquant-1b.gguf"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(args.out, args.layers, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
