"""Tensor-parallel model: each rank's shard of the layers and weights, and the logits of two
gloo ranks (processes) equal to the one-device model's, for Llama (GQA), Qwen2 (bias), Qwen3
(q/k norm), replicated KV heads, q8_0 quantized at load (tied, padded vocabulary) and a GGUF's
q8_0 blocks (a row-parallel slice off the block boundaries, dequantized at load)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file
from test_model_loader import random_model, write_gguf
from tiny_models import make_tiny_model_dir

from radixflow.kernels.quant_formats import PackedWeight, dequantize, quantize
from radixflow.runtime import gguf_convert, model_loader
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.distributed.group import TPGroup, exit_rank_process, init_tp_group
from radixflow.runtime.distributed.parallel_layers import ModelShards, WeightSlice
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.gguf_convert import PACKED_METADATA_KEY
from radixflow.runtime.layers.linear import QuantLinear
from radixflow.runtime.model_loader import iter_weights, load_checkpoint
from radixflow.runtime.model_runner import ModelRunner

PROMPTS = [[5, 9, 17, 33, 2, 8, 40], [40, 41, 42]]
DECODE = [[7, 11], [13, 3], [60, 61]]  # the tokens fed in each decode step


def tp(rank: int, size: int = 2) -> TPGroup:
    """A rank's group for building and loading only (no process group: no collectives)."""
    return TPGroup(rank=rank, size=size)


def config(path: Path, **kwargs) -> EngineConfig:
    kwargs.setdefault("max_total_tokens", 256)
    return EngineConfig(model_path=str(path), device="cpu", dtype="float32", **kwargs)


def drive(runner: ModelRunner) -> list[torch.Tensor]:
    """Logits of a prefill of PROMPTS (every token) and of len(DECODE) decode steps."""
    pool = runner.pool
    rows = [pool.alloc_row() for _ in PROMPTS]
    slots = []
    for row, prompt in zip(rows, PROMPTS, strict=True):
        total = len(prompt) + len(DECODE)
        pages = pool.alloc_pages(math.ceil(total / pool.page_size))
        slots.append(pool.slots_of_pages(pages)[:total])
        pool.req_to_token[row, :total] = slots[-1].int()
    lens = [len(p) for p in PROMPTS]
    ids = [t for p in PROMPTS for t in p]
    batch = ForwardBatch.build(
        ids,
        torch.cat([torch.arange(n) for n in lens]),
        torch.cat([s[:n] for s, n in zip(slots, lens, strict=True)]),
        pool.req_to_token,
        rows,
        [0] * len(PROMPTS),
        lens,
        torch.arange(len(ids)),
        runner.device,
    )
    out = [runner.forward(batch)]
    for step, tokens in enumerate(DECODE):
        at = [n + step for n in lens]
        batch = ForwardBatch.build(
            tokens,
            torch.tensor(at),
            torch.stack([s[i] for s, i in zip(slots, at, strict=True)]),
            pool.req_to_token,
            rows,
            at,
            [1] * len(PROMPTS),
            torch.arange(len(PROMPTS)),
            runner.device,
        )
        out.append(runner.forward(batch))
    return out


