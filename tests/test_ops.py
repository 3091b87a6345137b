"""Every implementation of every op against its one reference (kernels/reference.py), on random
inputs, and the choice the ops layer makes once per model (runtime/layers/).

Triton runs under the interpreter (conftest sets TRITON_INTERPRET); the C++ kernels are skipped
where kernels/cpu_build.py cannot build them on this CPU.
"""

from __future__ import annotations

import pytest
import torch
from attention_harness import HEAD_DIM, HEADS, KV_HEADS, Harness

from radixflow.kernels.cpu_build import cpu_kernels_available
from radixflow.kernels.reference import (
    apply_token_bitmask_ref,
    bitmask_words,
    fused_add_rms_norm_ref,
    linear_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    silu_and_mul_ref,
)
from radixflow.kernels.testing import relative_error
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.attention.reference import ReferenceBackend
from radixflow.runtime.attention.sdpa_backend import TorchPagedBackend
from radixflow.runtime.attention.triton_backend import TritonBackend
from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.layers import target as target_module
from radixflow.runtime.layers.activation import choose_silu_and_mul
from radixflow.runtime.layers.attention import choose_attention_backend
from radixflow.runtime.layers.linear import choose_linear
from radixflow.runtime.layers.norm import choose_rms_norm
from radixflow.runtime.layers.rotary import RopeSpec, choose_rotary
from radixflow.runtime.layers.target import OpsTarget
from radixflow.runtime.layers.token_bitmask import choose_token_bitmask
from radixflow.runtime.models.llama import ModelOps

CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
NEEDS_CPU_KERNELS = pytest.mark.skipif(
    not cpu_kernels_available(), reason="kernels/cpu_build.py cannot build the C++ kernels here"
)


@pytest.fixture
def no_cpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a CPU that runs none of the kernels' ISAs: the C++ kernels are not available."""
    monkeypatch.setattr(target_module, "cpu_kernels_available", lambda: False)


def targets(triton: bool) -> list:
    """(implementation kind, dtype) pairs to test; Triton in fp32 and fp16 (the interpreter's)."""
    cases = [("torch", torch.float32), ("torch", torch.bfloat16)]
    if triton:
        cases += [("triton", torch.float32), ("triton", torch.float16)]
    cases += [
        pytest.param("cpu", dtype, marks=NEEDS_CPU_KERNELS)
        for dtype in (torch.float32, torch.bfloat16)
    ]
    return cases


IMPLS = pytest.mark.parametrize("kind,dtype", targets(triton=True))
NO_TRITON_IMPLS = pytest.mark.parametrize("kind,dtype", targets(triton=False))


def target_for(kind: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> OpsTarget:
    """An OpsTarget whose choice is `kind` for the ops that have it."""
    if kind == "torch":
        monkeypatch.setattr(target_module, "cpu_kernels_available", lambda: False)
    return OpsTarget(CPU, dtype, triton=kind == "triton")


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not out.isnan().any()
    assert relative_error(out, ref) < TOLERANCE[dtype]


# -- the choice -------------------------------------------------------------------------------


@NEEDS_CPU_KERNELS
def test_a_cpu_model_binds_the_cpp_kernels():
    ops = ModelOps.choose(OpsTarget(CPU, torch.float32))
    assert ops.describe() == (
        "rms_norm=cpu rotary=cpu silu_and_mul=cpu linear=cpu-small-rows quant_linear=cpu"
    )


@NEEDS_CPU_KERNELS
def test_triton_binds_norm_and_rotary_and_keeps_the_cpp_matmuls_on_cpu():
    ops = ModelOps.choose(OpsTarget(CPU, torch.float32, triton=True))
    assert ops.describe() == (
        "rms_norm=triton rotary=triton silu_and_mul=cpu linear=cpu-small-rows quant_linear=cpu"
    )


def test_without_cpp_kernels_every_op_is_torch(no_cpu_kernels):
    ops = ModelOps.choose(OpsTarget(CPU, torch.bfloat16))
    assert ops.describe() == (
        "rms_norm=torch rotary=torch silu_and_mul=torch linear=torch quant_linear=torch-dequantize"
    )


def test_dtypes_and_devices_the_cpp_kernels_lack_get_torch():
    for target in (OpsTarget(CPU, torch.float16), OpsTarget(torch.device("cuda"), torch.float32)):
        assert not target.cpu_kernels
        described = ModelOps.choose(target).describe()
        assert described.endswith("silu_and_mul=torch linear=torch quant_linear=torch-dequantize")


def test_token_bitmask_is_triton_on_cuda_only():
    assert choose_token_bitmask("cpu").name == "torch"
    assert choose_token_bitmask(torch.device("cuda")).name == "triton"


def test_attention_backend_auto_is_torch_on_cpu():
    pool = Harness(4, num_layers=1, gen=torch.Generator().manual_seed(0)).pool
    name, backend = choose_attention_backend("auto", pool, CPU)
    assert name == "torch" and isinstance(backend, TorchPagedBackend)
    name, backend = choose_attention_backend("triton", pool, CPU)
    assert name == "triton" and isinstance(backend, TritonBackend)


# -- each op against its reference --------------------------------------------------------------


@IMPLS
@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (3, 4, 32)])
def test_rms_norm(kind, dtype, shape, monkeypatch):
    impl = choose_rms_norm(target_for(kind, dtype, monkeypatch))
    assert impl.name == kind
    x, w = randn(*shape, dtype=dtype, seed=1), randn(shape[-1], dtype=dtype, seed=2)
    assert_close(impl.norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)

    residual = randn(*shape, dtype=dtype, seed=3)
    want_x, want_res = fused_add_rms_norm_ref(x.clone(), residual.clone(), w, 1e-6)
    got_x, got_res = impl.add_norm(x.clone(), residual.clone(), w, 1e-6)
    assert_close(got_x, want_x, dtype)
    assert_close(got_res, want_res, dtype)


