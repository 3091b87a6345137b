"""Prometheus metrics of one server: request/token counters, latency histograms, engine gauges.

Each `ServerMetrics` owns its registry, so several apps (tests) can live in one process.
Latencies come from the engine's `meta_info` (ttft, e2e_latency); inter-token latency is
measured by the server between streamed chunks, or averaged over the decode for a whole result.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

if TYPE_CHECKING:
    from radixflow.runtime.engine import Engine

__all__ = ["CONTENT_TYPE", "ServerMetrics", "StreamTimer"]

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)


class ServerMetrics:
    """The metrics of one server over one engine; `render()` gives the /metrics body."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, open fds
        self.requests = Counter(
            "radixflow_requests",
            "Finished generation requests, by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.errors = Counter(
            "radixflow_http_errors", "Error responses, by HTTP status", ["status"], registry=r
        )
        self.prompt_tokens = Counter("radixflow_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(
            "radixflow_generation_tokens", "Generated tokens", registry=r
        )
        self.cached_tokens = Counter(
            "radixflow_cached_tokens", "Prompt tokens served from the radix cache", registry=r
        )
        self.ttft = Histogram(
            "radixflow_time_to_first_token_seconds",
            "Time to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "radixflow_inter_token_latency_seconds",
            "Time between output tokens",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "radixflow_e2e_request_latency_seconds",
            "End-to-end request latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        snapshot = engine.snapshot
        Gauge("radixflow_num_running_reqs", "Requests being decoded", registry=r).set_function(
            lambda: snapshot().num_running_reqs
        )
        Gauge("radixflow_num_waiting_reqs", "Requests in the queue", registry=r).set_function(
            lambda: snapshot().num_waiting_reqs
        )
        Gauge("radixflow_kv_pages_total", "KV pool size in pages", registry=r).set_function(
            lambda: snapshot().kv_pages_total
        )
        Gauge("radixflow_kv_pages_used", "KV pages in use", registry=r).set_function(
            lambda: snapshot().kv_pages_used
        )
        Gauge("radixflow_kv_usage", "Fraction of the KV pool in use", registry=r).set_function(
            lambda: snapshot().token_usage
        )
        Gauge(
            "radixflow_cache_hit_rate",
            "Cached prompt tokens / prompt tokens since start",
            registry=r,
        ).set_function(lambda: self._cached_sum / max(self._prompt_sum, 1))
        self._prompt_sum = 0
        self._cached_sum = 0
        Gauge(
            "radixflow_pinned_tokens", "Prompt tokens pinned in the radix cache", registry=r
        ).set_function(lambda: snapshot().pinned_tokens)
        Gauge(
            "radixflow_grammar_cache_bytes", "Bytes held by cached compiled grammars", registry=r
        ).set_function(lambda: snapshot().grammar_cache_bytes)
        Gauge(
            "radixflow_spec_accept_length",
            "Tokens emitted per speculative verify step (accepted drafts + 1) since start",
            registry=r,
        ).set_function(lambda: snapshot().spec_accept_length)
        Gauge(
            "radixflow_spec_accept_rate", "Accepted / proposed draft tokens since start", registry=r
        ).set_function(lambda: snapshot().spec_accept_rate)

    def observe_finished(self, result: dict[str, Any], streamed: bool) -> None:
        """Count one finished request from its final output dict."""
        meta = result["meta_info"]
        self.requests.labels(meta["finish_reason"]["type"]).inc()
        self.prompt_tokens.inc(meta["prompt_tokens"])
        self.generation_tokens.inc(meta["completion_tokens"])
        self.cached_tokens.inc(meta.get("cached_tokens", 0))
        self._prompt_sum += meta["prompt_tokens"]
        self._cached_sum += meta.get("cached_tokens", 0)
        self.e2e.observe(meta["e2e_latency"])
        if "ttft" in meta:
            self.ttft.observe(meta["ttft"])
            decoded = meta["completion_tokens"] - 1
            if not streamed and decoded > 0:
                self.itl.observe((meta["e2e_latency"] - meta["ttft"]) / decoded)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StreamTimer:
    """Measures inter-token latency of one streamed request from its chunks."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.last: float | None = None
        self.tokens = 0

    def chunk(self, completion_tokens: int) -> None:
        now = time.monotonic()
        new = completion_tokens - self.tokens
        if new > 0:
            if self.last is not None:
                gap = (now - self.last) / new
                for _ in range(new):
                    self.metrics.itl.observe(gap)
            self.last = now
            self.tokens = completion_tokens