# -- the split, in one process ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("heads", "kv_heads", "size", "expected"),
    [
        (4, 2, 2, [(0, 1), (1, 2)]),  # KV heads split
        (4, 1, 2, [(0, 1), (0, 1)]),  # one KV head, replicated
        (8, 2, 4, [(0, 1), (0, 1), (1, 2), (1, 2)]),  # each rank's q heads read one KV head
    ],
)
def test_kv_heads_split_or_replicated(heads, kv_heads, size, expected):
    cfg = make_config(num_attention_heads=heads, num_key_value_heads=kv_heads)
    got = [ModelShards.of(cfg, tp(r, size)).kv_heads for r in range(size)]
    assert got == expected
    for r in range(size):  # the KV heads a rank's q heads read are the rank's own
        shards = ModelShards.of(cfg, tp(r, size))
        read = {h // (heads // kv_heads) for h in range(*shards.heads)}
        assert read <= set(range(*shards.kv_heads))


@pytest.mark.parametrize(
    ("overrides", "size", "message"),
    [
        ({"num_attention_heads": 4, "num_key_value_heads": 4}, 3, "num_attention_heads 4"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "num_key_value_heads 3"),
        ({"num_attention_heads": 4, "intermediate_size": 130}, 4, "intermediate_size 130"),
    ],
)
def test_a_dimension_that_does_not_split_is_named(overrides, size, message):
    with pytest.raises(ValueError, match=message):
        ModelShards.of(make_config(**overrides), tp(0, size))


def make_config(**overrides):
    from tiny_models import tiny_config

    overrides.setdefault("hidden_size", 96)
    return tiny_config("llama", 321, **overrides)


class RecordingShard:
    """A safetensors file handle that records how many elements each read returned."""

    def __init__(self, inner, reads: list[tuple[str, str, int]]) -> None:
        self.inner, self.reads = inner, reads

    def __enter__(self) -> RecordingShard:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.inner.__exit__(*exc)

    def keys(self):
        return self.inner.keys()

    def metadata(self):
        return self.inner.metadata()

    def get_tensor(self, name: str) -> torch.Tensor:
        tensor = self.inner.get_tensor(name)
        self.reads.append(("whole", name, tensor.numel()))
        return tensor

    def get_slice(self, name: str):
        shard = self

        class Slice:
            def __getitem__(self, index) -> torch.Tensor:
                tensor = shard.inner.get_slice(name)[index]
                shard.reads.append(("slice", name, tensor.numel()))
                return tensor

        return Slice()


def test_each_rank_reads_only_its_slices(tmp_path, monkeypatch):
    """The loader reads each rank's slices alone (get_slice, never the whole tensor) and yields
    them; the vocabulary (321 rows) pads to 2 x 161, the norms are read whole."""
    path = make_tiny_model_dir(tmp_path / "m", "qwen2", vocab_size=321)
    full = load_file(path / "model.safetensors")
    reads: list[tuple[str, str, int]] = []
    real_open = model_loader.safe_open
    monkeypatch.setattr(
        model_loader, "safe_open", lambda *a, **k: RecordingShard(real_open(*a, **k), reads)
    )
    seen = {}
    for rank in (0, 1):
        reads.clear()
        shards = ModelShards.of(load_checkpoint(path).config, tp(rank))
        for name, tensor in iter_weights(path, torch.float32, {}, shards.weight_slice):
            cut = shards.weight_slice(name)
            expected = full[name]
            if cut is not None:
                expected = expected.narrow(cut.dim, cut.start, cut.end - cut.start)
            torch.testing.assert_close(tensor, expected, rtol=0, atol=0)
            seen[name, rank] = tuple(tensor.shape)
        split = {n for n in full if shards.weight_slice(n) is not None}
        assert {(kind, n) for kind, n, _ in reads} == {
            ("slice" if n in split else "whole", n) for n in full
        }
        assert sum(size for *_, size in reads if _[1] in split) == sum(
            math.prod(seen[n, rank]) for n in split
        )
        assert (
            sum(math.prod(seen[n, rank]) for n in split)
            < sum(full[n].numel() for n in split) * 0.51
        )
    assert seen["model.layers.0.self_attn.q_proj.weight", 1] == (32, 64)  # 2 of 4 heads
    assert seen["model.layers.0.self_attn.k_proj.bias", 1] == (16,)  # 1 of 2 KV heads
    assert seen["model.layers.0.self_attn.o_proj.weight", 0] == (64, 32)
    assert seen["model.layers.0.mlp.down_proj.weight", 1] == (64, 64)
    assert seen["lm_head.weight", 0] == (161, 64) and seen["lm_head.weight", 1] == (160, 64)
    assert seen["model.norm.weight", 1] == (64,)  # replicated


def test_packed_column_slices_off_the_block_boundaries_are_dequantized(tmp_path):
    """A stored q8_0 matrix (a converted GGUF): rows or a column slice of whole blocks stay
    packed; a column slice off the boundaries (left out of the plan by `ModelShards.quant_plan`)
    comes back as those float columns of the dequantized matrix."""
    weight = torch.randn(6, 128)
    data = quantize(weight, "q8_0")
    meta = {"w": {"qtype": "q8_0", "shape": [6, 128]}}
    save_file({"w": data}, tmp_path / "model.safetensors", {PACKED_METADATA_KEY: json.dumps(meta)})
    reference = dequantize(data, "q8_0", 128)
    for part, packed in ((1, 32, 96), True), ((0, 2, 5), True), ((1, 48, 112), False):
        cut = WeightSlice(*part)
        plan = {"w": "q8_0"} if packed else {}
        [(_, got)] = iter_weights(tmp_path, torch.float32, plan, lambda name, c=cut: c)
        assert isinstance(got, PackedWeight) == packed
        if packed:
            got = got.dequantize()
        expected = reference.narrow(cut.dim, cut.start, cut.end - cut.start)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_row_parallel_weights_off_the_block_boundaries_are_not_kept_packed():
    """hidden 96 = 4 heads of 24: o_proj's 48 columns per rank are not whole q8_0 blocks."""
    shards = ModelShards.of(make_config(), tp(1))
    plan = {
        "model.layers.0.self_attn.o_proj.weight": "q8_0",
        "model.layers.0.self_attn.q_proj.weight": "q8_0",
        "model.layers.0.mlp.down_proj.weight": "q8_0",  # 64 of 128 columns: whole blocks
    }
    assert shards.quant_plan(plan) == {
        "model.layers.0.self_attn.q_proj.weight": "q8_0",
        "model.layers.0.mlp.down_proj.weight": "q8_0",
    }
    assert ModelShards.of(make_config(), TPGroup.single()).quant_plan(plan) == plan


# -- two ranks as processes -----------------------------------------------------------------------
def cases(tmp_path: Path) -> dict[str, tuple[Path, dict]]:
    """name -> (HF folder, engine knobs)."""
    gguf = random_model("llama", seed=5, hidden_size=96, intermediate_size=128)
    types = {"attn": Q.Q8_0, "ffn": Q.Q8_0, "token": Q.Q8_0, "output.": Q.Q8_0}
    converted = gguf_convert.convert_gguf(write_gguf(tmp_path / "m.gguf", gguf, types))
    return {
        "llama-gqa": (make_tiny_model_dir(tmp_path / "llama", "llama", seed=1), {}),
        "qwen2-bias": (make_tiny_model_dir(tmp_path / "qwen2", "qwen2", seed=2), {}),
        "qwen3-qk-norm": (make_tiny_model_dir(tmp_path / "qwen3", "qwen3", seed=3), {}),
        "kv-replicated": (
            make_tiny_model_dir(tmp_path / "mqa", "llama", seed=4, num_key_value_heads=1),
            {},
        ),
        "q8_0-at-load-tied": (
            make_tiny_model_dir(
                tmp_path / "tied", "llama", seed=6, vocab_size=321, tie_word_embeddings=True
            ),
            {"quantization": "q8_0"},
        ),
        # float activations: o_proj's row-parallel halves sum in another order, and int8
        # activations can turn that fp32 difference into another int8 code downstream
        "gguf-q8_0": (converted, {"quant_activations": "float"}),
        "heads-do-not-split": (
            make_tiny_model_dir(
                tmp_path / "odd",
                "llama",
                hidden_size=48,
                num_attention_heads=3,
                num_key_value_heads=3,
            ),
            {},
        ),  # fmt: skip
    }


def rank_main(rank: int, port: int, runs: dict[str, tuple[Path, dict]], out: Path) -> None:
    torch.set_num_threads(1)
    group = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", torch.device("cpu"))
    for name, (path, knobs) in runs.items():
        try:
            runner = ModelRunner(config(path, **knobs), load_checkpoint(path), group)
        except ValueError as exc:
            torch.save({"error": str(exc)}, out / f"{name}-{rank}.pt")
            continue
        shapes = {n: tuple(t.shape) for n, t in runner.model.state_dict().items()}
        packed = sorted(n for n, m in runner.model.named_modules() if isinstance(m, QuantLinear))
        embedding = type(runner.model.embed_tokens).__name__
        result = {
            "logits": drive(runner),
            "shapes": shapes,
            "packed": packed,
            "embedding": embedding,
        }
        ops = runner.model.ops.describe()
        torch.save(
            {**result, "pages": runner.pool.num_pages, "ops": ops}, out / f"{name}-{rank}.pt"
        )
    # ranks that plan different pools agree on the smallest; one rank failing fails them all
    path = runs["llama-gqa"][0]
    checkpoint = load_checkpoint(path)
    runner = ModelRunner(config(path, max_total_tokens=(256, 128)[rank]), checkpoint, group)
    report: dict = {"pages": runner.pool.num_pages}
    try:
        ModelRunner(config(path, context_length=(None, 4096)[rank]), checkpoint, group)
    except (ValueError, RuntimeError) as exc:
        report["error"] = str(exc)
    torch.save(report, out / f"agree-{rank}.pt")
    exit_rank_process(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_give_the_one_device_logits(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_convert, "cache_root", lambda: tmp_path / "gguf-cache")
    runs = cases(tmp_path)
    mp.spawn(rank_main, args=(free_port(), runs, tmp_path), nprocs=2, join=True)
    for name, (path, knobs) in runs.items():
        ranks = [torch.load(tmp_path / f"{name}-{r}.pt") for r in (0, 1)]
        if name == "heads-do-not-split":
            assert all("num_attention_heads 3" in r["error"] for r in ranks)
            continue
        one = ModelRunner(config(path, **knobs), load_checkpoint(path))
        expected = drive(one)
        for r in ranks:
            assert r["embedding"].startswith("VocabParallel")
            assert r["pages"] == ranks[0]["pages"]
            assert r["ops"] == one.model.ops.describe()  # the same kernels on the rank's shapes
            for got, ref in zip(r["logits"], expected, strict=True):
                torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, msg=name)
        for got, other in zip(ranks[0]["logits"], ranks[1]["logits"], strict=True):
            assert torch.equal(got, other)
        full = {n: tuple(t.shape) for n, t in one.model.state_dict().items()}
        qkv = "layers.0.self_attn.qkv_proj.weight"
        one_packed = sorted(n for n, m in one.model.named_modules() if isinstance(m, QuantLinear))
        if qkv in full:  # float projections: half the q rows, columns of o and down
            kv_rows = 16 if name == "kv-replicated" else 0  # k and v: 1 of 1 head, not 1 of 2
            assert ranks[1]["shapes"][qkv][0] == full[qkv][0] // 2 + kv_rows
            assert ranks[1]["shapes"]["layers.0.mlp.down_proj.weight"] == (64, 64)
        if name == "gguf-q8_0":  # o_proj's 48 columns are not whole q8_0 blocks
            assert "layers.0.self_attn.o_proj" in one_packed
            assert "layers.0.self_attn.o_proj" not in ranks[0]["packed"]
            assert "layers.0.mlp.down_proj" in ranks[0]["packed"]
        if name == "q8_0-at-load-tied":
            assert ranks[0]["packed"] == one_packed  # every projection still packed
    agree = [torch.load(tmp_path / f"agree-{r}.pt") for r in (0, 1)]
    assert [a["pages"] for a in agree] == [129, 129]  # 128 tokens + the padding page
    assert "another tensor-parallel rank failed" in agree[0]["error"]
    assert "context_length 4096 exceeds" in agree[1]["error"]


def test_a_rank_exits_with_its_code_and_its_output_flushed(tmp_path):
    """exit_rank_process skips the interpreter's finalization (os._exit): what the rank
    printed or logged before must still reach its pipes, and its exit code its parent."""
    script = (
        "import logging, sys\n"
        "from radixflow.runtime.distributed.group import exit_rank_process\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "print('rank output')\n"
        "logging.getLogger('rank').warning('rank log line')\n"
        "exit_rank_process(3)\n"
        "print('not reached')\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3
    assert done.stdout == "rank output\n"
    assert "rank log line" in done.stderr
