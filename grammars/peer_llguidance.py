"""llguidance behind the GrammarMatcher interface (`pip install "radixflow[llguidance]"`).

Sources: regexes in llguidance's own (Rust-like) syntax; JSON Schemas in our form (compact, or
`whitespace_pattern` around `{ } [ ] , :`; properties in schema order; llguidance refuses the
keywords it does not implement); Lark grammars in llguidance's Lark dialect (its built-in
`%import common.*` only, never files); GBNF through our converter to Lark; choices as a regex.

Limits: `grammar_compile_timeout` bounds the wait for a compilation and `step_timeout` each
matcher call (checked when it returns); the other `grammar_*` budgets are radixflow's and do
not apply. llguidance enforces its own `LLParserLimits` (lexer fuel, Earley items per step,
lexer states) at its defaults; a matcher past one fails its request with llguidance's message.
"""

from __future__ import annotations

import codecs
import importlib
import threading
from typing import Any

import torch

from .budget import GrammarBudgetExceeded
from .gbnf import gbnf_to_lark
from .peer_compiler import GrammarSource, PeerCompiler, choices_regex
from .peer_matcher import GrammarOptions, PeerGrammar, PeerMatcher


class LLGuidanceCompiler(PeerCompiler):
    name = "llguidance"
    package = "llguidance"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tokenizer: Any = None  # llguidance's tokenizer, built on first use (~1 s)
        self._tokenizer_lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> Any:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                hf = importlib.import_module("llguidance.hf")
                self._tokenizer = hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
            return self._tokenizer

    def grammar_text(self, src: GrammarSource) -> str:
        """The llguidance grammar (its JSON form) for a source."""
        build = self.peer.LLMatcher
        if src.kind == "regex":
            return build.grammar_from_regex(src.value)
        if src.kind == "choices":
            return build.grammar_from_regex(choices_regex(src.value))
        if src.kind == "lark":
            return build.grammar_from_lark(src.value)
        if src.kind == "ebnf":
            return build.grammar_from_lark(gbnf_to_lark(src.value))
        schema, whitespace_pattern = src.value
        options: dict[str, Any] = {"item_separator": ",", "key_separator": ":"}
        if whitespace_pattern is None:
            options["whitespace_flexible"] = False
        else:
            options.update(whitespace_flexible=True, whitespace_pattern=whitespace_pattern)
        return build.grammar_from_json_schema(schema, overrides=options)

    def build(self, src: GrammarSource) -> LLGuidanceGrammar:
        try:
            text = self.grammar_text(src)
        except ValueError as exc:
            raise ValueError(f"llguidance refused the {src.kind}: {exc}") from None
        first = self.peer.LLMatcher(self.ll_tokenizer, text, log_level=0)
        if first.is_error():
            raise ValueError(f"llguidance refused the {src.kind}: {first.get_error()}")
        return LLGuidanceGrammar(self.grammar_options(src), first, len(text))


class LLGuidanceGrammar(PeerGrammar):
    """A compiled llguidance grammar: a matcher at its start, copied for each request."""

    def __init__(self, options: GrammarOptions, first: Any, size: int) -> None:
        super().__init__(options)
        self.first = first
        self._size = size
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The grammar's text; llguidance's lexer grows as it is used, which it does not report."""
        return self._size

    def matcher(self) -> LLGuidanceMatcher:
        with self._lock:
            return LLGuidanceMatcher(self, self.first.deep_copy())


class LLGuidanceMatcher(PeerMatcher):
    backend = "llguidance"

    def __init__(self, grammar: LLGuidanceGrammar, matcher: Any) -> None:
        super().__init__(grammar)
        self._m = matcher

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarBudgetExceeded("llguidance's parser limits", self._m.get_error())

    def _fill(self, row: torch.Tensor) -> None:
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        self._check()

    def _accept(self, token_id: int) -> bool:
        # (consume_token of a refused token would leave llguidance's matcher failed for good)
        ok = self._m.try_consume_tokens([token_id]) == 1
        self._check()
        return ok

    def _can_end(self) -> bool:
        self._check()
        return bool(self._m.is_accepting())

    def _rollback(self, n: int) -> None:
        self._m.rollback(n)

    def _forced_text(self) -> str:
        data = self._m.compute_ff_bytes()
        self._check()
        if data and 0x80 <= data[0] < 0xC0:  # the rest of a character a token began: no text
            return ""
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)

    def _is_terminated(self) -> bool:
        self._check()
        return bool(self._m.is_stopped())
