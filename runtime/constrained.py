"""Constrained decoding in the engine: compile each request's grammar, mask the batch's logits.

Compilation runs on a thread pool of `grammar_compile_workers` (the caller waits on it, or
awaits it), is cached by source in the GrammarCompiler, and is bounded by
`grammar_compile_timeout`; a grammar that fails raises ValueError for its own request only. A
cached grammar (or a malformed one) is answered without entering the pool's queue, and
requests with the same grammar share one compilation, so slow grammars hold up only the
workers compiling them. Per step, the rows of constrained requests get their allowed-token
bitmask (cached per grammar state, so usually a copy), the others allow everything, and the
whole batch is masked in one call. A grammar past its budget (`GrammarBudgetExceeded`) fails
its own request, never the batch: `mask_logits` returns such requests, and every other call
site turns the error into `budget_abort(exc)`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from radixflow.grammars import (
    CompiledGrammar,
    CompileTimeout,
    GrammarBudgetExceeded,
    GrammarCompiler,
    GrammarLimits,
)
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.layers.token_bitmask import choose_token_bitmask
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams


def grammar_limits(config: EngineConfig) -> GrammarLimits:
    """The engine's `grammar_<limit>` knobs as GrammarLimits."""
    names = [f.name for f in dataclasses.fields(GrammarLimits)]
    return GrammarLimits(**{name: getattr(config, f"grammar_{name}") for name in names})


def budget_abort(exc: GrammarBudgetExceeded) -> dict[str, Any]:
    """The finish reason of a request whose grammar went past its budget."""
    return {
        "type": "abort",
        "message": f"grammar budget grammar_{exc.budget} exceeded: {exc.detail}",
    }


def _request_error(kind: str, exc: Exception) -> ValueError:
    """The error a request whose grammar failed gets (the server answers it with HTTP 400)."""
    if isinstance(exc, CompileTimeout):
        return CompileTimeout(f"{kind}: {exc}")
    return ValueError(f"invalid {kind}: {exc}")


class GrammarService:
    """The engine's grammar work: compile requests' grammars on a pool, mask a batch's logits.

    `device` is where the logits live (the model's): the bitmask op is chosen for it once.
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: set[int],
        timeout: float,
        limits: GrammarLimits | None = None,
        cache_mb: float = EngineConfig.grammar_cache_mb,
        workers: int = EngineConfig.grammar_compile_workers,
        import_paths: str = EngineConfig.grammar_import_paths,
        device: torch.device | str = "cpu",
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._timeout = timeout
        self._limits = limits
        self._cache_mb = cache_mb
        self._import_paths = [p for p in import_paths.split(os.pathsep) if p]
        self._compiler: GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="radixflow-grammar")
        self._running: dict[tuple[str, str], Future] = {}  # compilations by cache key
        self._running_lock = threading.Lock()
        self._bitmask = choose_token_bitmask(device)

    @property
    def compiler(self) -> GrammarCompiler:
        with self._compiler_lock:  # the tokenizer index is built once, on first use
            if self._compiler is None:
                self._compiler = GrammarCompiler(
                    self._tokenizer,
                    self._vocab_size,
                    self._eos,
                    compile_timeout=self._timeout,
                    limits=self._limits,
                    cache_mb=self._cache_mb,
                    import_paths=self._import_paths,
                )
            return self._compiler

    def submit(self, params: SamplingParams) -> Future[CompiledGrammar | None]:
        """The request's compiled grammar (None without one), compiled on the pool if needed."""
        spec = params.grammar
        compiler = self._compiler  # None until the first compilation: nothing is cached then
        if spec is None or compiler is None:
            return self._pool.submit(self.compile, params)
        done: Future[CompiledGrammar | None] = Future()
        try:
            key = compiler.cache_key(*spec)
        except ValueError as exc:
            done.set_exception(_request_error(spec[0], exc))
            return done
        hit = compiler.lookup(key)
        if hit is not None:
            done.set_result(hit)
            return done
        with self._running_lock:
            running = self._running.get(key)
            if running is not None:
                return running
            running = self._running[key] = self._pool.submit(self.compile, params)
        running.add_done_callback(functools.partial(self._forget, key))
        return running

    def _forget(self, key: tuple[str, str], done: Future) -> None:
        with self._running_lock:
            if self._running.get(key) is done:
                del self._running[key]

    def compile(self, params: SamplingParams) -> CompiledGrammar | None:
        spec = params.grammar
        if spec is None:
            return None
        try:
            return self.compiler.compile(*spec)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise _request_error(spec[0], exc) from exc

    def mask_logits(
        self, logits: torch.Tensor, reqs: list[Req]
    ) -> dict[int, GrammarBudgetExceeded]:
        """Forbid, in place, every token a constrained row's grammar does not allow next.

        Returns {row: error} for the requests whose grammar exceeded its budget; their rows
        are left unmasked (the caller fails those requests).
        """
        failed: dict[int, GrammarBudgetExceeded] = {}
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return failed
        words = (logits.shape[1] + 31) // 32
        bitmask = np.full((logits.shape[0], words), -1, dtype=np.int32)
        for i in rows:
            try:
                bitmask[i] = reqs[i].grammar.next_token_mask()
            except GrammarBudgetExceeded as exc:
                failed[i] = exc
        self._bitmask.apply(logits, torch.from_numpy(bitmask).to(logits.device), None)
        return failed

    def cache_nbytes(self) -> int:
        """Bytes the cached compiled grammars hold now."""
        compiler = self._compiler
        return 0 if compiler is None else compiler.cache_nbytes

    def flush(self) -> None:
        """Drop every cached compiled grammar (running requests keep theirs)."""
        with self._compiler_lock:
            if self._compiler is not None:
                self._compiler.clear_cache()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
