"""Grammar backends: our own engine or a peer (llguidance, xgrammar) behind one interface.

    compiler = make_compiler("llguidance", tokenizer, vocab_size, eos_ids, compile_timeout=10.0)
    grammar = compiler.compile("json_schema", schema)    # cached by source
    m = grammar.matcher()                                 # fill_mask / accept / rollback / ...

Every backend's compiler meets `Compiler` (GrammarCompiler's engine-facing surface), its
grammars `Grammar`, its matchers `Matcher` (DESIGN.md §5's cursor). The peers are optional
extras, imported only when chosen; `require_backend` says which extra to install.

With a fallback, a source the first backend refuses at compile time (any ValueError: a keyword
it does not implement, one of its size limits, `CompileTimeout`) is compiled by the fallback,
and a warning names both; the fallback's grammar is then cached under the same key, so the
warning comes once per grammar while it stays cached. A malformed source (bad JSON text, a
non-string regex) is refused before either compiles. A matcher that exceeds its budget while
decoding fails its request as usual: a request never changes backend midway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from .budget import GrammarLimits
from .compiler import DEFAULT_CACHE_MB, GrammarCompiler
from .peer_compiler import PeerCompiler
from .peer_llguidance import LLGuidanceCompiler
from .peer_xgrammar import XGrammarCompiler
from .tokenizer_index import TokenizerIndex

logger = logging.getLogger(__name__)

PEERS: dict[str, type[PeerCompiler]] = {
    "llguidance": LLGuidanceCompiler,
    "xgrammar": XGrammarCompiler,
}
BACKENDS = ("radixflow", *PEERS)


class Matcher(Protocol):
    """One request's cursor over a compiled grammar."""

    @property
    def num_accepted(self) -> int: ...

    def fill_mask(self, bitmask_row: torch.Tensor) -> None: ...

    def accept(self, token_id: int) -> bool: ...

    def rollback(self, n: int) -> None: ...

    def forced_text(self) -> str: ...

    def is_terminated(self) -> bool: ...


class Grammar(Protocol):
    """A compiled grammar: immutable, cached by source, shared by its matchers."""

    @property
    def nbytes(self) -> int: ...

    def matcher(self) -> Matcher: ...

    def prepare(self) -> None: ...


class Compiler(Protocol):
    """Compiles sources for one tokenizer and caches them by source."""

    @property
    def index(self) -> TokenizerIndex: ...

    @property
    def cache_nbytes(self) -> int: ...

    def compile(self, kind: str, source: Any, *options: Any) -> Grammar: ...

    def cache_key(self, kind: str, source: Any, *options: Any) -> tuple[str, str]: ...

    def lookup(self, key: tuple[str, str]) -> Grammar | None: ...

    def clear_cache(self) -> None: ...


def require_backend(name: str) -> None:
    """ValueError for an unknown backend, ImportError naming the extra for a missing peer."""
    if name not in BACKENDS:
        raise ValueError(f"unknown grammar backend {name!r} (known: {', '.join(BACKENDS)})")
    if name in PEERS:
        PEERS[name].load()


def make_compiler(
    backend: str,
    tokenizer: Any,
    vocab_size: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
    *,
    compile_timeout: float = 10.0,
    limits: GrammarLimits | None = None,
    cache_mb: float = DEFAULT_CACHE_MB,
    import_paths: Sequence[str] = (),
    fallback: str | None = None,
) -> Compiler:
    """The compiler of `backend`, with `fallback`'s behind it when one is given.

    `import_paths` (Lark `%import` of files) is ours alone: the peers import no files.
    """

    def one(name: str) -> Compiler:
        require_backend(name)
        if name == "radixflow":
            return GrammarCompiler(
                tokenizer, vocab_size, eos_token_ids, compile_timeout=compile_timeout,
                limits=limits, cache_mb=cache_mb, import_paths=import_paths,
            )  # fmt: skip
        return PEERS[name](
            tokenizer, vocab_size, eos_token_ids, compile_timeout=compile_timeout, limits=limits,
            cache_mb=cache_mb,
        )  # fmt: skip

    if fallback is None:
        return one(backend)
    if fallback == backend:
        raise ValueError(f"the grammar fallback must differ from the backend ({backend!r})")
    return FallbackCompiler(one(backend), backend, one(fallback), fallback)


class FallbackCompiler:
    """`first`, and `second` for the sources `first` refuses (see the module docstring)."""

    def __init__(self, first: Compiler, first_name: str, second: Compiler, second_name: str):
        self.first, self.first_name = first, first_name
        self.second, self.second_name = second, second_name
        self._fallback_lock = threading.Lock()  # one fallback compilation (and warning) a time

    @property
    def index(self) -> TokenizerIndex:
        return self.first.index

    @property
    def cache_nbytes(self) -> int:
        return self.first.cache_nbytes + self.second.cache_nbytes

    def clear_cache(self) -> None:
        self.first.clear_cache()
        self.second.clear_cache()

    def cache_key(self, kind: str, source: Any, *options: Any) -> tuple[str, str]:
        return self.first.cache_key(kind, source, *options)

    def lookup(self, key: tuple[str, str]) -> Grammar | None:
        return self.first.lookup(key) or self.second.lookup(key)

    def compile(self, kind: str, source: Any, *options: Any) -> Grammar:
        key = self.cache_key(kind, source, *options)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        try:
            return self.first.compile(kind, source, *options)
        except ValueError as refused:
            with self._fallback_lock:  # requests that raced here get the grammar made first
                hit = self.second.lookup(key)
                if hit is not None:
                    return hit
                try:
                    got = self.second.compile(kind, source, *options)
                except ValueError as exc:
                    raise ValueError(
                        f"{refused}; the fallback grammar backend {self.second_name} refused "
                        f"it too: {exc}"
                    ) from None
                logger.warning(
                    "%s compiled by the fallback grammar backend %s: %s refused it (%s)",
                    kind, self.second_name, self.first_name, refused,
                )  # fmt: skip
                return got
