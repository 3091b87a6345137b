"""GrammarCompiler: one per tokenizer; compiles grammar sources into cached CompiledGrammars."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence

from .automaton import RegexAutomaton
from .cfg import GrammarAutomaton, bnf_from_ebnf
from .gbnf import gbnf_to_lark
from .json_schema import schema_to_ir
from .lark_import import lark_to_bnf
from .matcher import CompiledGrammar
from .nfa import Deadline
from .regex_ir import Alt, literal, parse_regex
from .tokenizer_index import get_tokenizer_index


class GrammarCompiler:
    """Compile regexes, JSON Schemas, Lark/GBNF grammars and choice lists for one tokenizer.

    `vocab_size` is the model's vocabulary (its embedding rows), which may exceed the
    tokenizer's length; ids past the tokenizer are never allowed. `compile_timeout` bounds
    each compilation in seconds (`CompileTimeout` is raised past it).
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        compile_timeout: float = 10.0,
        cache_size: int = 256,
    ):
        self.index = get_tokenizer_index(tokenizer, vocab_size, eos_token_ids)
        self.compile_timeout = compile_timeout
        self._cache: dict[tuple[str, str], CompiledGrammar] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    def _cached(self, kind: str, source: str, build: Callable) -> CompiledGrammar:
        key = (kind, source)
        with self._lock:
            got = self._cache.get(key)
        if got is not None:
            return got
        automaton = build(Deadline(self.compile_timeout))
        got = CompiledGrammar(self.index, automaton, kind, source)
        with self._lock:
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            return self._cache.setdefault(key, got)

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Text that `re.fullmatch(pattern, text)` accepts."""
        if not isinstance(pattern, str):
            raise ValueError(f"regex must be a string, got {type(pattern).__name__}")
        return self._cached("regex", pattern, lambda d: RegexAutomaton(parse_regex(pattern), d))

    def compile_choices(self, strings: Sequence[str]) -> CompiledGrammar:
        """Exactly one of `strings`."""
        items = list(strings)
        if not items or not all(isinstance(s, str) for s in items):
            raise ValueError("choices must be a non-empty list of strings")
        ir = Alt(tuple(literal(s) for s in items))
        return self._cached("choices", json.dumps(items), lambda d: RegexAutomaton(ir, d))

    def compile_json_schema(
        self, schema: dict | str | bool, whitespace_pattern: str | None = None
    ) -> CompiledGrammar:
        """JSON text valid under `schema` (see `radixflow.grammars.json_schema` for the form)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"JSON schema text is not valid JSON: {exc}") from None
        if whitespace_pattern is not None:
            try:
                re.compile(whitespace_pattern)
            except re.error as exc:
                raise ValueError(f"invalid whitespace_pattern: {exc}") from None
        source = json.dumps([schema, whitespace_pattern])

        def build(deadline: Deadline):
            ir, defs = schema_to_ir(schema, whitespace_pattern, deadline)
            if not defs:
                return RegexAutomaton(ir, deadline)
            defs = {"start": ir, **defs}
            return GrammarAutomaton(bnf_from_ebnf(defs, "start"), deadline)

        return self._cached("json_schema", source, build)

    def compile_lark(self, text: str) -> CompiledGrammar:
        """A Lark grammar (start rule `start`, `%ignore` honoured, terminals as regexes)."""
        if not isinstance(text, str):
            raise ValueError("grammar must be a string")
        return self._cached("lark", text, lambda d: GrammarAutomaton(lark_to_bnf(text), d))

    def compile_ebnf(self, text: str) -> CompiledGrammar:
        """A GBNF grammar as llama.cpp writes it (start rule `root`)."""
        if not isinstance(text, str):
            raise ValueError("grammar must be a string")
        return self._cached(
            "ebnf", text, lambda d: GrammarAutomaton(lark_to_bnf(gbnf_to_lark(text)), d)
        )
