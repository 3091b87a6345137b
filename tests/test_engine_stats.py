"""EngineStats: the snapshot metrics and the info routes read, after known work."""

from __future__ import annotations

import dataclasses
import gc

import httpx
import pytest
from server_harness import start_server
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.io_struct import EngineStats

PROMPTS = [list(range(5, 5 + 40)), list(range(60, 60 + 13))]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("stats"), "llama", seed=3)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=1024, page_size=4)
    yield eng
    eng.shutdown()


def test_snapshot_after_known_work(engine):
    before = engine.snapshot()
    assert (before.num_running_reqs, before.num_waiting_reqs) == (0, 0)
    params = {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0}
    first = engine.generate(input_ids=PROMPTS, sampling_params=params)
    again = engine.generate(input_ids=PROMPTS[0], sampling_params=params)  # a cache hit
    stats = engine.snapshot()

    assert isinstance(stats, EngineStats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.num_running_reqs = 1  # type: ignore[misc]
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    metas = [r["meta_info"] for r in [*first, again]]
    delta = {k: stats.counters[k] - before.counters.get(k, 0) for k in stats.counters}
    assert delta["requests"] == 3
    assert delta["prompt_tokens"] == sum(m["prompt_tokens"] for m in metas) == 40 + 13 + 40
    assert delta["completion_tokens"] == 3 * 6
    assert delta["cached_tokens"] == sum(m["cached_tokens"] for m in metas)
    assert again["meta_info"]["cached_tokens"] >= 36  # the first prompt's whole pages
    assert stats.cache_hit_rate == pytest.approx(
        stats.counters["cached_tokens"] / stats.counters["prompt_tokens"]
    )

    pool = engine.runner.pool
    assert stats.page_size == 4
    assert stats.kv_pages_total == pool.capacity_pages
    # Finished requests leave their KV to the radix cache: used pages hold at least the
    # prompts' full pages, and flushing the cache frees them all.
    assert stats.kv_pages_used == stats.kv_pages_total - stats.kv_pages_free
    assert stats.kv_pages_used >= (40 + 13) // 4
    assert stats.kv_tokens_used == stats.kv_pages_used * 4
    assert stats.token_usage == pytest.approx(stats.kv_pages_used / stats.kv_pages_total)
    engine.flush_cache()
    flushed = engine.snapshot()
    assert flushed.kv_pages_used == 0 and flushed.token_usage == 0
    assert flushed.grammar_cache_bytes == 0


def test_grammar_cache_bytes_count_compiled_grammars(engine):
    engine.flush_cache()
    engine.generate(input_ids=PROMPTS[1], sampling_params={"max_new_tokens": 3, "regex": "ab+"})
    assert engine.snapshot().grammar_cache_bytes > 0


def test_routes_and_metrics_report_the_snapshot(engine):
    engine.generate(input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 2})
    running = start_server(engine)
    try:
        with httpx.Client(base_url=running.url, timeout=60) as http:
            stats = engine.snapshot()
            load = http.get("/get_load").json()
            assert load == [
                {
                    "dp_rank": 0,
                    "num_reqs": 0,
                    "num_waiting_reqs": 0,
                    "num_tokens": stats.kv_tokens_used,
                }
            ]
            info = http.get("/get_server_info").json()
            assert info["kv_pages_free"] == stats.kv_pages_free
            assert info["kv_pages_total"] == stats.kv_pages_total
            assert info["stats"]["requests"] == engine.snapshot().counters["requests"]
            metrics = http.get("/metrics").text
            assert f"radixflow_kv_pages_used {float(stats.kv_pages_used)}" in metrics
            assert f"radixflow_grammar_cache_bytes {float(stats.grammar_cache_bytes)}" in metrics
    finally:
        running.stop()


def test_gc_threshold_is_set_while_the_engine_runs(tmp_path):
    before = gc.get_threshold()
    path = make_tiny_model_dir(tmp_path, "llama", seed=3)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=256, gc_threshold="12345,7,3")
    try:
        assert gc.get_threshold() == (12345, 7, 3)
        out = eng.generate(input_ids=PROMPTS[:1], sampling_params={"max_new_tokens": 2})
        assert len(out[0]["output_ids"]) == 2
    finally:
        eng.shutdown()
    assert gc.get_threshold() == before
