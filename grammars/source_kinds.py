"""The compile call per kind of source (regex, choices, JSON Schema, Lark, GBNF) that every
grammar compiler offers over its one `compile(kind, source, *options)`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

G = TypeVar("G")


class SourceKinds(ABC, Generic[G]):
    @abstractmethod
    def compile(self, kind: str, source: Any, *options: Any) -> G:
        """The grammar of `source`, a `kind` of source, cached by source."""

    def compile_regex(self, pattern: str) -> G:
        """Text that `re.fullmatch(pattern, text)` accepts."""
        return self.compile("regex", pattern)

    def compile_choices(self, strings: Sequence[str]) -> G:
        """Exactly one of `strings`."""
        return self.compile("choices", strings)

    def compile_json_schema(
        self, schema: dict | str | bool, whitespace_pattern: str | None = None
    ) -> G:
        """JSON text valid under `schema` (see `radixflow.grammars.json_schema` for the form)."""
        return self.compile("json_schema", schema, whitespace_pattern)

    def compile_lark(self, text: str) -> G:
        """A Lark grammar (start rule `start`, `%ignore` honoured, terminals as regexes)."""
        return self.compile("lark", text)

    def compile_ebnf(self, text: str) -> G:
        """A GBNF grammar as llama.cpp writes it (start rule `root`)."""
        return self.compile("ebnf", text)
