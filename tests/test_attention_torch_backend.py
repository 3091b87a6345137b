"""TorchPagedBackend (the CPU path) over a real KVPool against dense fp32 attention, including
cascade decoding of rows that share a cached prefix."""

from __future__ import annotations

import pytest
import torch
from attention_harness import HEAD_DIM, HEADS, KV_HEADS, Harness

from radixflow.runtime.attention import sdpa_backend
from radixflow.runtime.attention.base import AttentionLayerSpec
from radixflow.runtime.attention.sdpa_backend import TorchPagedBackend
from radixflow.runtime.forward_batch import ForwardMode

PREFIX = 80  # longer than MIN_CASCADE_PREFIX, a multiple of both page sizes


def layers(logit_cap: float, sliding_window: int) -> list[AttentionLayerSpec]:
    return [
        AttentionLayerSpec(i, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, logit_cap, sliding_window)
        for i in range(2)
    ]


def run_steps(harness: Harness, backend: TorchPagedBackend, specs, steps: list[list[int]]) -> None:
    for extend_lens in steps:
        mode = ForwardMode.DECODE if set(extend_lens) == {1} else ForwardMode.EXTEND
        batch = harness.step(extend_lens, mode)
        backend.init_forward_metadata(batch)
        for layer in specs:
            harness.check_forward(backend, batch, layer)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "logit_cap,sliding_window", [(0.0, -1), (8.0, 12)], ids=["plain", "cap-window"]
)
def test_extend_then_decode_matches_dense_attention(page_size, logit_cap, sliding_window):
    gen = torch.Generator().manual_seed(page_size)
    harness = Harness(page_size, num_layers=2, gen=gen)
    for cached in (0, 20, 5):
        harness.add_request(cached)
    backend = TorchPagedBackend(harness.pool)
    run_steps(harness, backend, layers(logit_cap, sliding_window), [[7, 3, 18], [1, 1, 1]])


def cascade_harness(page_size: int) -> Harness:
    """Two families sharing cached prefixes (3 rows on one, 2 on another) and a loner."""
    gen = torch.Generator().manual_seed(7 + page_size)
    harness = Harness(page_size, 2, gen, num_tokens=640, max_reqs=8, max_context=200)
    harness.add_request(PREFIX + 3)  # 0: the first family's source
    harness.add_request(PREFIX + 16)  # 1: the second family's source
    harness.add_request(11)  # 2: shares nothing
    for source in (0, 0, 1):
        harness.fork_request(source, PREFIX)
    return harness


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "logit_cap,sliding_window", [(0.0, -1), (8.0, 12)], ids=["plain", "cap-window"]
)
def test_rows_sharing_a_prefix_decode_in_cascade_matching_dense_attention(
    page_size, logit_cap, sliding_window
):
    harness = cascade_harness(page_size)
    backend = TorchPagedBackend(harness.pool)
    specs = layers(logit_cap, sliding_window)
    # the forks prefill their own tails, then everyone decodes, then a mixed step
    run_steps(harness, backend, specs, [[1, 1, 1, 5, 2, 9], [1] * 6, [1] * 6])
    families = sorted(sorted(c.ids) for c in backend._cascade)
    assert families == [[0, 3, 4], [1, 5]]
    assert [c.prefix_len for c in sorted(backend._cascade, key=lambda c: c.ids)] == [
        PREFIX,
        PREFIX,
    ]
    run_steps(harness, backend, specs, [[1, 4, 1, 1, 1, 1]])


def test_short_shared_prefixes_are_not_cascaded(monkeypatch):
    monkeypatch.setattr(sdpa_backend, "MIN_CASCADE_PREFIX", PREFIX + 1)
    harness = cascade_harness(1)
    backend = TorchPagedBackend(harness.pool)
    run_steps(harness, backend, layers(0.0, -1), [[1, 1, 1, 5, 2, 9], [1] * 6])
    assert backend._cascade == []


@pytest.mark.parametrize(
    "use_kernel,cascade", [(False, True), (True, False)], ids=["sdpa", "kernel-no-cascade"]
)
def test_decode_paths_match_dense_attention(use_kernel, cascade):
    """Both decode paths (the compiled kernel where it builds, gather + SDPA) stay correct."""
    harness = cascade_harness(16)
    backend = TorchPagedBackend(harness.pool, use_kernel=use_kernel, cascade=cascade)
    steps = [[1, 1, 1, 5, 2, 9], [1] * 6, [1, 4, 1, 1, 1, 1]]
    run_steps(harness, backend, layers(0.0, -1), steps)
    run_steps(harness, backend, layers(8.0, 12), [[1] * 6])
    assert (backend._cascade != []) == cascade
