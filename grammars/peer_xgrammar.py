"""xgrammar behind the GrammarMatcher interface (`pip install "radixflow[xgrammar]"`).

Sources: regexes in xgrammar's own (ECMAScript-like) syntax; JSON Schemas in our compact form
(properties in schema order, `strict_mode` off so that what the schema leaves open stays open;
a `whitespace_pattern` is refused: xgrammar has no such option); Lark grammars through
xgrammar's Lark reader (no `%import` of files); GBNF as xgrammar reads it; choices as a regex.
Soundness is xgrammar's: 0.2.9 compiles schemas with keywords it does not implement (seen:
`contains`, `propertyNames`, `if`/`then`) without enforcing them, and lets raw control
characters into free JSON strings; prefer llguidance as a fallback behind ours.

Limits: `grammar_compile_timeout` bounds the wait for a compilation and `step_timeout` each
matcher call (checked when it returns); xgrammar has no budgets of its own and the other
`grammar_*` budgets are radixflow's. xgrammar's own compiled-grammar cache is off: grammars are
cached here, by source, within `grammar_cache_mb`.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
import torch

from .peer_compiler import GrammarSource, PeerCompiler, choices_regex
from .peer_matcher import GrammarOptions, PeerGrammar, PeerMatcher


class XGrammarCompiler(PeerCompiler):
    name = "xgrammar"
    package = "xgrammar"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compiler: Any = None  # xgrammar's compiler and tokenizer info, built on first use
        self._compiler_lock = threading.Lock()
        bits = np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.uint32)
        for t in self.eos_token_ids:
            bits[0, t // 32] |= np.uint32(1 << (t % 32))
        self._stop_mask = torch.from_numpy(bits.view(np.int32))  # the EOS tokens' bits

    @property
    def xgr_compiler(self) -> Any:
        with self._compiler_lock:
            if self._compiler is None:
                info = self.peer.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_token_ids
                )
                self._compiler = self.peer.GrammarCompiler(
                    info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False
                )
            return self._compiler

    def build(self, src: GrammarSource) -> XGrammarGrammar:
        compiler = self.xgr_compiler
        try:
            if src.kind == "regex":
                compiled = compiler.compile_regex(src.value)
            elif src.kind == "choices":
                compiled = compiler.compile_regex(choices_regex(src.value))
            elif src.kind == "lark":
                compiled = compiler.compile_lark(src.value)
            elif src.kind == "ebnf":
                compiled = compiler.compile_grammar(src.value)
            else:
                compiled = self._compile_json_schema(compiler, *src.value)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"xgrammar refused the {src.kind}: {exc}") from None
        return XGrammarGrammar(self.grammar_options(src), compiled, self._stop_mask)

    @staticmethod
    def _compile_json_schema(compiler: Any, schema: Any, whitespace_pattern: str | None) -> Any:
        if whitespace_pattern is not None:
            raise ValueError("whitespace_pattern is not supported by xgrammar")
        return compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False
        )


class XGrammarGrammar(PeerGrammar):
    def __init__(self, options: GrammarOptions, compiled: Any, stop_mask: torch.Tensor) -> None:
        super().__init__(options)
        self.compiled = compiled
        self.stop_mask = stop_mask  # the EOS tokens' bits, shape (1, words)

    @property
    def nbytes(self) -> int:
        return int(self.compiled.memory_size_bytes)

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self, XGrammarCompiler.load().GrammarMatcher(self.compiled))


class XGrammarMatcher(PeerMatcher):
    backend = "xgrammar"

    def __init__(self, grammar: XGrammarGrammar, matcher: Any) -> None:
        super().__init__(grammar)
        self._m = matcher
        self._stop_mask = grammar.stop_mask

    def _fill(self, row: torch.Tensor) -> None:
        self._m.fill_next_token_bitmask(row.view(1, -1), 0)

    def _accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def _can_end(self) -> bool:
        return bool(self._m.is_completed())

    def _rollback(self, n: int) -> None:
        self._m.rollback(n)

    def _forced_text(self) -> str:
        return str(self._m.find_jump_forward_string())

    def _is_terminated(self) -> bool:
        # ours ends once the text is complete and only an EOS may follow; xgrammar's own
        # is_terminated waits for the EOS, which would cost the engine one more step
        if not self._m.is_completed():
            return False
        mask = torch.empty_like(self._stop_mask)
        self._m.fill_next_token_bitmask(mask, 0)
        return not bool((mask & ~self._stop_mask).any())