@IMPLS
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (32, 16)])
def test_rotary(kind, dtype, head_dim, rotary_dim, monkeypatch):
    impl = choose_rotary(target_for(kind, dtype, monkeypatch))
    assert impl.name == kind
    cache = RopeSpec(theta=10000.0, rotary_dim=rotary_dim).cos_sin_cache(64)
    positions = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(4))
    qkv = randn(9, (HEADS + 2 * KV_HEADS) * head_dim, dtype=dtype, seed=5)
    q = qkv[:, : HEADS * head_dim].reshape(9, HEADS, head_dim)  # strided views, as in the model
    k = qkv[:, HEADS * head_dim : (HEADS + KV_HEADS) * head_dim].reshape(9, KV_HEADS, head_dim)
    want_q, want_k = rotary_embedding_ref(positions, q.clone(), k.clone(), cache, head_dim, True)
    got_q, got_k = impl.bind(positions, cache, dtype, head_dim)(q, k)
    assert_close(got_q, want_q, dtype)
    assert_close(got_k, want_k, dtype)


@NO_TRITON_IMPLS
@pytest.mark.parametrize("rows", [1, 5])
def test_silu_and_mul(kind, dtype, rows, monkeypatch):
    impl = choose_silu_and_mul(target_for(kind, dtype, monkeypatch))
    assert impl.name == kind
    gate_up = randn(rows, 2 * 96, dtype=dtype, seed=rows)
    assert_close(impl.fn(gate_up), silu_and_mul_ref(gate_up), dtype)


@NO_TRITON_IMPLS
@pytest.mark.parametrize("rows", [1, 8, 9])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(kind, dtype, rows, with_bias, monkeypatch):
    impl = choose_linear(target_for(kind, dtype, monkeypatch))
    assert impl.name == {"torch": "torch", "cpu": "cpu-small-rows"}[kind]
    x, w = randn(rows, 64, dtype=dtype, seed=rows), randn(48, 64, dtype=dtype, seed=7)
    b = randn(48, dtype=dtype, seed=8) if with_bias else None
    with torch.inference_mode():
        assert_close(impl.fn(x, w, b), linear_ref(x, w, b), dtype)


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("indices", [None, [2, 0]])
def test_token_bitmask(device, dtype, indices):
    """The Triton kernel runs on CPU tensors under the interpreter."""
    impl = choose_token_bitmask(device)
    vocab = 1000
    gen = torch.Generator().manual_seed(9)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, bitmask_words(vocab)), generator=gen).int()
    logits = torch.randn(3, vocab + 5, generator=gen).to(dtype)
    rows = None if indices is None else torch.tensor(indices)
    want = logits.clone()
    apply_token_bitmask_ref(want, bitmask, rows)
    impl.apply(logits, bitmask, rows)
    assert torch.equal(logits, want)


# -- attention: every backend against the plain reference backend -----------------------------


def backends(pool) -> dict[str, AttentionBackend]:
    made = {
        "torch-sdpa": TorchPagedBackend(pool, use_kernel=False),
        "torch-sdpa-no-cascade": TorchPagedBackend(pool, use_kernel=False, cascade=False),
        "triton": TritonBackend(pool),
    }
    if cpu_kernels_available():
        made["cpp-decode"] = TorchPagedBackend(pool, use_kernel=True)
    return made


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("logit_cap,window", [(0.0, -1), (8.0, 12)], ids=["plain", "cap-window"])
def test_every_attention_backend_matches_the_reference(page_size, logit_cap, window):
    """Requests with cached prefixes (two sharing one), extend, mixed and decode steps, GQA."""
    gen = torch.Generator().manual_seed(11 + page_size)
    harness = Harness(page_size, 2, gen, num_tokens=640, max_reqs=8, max_context=200)
    for cached in (80, 0, 21):
        harness.add_request(cached)
    harness.fork_request(0, 80)
    reference = ReferenceBackend(harness.pool)
    under_test = backends(harness.pool)
    specs = [
        AttentionLayerSpec(i, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, logit_cap, window)
        for i in range(2)
    ]
    for extend_lens in ([3, 9, 17, 2], [1, 1, 1, 1], [1, 5, 1, 1], [1, 1, 1, 1]):
        mode = ForwardMode.DECODE if set(extend_lens) == {1} else ForwardMode.EXTEND
        batch = harness.step(extend_lens, mode)
        for backend in (reference, *under_test.values()):
            backend.init_forward_metadata(batch)
        for layer in specs:
            width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
            qkv = torch.randn(batch.num_tokens, width, generator=gen)
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], 1)
            want = reference.forward(q, k, v, layer, batch)
            stored = harness.pool.k_buffers[layer.layer_id][batch.out_cache_loc].clone()
            assert torch.equal(stored.reshape(k.shape), k)
            for name, backend in under_test.items():
                got = backend.forward(q, k, v, layer, batch)
                assert relative_error(got, want) < 1e-5, name
