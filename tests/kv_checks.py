"""Shared assertion: an idle engine holds no KV beyond what the radix tree caches."""

from __future__ import annotations


def assert_kv_released(engine) -> None:
    """Nothing is locked; flushing the tree returns every page to the pool (no leak)."""
    assert engine.kv.cache.protected_size() == 0
    engine.flush_cache()
    assert engine.kv_pages_free() == engine.kv_pages_total()
