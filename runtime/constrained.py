"""Constrained decoding in the engine: compile each request's grammar, mask the batch's logits.

The grammars come from the backend `grammar_backend` names (radixflow's own engine, or a peer:
llguidance, xgrammar; `radixflow.grammars.backends`), with `grammar_backend_fallback` behind it
for the sources the backend refuses at compile time. Compilation runs on a thread pool of
`grammar_compile_workers` (the caller waits on it, or awaits it), is cached by source in the
backend's compiler, and is bounded by `grammar_compile_timeout`; a grammar that fails raises
ValueError for its own request only. A cached grammar (or a malformed one) is answered without
entering the pool's queue, and requests with the same grammar share one compilation, so slow
grammars hold up only the workers compiling them. Per step, the rows of constrained requests
get their allowed-token bitmask, the others allow everything, and the whole batch is masked in
one call. A grammar past its budget (`GrammarBudgetExceeded`) fails its own request, never the
batch: `mask_logits` returns such requests, and every other call site turns the error into
`budget_abort(exc)`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from radixflow.grammars import CompileTimeout, GrammarBudgetExceeded, GrammarLimits
from radixflow.grammars.backends import Compiler, Grammar, make_compiler, require_backend
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.layers.token_bitmask import choose_token_bitmask
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams

_LIMITS = {f.name for f in dataclasses.fields(GrammarLimits)}


def grammar_limits(config: EngineConfig) -> GrammarLimits:
    """The engine's `grammar_<limit>` knobs as GrammarLimits."""
    return GrammarLimits(**{name: getattr(config, f"grammar_{name}") for name in _LIMITS})


def budget_abort(exc: GrammarBudgetExceeded) -> dict[str, Any]:
    """The finish reason of a request whose grammar went past its budget (one of our
    `grammar_<limit>` knobs, or a peer backend's own limits)."""
    name = f"grammar_{exc.budget}" if exc.budget in _LIMITS else exc.budget
    return {"type": "abort", "message": f"grammar budget {name} exceeded: {exc.detail}"}


def _request_error(kind: str, exc: Exception) -> ValueError:
    """The error a request whose grammar failed gets (the server answers it with HTTP 400)."""
    if isinstance(exc, CompileTimeout):
        return CompileTimeout(f"{kind}: {exc}")
    return ValueError(f"invalid {kind}: {exc}")


class GrammarService:
    """The engine's grammar work: compile requests' grammars on a pool, mask a batch's logits.

    `device` is where the logits live (the model's): the bitmask op is chosen for it once.
    `backend` and `fallback` name grammar backends; a peer that is not installed is an
    ImportError naming the extra to install, raised here rather than at the first request.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: set[int],
        timeout: float,
        limits: GrammarLimits | None = None,
        cache_mb: float = EngineConfig.grammar_cache_mb,
        workers: int = EngineConfig.grammar_compile_workers,
        import_paths: str = EngineConfig.grammar_import_paths,
        device: torch.device | str = "cpu",
        backend: str = EngineConfig.grammar_backend,
        fallback: str | None = EngineConfig.grammar_backend_fallback,
    ) -> None:
        for name in (backend, fallback):
            if name is not None:
                require_backend(name)
        self.backend = backend
        self.fallback = fallback
        self._build = functools.partial(
            make_compiler,
            backend,
            tokenizer,
            vocab_size,
            sorted(eos_token_ids),
            compile_timeout=timeout,
            limits=limits,
            cache_mb=cache_mb,
            import_paths=[p for p in import_paths.split(os.pathsep) if p],
            fallback=fallback,
        )
        self._compiler: Compiler | None = None
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="radixflow-grammar")
        self._running: dict[tuple[str, str], Future] = {}  # compilations by cache key
        self._running_lock = threading.Lock()
        self._bitmask = choose_token_bitmask(device)

    @property
    def compiler(self) -> Compiler:
        with self._compiler_lock:  # per-tokenizer data is built once, on first use
            if self._compiler is None:
                self._compiler = self._build()
            return self._compiler

    def submit(self, params: SamplingParams) -> Future[Grammar | None]:
        """The request's compiled grammar (None without one), compiled on the pool if needed."""
        spec = params.grammar
        compiler = self._compiler  # None until the first compilation: nothing is cached then
        if spec is None or compiler is None:
            return self._pool.submit(self.compile, params)
        done: Future[Grammar | None] = Future()
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

    def compile(self, params: SamplingParams) -> Grammar | None:
        spec = params.grammar
        if spec is None:
            return None
        try:
            grammar = self.compiler.compile(*spec)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise _request_error(spec[0], exc) from exc
        grammar.prepare()  # the first mask, here on the pool while the engine prefills
        return grammar

    def mask_logits(
        self, logits: torch.Tensor, reqs: list[Req]
    ) -> dict[int, GrammarBudgetExceeded]:
        """Forbid, in place, every token a constrained row's grammar does not allow next.

        Returns {row: error} for the requests whose grammar exceeded its budget; their rows
        are left unmasked (the caller fails those requests).
        """
        failed: dict[int, GrammarBudgetExceeded] = {}
        rows = [(i, r.grammar) for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return failed
        words = (logits.shape[1] + 31) // 32
        bitmask = torch.full((logits.shape[0], words), -1, dtype=torch.int32)
        for i, grammar in rows:
            try:
                grammar.fill_mask(bitmask[i])
            except GrammarBudgetExceeded as exc:
                bitmask[i] = -1
                failed[i] = exc
        self._bitmask.apply(logits, bitmask.to(logits.device), None)
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
