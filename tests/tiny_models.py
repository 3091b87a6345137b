"""Tiny seeded random models (saved as HF folders with a small byte-level BPE tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from radixflow.kernels.quant_formats import interleaved_qtype
from radixflow.runtime.layers.linear import QuantLinear

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "radixflow", "fast": true, "count": 42}',
    "Once upon a time there was a small model that generated text token by token.",
]


def stored_qtype(layer: QuantLinear, qtype: str) -> str:
    """The qtype a loaded packed layer keeps `qtype` rows as: interleaved by 16 rows where its
    impl reads them so (the CPU kernels: every plain type of quant_formats.INTERLEAVED), else
    `qtype`."""
    return interleaved_qtype(qtype) if qtype in layer.impl.interleaved else qtype


def word_level_tokenizer(pieces: list[bytes]) -> transformers.PreTrainedTokenizerFast:
    """A tokenizer whose tokens are exactly `pieces` (byte-level BPE strings; repeats kept
    once) and an EOS, token 0."""
    from radixflow.grammars.tokenizer_index import _byte_to_unicode

    b2u = _byte_to_unicode()
    vocab = {"<eos>": 0}
    for piece in pieces:
        vocab.setdefault("".join(b2u[b] for b in piece), len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tk.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def tiny_tokenizer(vocab_size: int = 320) -> transformers.PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    )


def tiny_config(arch: str, vocab_size: int, **overrides):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked logits, so greedy choices are not near-ties
    )
    common.update(overrides)
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    if arch == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **common)
    raise ValueError(arch)


def make_tiny_model_dir(path: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a random `arch` model and tokenizer to `path`; returns it."""
    tokenizer = tiny_tokenizer()
    config = tiny_config(arch, overrides.pop("vocab_size", len(tokenizer)), **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
