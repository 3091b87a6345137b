"""What the peer backends (llguidance, xgrammar) share: sources, the by-source cache, time limits.

A peer compiler has GrammarCompiler's engine-facing surface: `compile(kind, source, *options)`
(and `compile_regex`, ... ), `cache_key` (the same key GrammarCompiler gives, so a fallback can
find either's grammar under one key), `lookup`, `cache_nbytes`, `clear_cache`, and `index` (our
per-tokenizer data, for token bytes). Subclasses say how one source becomes the peer's grammar.

Time limits: the peers' compilers cannot be interrupted, so a compilation runs on a helper
thread and the caller waits at most `compile_timeout` for it; past that it gets
`CompileTimeout` (as from our own compiler) and the compilation finishes unobserved, its result
dropped.
"""

from __future__ import annotations

import importlib
import json
import threading
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from .budget import GrammarLimits
from .compiler import DEFAULT_CACHE_MB
from .json_schema_resolve import parse_schema_source
from .nfa import CompileTimeout
from .peer_matcher import GrammarOptions, PeerGrammar
from .source_kinds import SourceKinds
from .tokenizer_index import TokenizerIndex, get_tokenizer_index

_T = TypeVar("_T")
KINDS = ("regex", "choices", "json_schema", "lark", "ebnf")


@dataclass(frozen=True)
class GrammarSource:
    """One checked grammar source: `key` is its cache key text, `value` what the peer compiles
    (the regex / Lark / GBNF text, the list of choices, or (schema, whitespace_pattern))."""

    kind: str
    key: str
    value: Any


def grammar_source(kind: str, source: Any, *options: Any) -> GrammarSource:
    """`source` as `kind`, checked as GrammarCompiler checks it; ValueError if malformed."""
    if kind not in KINDS:
        raise ValueError(f"unknown grammar kind {kind!r} (known: {', '.join(KINDS)})")
    if kind == "choices":
        items = list(source)
        if not items or not all(isinstance(s, str) for s in items):
            raise ValueError("choices must be a non-empty list of strings")
        return GrammarSource(kind, json.dumps(items), items)
    if kind == "json_schema":
        return _json_schema_source(source, *options)
    if not isinstance(source, str):
        what = "regex" if kind == "regex" else "grammar"
        raise ValueError(f"{what} must be a string, got {type(source).__name__}")
    return GrammarSource(kind, source, source)


def _json_schema_source(
    schema: dict | str | bool, whitespace_pattern: str | None = None
) -> GrammarSource:
    source = parse_schema_source(schema, whitespace_pattern)  # GrammarCompiler's key
    return GrammarSource("json_schema", source.key, (source.schema, whitespace_pattern))


def choices_regex(items: Sequence[str]) -> str:
    """A regex matching exactly one of `items`, in the syntax every peer reads: ASCII letters,
    digits and non-ASCII characters as themselves, other ASCII characters as `\\uHHHH`
    (xgrammar reads `\\x` with as many hex digits as follow)."""
    return "|".join(
        "".join(c if c.isalnum() or ord(c) > 127 else f"\\u{ord(c):04x}" for c in item)
        for item in items
    )


def call_within(seconds: float, work: Callable[[], _T]) -> _T:
    """`work()` on a helper thread, waited for at most `seconds` (see the module docstring)."""
    done: Future[_T] = Future()

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            done.set_exception(exc)

    threading.Thread(target=run, name="radixflow-peer-compile", daemon=True).start()
    try:
        return done.result(timeout=seconds)
    except TimeoutError:
        raise CompileTimeout(
            f"grammar compilation exceeded its time limit of {seconds:g} s "
            "(grammar_compile_timeout)"
        ) from None


class PeerCompiler(SourceKinds[PeerGrammar]):
    """Compile sources with a peer engine for one tokenizer; cached by source like ours.

    `vocab_size` is the model's (mask rows have ceil(vocab_size/32) words); `eos_token_ids`
    end the text where the grammar allows it (default: the tokenizer's EOS).
    """

    name: ClassVar[str]  # the backend's name, also the extra that installs it
    package: ClassVar[str]  # the import name of the peer's package

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        compile_timeout: float = 10.0,
        limits: GrammarLimits | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
    ) -> None:
        self.peer = self.load()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size if vocab_size is not None else len(tokenizer)
        eos = eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.eos_token_ids = sorted(eos)
        self.compile_timeout = compile_timeout
        self.limits = limits or GrammarLimits()
        self._cache: OrderedDict[tuple[str, str], PeerGrammar] = OrderedDict()
        self._cache_bytes = cache_mb * 2**20
        self._lock = threading.Lock()

    @classmethod
    def load(cls) -> ModuleType:
        """The peer's package; ImportError naming the extra that installs it when it is absent."""
        try:
            return importlib.import_module(cls.package)
        except ImportError as exc:
            raise ImportError(
                f"the {cls.name} grammar backend needs the {cls.package} package: "
                f'pip install "radixflow[{cls.name}]"'
            ) from exc

    @property
    def index(self) -> TokenizerIndex:
        """Our per-tokenizer data (each token's bytes), shared with our own compiler."""
        return get_tokenizer_index(self.tokenizer, self.vocab_size, self.eos_token_ids)

    @property
    def cache_nbytes(self) -> int:
        with self._lock:
            return sum(g.nbytes for g in self._cache.values())

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def cache_key(self, kind: str, source: Any, *options: Any) -> tuple[str, str]:
        """The key `compile` caches `source` under; ValueError if the source is malformed."""
        return kind, grammar_source(kind, source, *options).key

    def lookup(self, key: tuple[str, str]) -> PeerGrammar | None:
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
            return got

    def compile(self, kind: str, source: Any, *options: Any) -> PeerGrammar:
        """`source` as `kind` (regex, choices, json_schema (+ whitespace_pattern), lark, ebnf)."""
        src = grammar_source(kind, source, *options)
        hit = self.lookup((kind, src.key))
        if hit is not None:
            return hit
        got = call_within(self.compile_timeout, lambda: self.build(src))
        with self._lock:
            got = self._cache.setdefault((kind, src.key), got)
            self._cache.move_to_end((kind, src.key))
            total = sum(g.nbytes for g in self._cache.values())
            while total > self._cache_bytes:
                total -= self._cache.popitem(last=False)[1].nbytes
            return got

    def grammar_options(self, src: GrammarSource) -> GrammarOptions:
        """What the matchers of `src`'s grammar need besides the peer's objects."""
        words = (self.vocab_size + 31) // 32
        eos = frozenset(self.eos_token_ids)
        return GrammarOptions(src.kind, src.key, words, eos, self.limits.step_timeout)

    @abstractmethod
    def build(self, src: GrammarSource) -> PeerGrammar:
        """The peer's compiled grammar for `src`; ValueError naming the peer when it refuses."""
