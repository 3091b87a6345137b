"""TritonBackend over a real KVPool: extend over a cached prefix, then decode."""

from __future__ import annotations

import pytest
import torch
from attention_harness import HEAD_DIM, HEADS, KV_HEADS, Harness

from radixflow.runtime.attention.base import AttentionLayerSpec
from radixflow.runtime.attention.triton_backend import TritonBackend
from radixflow.runtime.forward_batch import ForwardMode


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "logit_cap,sliding_window", [(0.0, -1), (8.0, 12)], ids=["plain", "cap-window"]
)
def test_triton_backend_extend_then_decode_matches_dense_attention(
    page_size, logit_cap, sliding_window
):
    gen = torch.Generator().manual_seed(page_size)
    harness = Harness(page_size, num_layers=2, gen=gen)
    for cached in (0, 20, 5):
        harness.add_request(cached)
    layers = [
        AttentionLayerSpec(i, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, logit_cap, sliding_window)
        for i in range(2)
    ]
    backend = TritonBackend(harness.pool)

    extend = harness.step([7, 3, 18], ForwardMode.EXTEND)
    backend.init_forward_metadata(extend)
    for layer in layers:
        harness.check_forward(backend, extend, layer)

    for _ in range(2):
        decode = harness.step([1, 1, 1], ForwardMode.DECODE)
        backend.init_forward_metadata(decode)
        for layer in layers:
            harness.check_forward(backend, decode, layer)


def test_forward_needs_metadata_and_matching_layer():
    gen = torch.Generator().manual_seed(0)
    harness = Harness(4, num_layers=1, gen=gen)
    harness.add_request(3)
    batch = harness.step([2], ForwardMode.EXTEND)
    backend = TritonBackend(harness.pool)
    q, kv = torch.randn(2, HEADS * HEAD_DIM), torch.randn(2, KV_HEADS * HEAD_DIM)
    layer = AttentionLayerSpec(0, HEADS, KV_HEADS, HEAD_DIM, 0.125)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        backend.forward(q, kv, kv, layer, batch)
    backend.init_forward_metadata(batch)
    wrong = AttentionLayerSpec(0, HEADS, 1, 2 * HEAD_DIM, 0.125)
    with pytest.raises(ValueError, match="KV heads"):
        backend.forward(q, kv, kv, wrong, batch)
