"""Constrained decoding in the engine: compile each request's grammar, mask the batch's logits.

Compilation runs on a small thread pool (the caller waits on it, or awaits it), is cached by
source in the GrammarCompiler, and is bounded by `grammar_compile_timeout`; a grammar that
fails raises ValueError for its own request only. Per step, the rows of constrained requests
get their allowed-token bitmask (cached per grammar state, so usually a copy), the others
allow everything, and the whole batch is masked in one call.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from radixflow.grammars import CompiledGrammar, CompileTimeout, GrammarCompiler
from radixflow.kernels.bitmask import apply_token_bitmask, apply_token_bitmask_ref
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams


class GrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int], timeout: float) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._timeout = timeout
        self._compiler: GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="radixflow-grammar")

    @property
    def compiler(self) -> GrammarCompiler:
        with self._compiler_lock:  # the tokenizer index is built once, on first use
            if self._compiler is None:
                self._compiler = GrammarCompiler(
                    self._tokenizer, self._vocab_size, self._eos, compile_timeout=self._timeout
                )
            return self._compiler

    def submit(self, params: SamplingParams) -> Future[CompiledGrammar | None]:
        """Compile the request's grammar (if any) on the pool."""
        return self._pool.submit(self.compile, params)

    def compile(self, params: SamplingParams) -> CompiledGrammar | None:
        spec = params.grammar
        if spec is None:
            return None
        kind, source = spec
        compile_fn = {
            "regex": self.compiler.compile_regex,
            "json_schema": self.compiler.compile_json_schema,
            "ebnf": self.compiler.compile_ebnf,
            "lark": self.compiler.compile_lark,
        }[kind]
        try:
            return compile_fn(source)
        except CompileTimeout as exc:
            raise ValueError(f"{kind}: compilation exceeded {self._timeout:g} s ({exc})") from exc
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise ValueError(f"invalid {kind}: {exc}") from exc

    def mask_logits(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        """Forbid, in place, every token a constrained row's grammar does not allow next."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return
        words = (logits.shape[1] + 31) // 32
        bitmask = np.full((logits.shape[0], words), -1, dtype=np.int32)
        for i in rows:
            bitmask[i] = reqs[i].grammar.next_token_mask()
        apply = apply_token_bitmask if logits.is_cuda else apply_token_bitmask_ref
        apply(logits, torch.from_numpy(bitmask).to(logits.device))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
