"""GrammarCompiler: one per tokenizer; compiles grammar sources into cached CompiledGrammars."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from .automaton import ByteAutomaton, RegexAutomaton
from .budget import GrammarLimits
from .cfg import GrammarAutomaton, bnf_from_ebnf
from .gbnf import gbnf_to_lark
from .json_schema import schema_to_ir
from .json_schema_memo import shared_memo
from .json_schema_resolve import parse_schema_source, schema_doc
from .json_schema_strings import warm_formats
from .lark_import import lark_to_bnf
from .matcher import CompiledGrammar
from .native_rows import dfa_rows
from .native_walk import prepare as prepare_mask_walk
from .nfa import Deadline, untrack_ir
from .reaper import busy, reaper
from .regex_ir import Alt, literal
from .regex_parse import parse_regex, warm_unicode_classes
from .regex_terms import regex_derivs
from .source_kinds import SourceKinds
from .tokenizer_index import get_tokenizer_index

Build = Callable[[Deadline], ByteAutomaton]  # makes a source's automaton within a deadline


# MiB of compiled grammars kept; a grammar past it on its own stays only while in use.
DEFAULT_CACHE_MB = 256.0
RECENT_PLANS = 32  # text sources whose plan (cache key, build) is kept


class GrammarCompiler(SourceKinds[CompiledGrammar]):
    """Compile regexes, JSON Schemas, Lark/GBNF grammars and choice lists for one tokenizer.

    `vocab_size` is the model's vocabulary (its embedding rows), which may exceed the
    tokenizer's length; ids past the tokenizer are never allowed. `compile_timeout` bounds
    each compilation in seconds (`CompileTimeout` is raised past it); `limits` bound what each
    compiled grammar builds as it is used. Compiled grammars are cached by source, least
    recently used first out once their bytes (which grow with use) pass `cache_mb`; the IR of
    JSON Schemas' `$ref`-free sub-schemas is shared by every compile in the process
    (`json_schema_memo`, bounded).

    Malformed sources, sources past a size limit and compilations past the time limit all
    raise ValueError (`CompileTimeout` is one) naming the problem or the limit. Lark `%import`
    reads lark's bundled grammars and `.lark` files under `import_paths`, nothing else.
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        compile_timeout: float = 10.0,
        limits: GrammarLimits | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
        import_paths: Sequence[str] = (),
    ):
        self.index = get_tokenizer_index(tokenizer, vocab_size, eos_token_ids)
        warm_unicode_classes()
        warm_formats()
        # What the first compile and mask would otherwise wait for: the C schema walks, regex
        # derivatives, rows and trie walk (built on first use) and the tokenizer's trie.
        schema_doc()
        regex_derivs()
        dfa_rows()
        prepare_mask_walk(self.index)
        self.compile_timeout = compile_timeout
        self.import_paths = tuple(import_paths)
        self.limits = limits or GrammarLimits()
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._cache_bytes = cache_mb * 2**20
        # Bytes of each cached grammar when last counted, their total, and the calls since
        # every grammar was last counted (see `_shrink`).
        self._sizes: dict[tuple[str, str], int] = {}
        self._total = 0
        self._calls = 0
        self._plans: OrderedDict[tuple, tuple[str, Build]] = OrderedDict()  # by text source
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    @property
    def cache_nbytes(self) -> int:
        """Bytes the cached grammars hold now."""
        with self._lock:
            return sum(g.nbytes for g in self._cache.values())

    @property
    def cache_len(self) -> int:
        """Number of cached grammars."""
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget every cached grammar (matchers keep theirs alive while they are used)."""
        with self._lock:
            dropped = list(self._cache.values())
            self._cache = OrderedDict()
            self._sizes.clear()
            self._total = 0
        reaper.drop(dropped)

    def _cached(self, kind: str, source: str, build: Callable) -> CompiledGrammar:
        key = (kind, source)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                dropped = self._shrink(key)  # cached grammars grow as requests use them
        if got is not None:
            reaper.drop(dropped)
            return got
        deadline = Deadline(self.compile_timeout)
        with busy:  # the reaper takes no slice meanwhile (see `reaper.busy`)
            automaton = build(deadline)
            deadline.check()  # lazy builds may do no work that checks the clock on the way
            got = CompiledGrammar(self.index, automaton, kind, source, self.limits)
        with self._lock:
            got = self._cache.setdefault(key, got)
            self._cache.move_to_end(key)
            dropped = self._shrink(key)
        # A walked grammar holds up to hundreds of thousands of objects and takes milliseconds
        # to free: on the reaper's thread, a slice at a time (`reaper`), not in this compile.
        reaper.drop(dropped)
        return got

    def _shrink(self, used: tuple[str, str]) -> list[CompiledGrammar]:
        """Count the grammar under `used` again and drop least recently used grammars until
        the rest fit in the cache's bytes; returns those dropped. Grammars grow as requests use
        them: every grammar is counted again once every len(cache) // 16 calls, so that a call
        costs the same however many grammars the cache holds."""
        self._calls += 1
        if self._calls >= len(self._cache) // 16:
            self._sizes = {k: g.nbytes for k, g in self._cache.items()}
            self._total = sum(self._sizes.values())
            self._calls = 0
        else:
            size = self._cache[used].nbytes
            self._total += size - self._sizes.get(used, 0)
            self._sizes[used] = size
        dropped = []
        while self._total > self._cache_bytes:
            key, grammar = self._cache.popitem(last=False)
            self._total -= self._sizes.pop(key)
            dropped.append(grammar)
        return dropped

    def compile(self, kind: str, source, *options) -> CompiledGrammar:
        """`source` as `kind`: regex, choices, json_schema (+ whitespace_pattern), lark, ebnf."""
        with _input_errors(kind):
            return self._cached(kind, *self._planned(kind, source, *options))

    def cache_key(self, kind: str, source, *options) -> tuple[str, str]:
        """The key `compile` caches `source` under; ValueError if the source is malformed."""
        with _input_errors(kind):
            return kind, self._planned(kind, source, *options)[0]

    def lookup(self, key: tuple[str, str]) -> CompiledGrammar | None:
        """The cached grammar under `key` (see `cache_key`), or None; never compiles."""
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
            return got

    def _planned(self, kind: str, source, *options) -> tuple[str, Build]:
        """`_plan`, kept for the last few text sources: a caller asks `cache_key`, then
        `compile` for the same source (the engine does), and a plan parses and canonicalizes."""
        if not isinstance(source, str) or not all(isinstance(o, str | None) for o in options):
            return self._plan(kind, source, *options)
        key = (kind, source, *options)
        with self._lock:
            got = self._plans.get(key)
            if got is not None:
                self._plans.move_to_end(key)
                return got
        got = self._plan(kind, source, *options)
        with self._lock:
            self._plans[key] = got
            if len(self._plans) > RECENT_PLANS:
                self._plans.popitem(last=False)
        return got

    def _plan(self, kind: str, source, *options) -> tuple[str, Build]:
        """(cache key, build function) for a source; ValueError if it is malformed."""
        plans = {
            "regex": self._plan_regex,
            "choices": self._plan_choices,
            "json_schema": self._plan_json_schema,
            "lark": self._plan_lark,
            "ebnf": self._plan_ebnf,
        }
        if kind not in plans:
            raise ValueError(f"unknown grammar kind {kind!r} (known: {', '.join(plans)})")
        return plans[kind](source, *options)

    def _plan_regex(self, pattern: str) -> tuple[str, Build]:
        if not isinstance(pattern, str):
            raise ValueError(f"regex must be a string, got {type(pattern).__name__}")
        return pattern, lambda d: RegexAutomaton(parse_regex(pattern), d)

    def _plan_choices(self, strings: Sequence[str]) -> tuple[str, Build]:
        items = list(strings)
        if not items or not all(isinstance(s, str) for s in items):
            raise ValueError("choices must be a non-empty list of strings")
        ir = Alt(tuple(literal(s) for s in items))
        return json.dumps(items), lambda d: RegexAutomaton(ir, d)

    def _plan_json_schema(
        self, schema: dict | str | bool, whitespace_pattern: str | None = None
    ) -> tuple[str, Build]:
        # Built from the canonical form, so that the key (equal for keyword orders that do not
        # change the language) fully determines the grammar.
        source = parse_schema_source(schema, whitespace_pattern)

        def build(deadline: Deadline) -> ByteAutomaton:
            ir, defs = schema_to_ir(
                source.canonical,
                whitespace_pattern,
                deadline,
                self.limits.free_value_depth,
                shared_memo(),
                self.limits.json_key_order,
            )
            if not defs:
                return RegexAutomaton(ir, deadline)
            defs = {"start": ir, **defs}
            automaton = GrammarAutomaton(bnf_from_ebnf(defs, "start", deadline), deadline)
            untrack_ir(*defs.values())  # the rules' IR, kept by the sub-schema memo
            return automaton

        return source.key, build

    def _plan_lark(self, text: str) -> tuple[str, Build]:
        if not isinstance(text, str):
            raise ValueError("grammar must be a string")
        return text, lambda d: GrammarAutomaton(lark_to_bnf(text, d, self.import_paths), d)

    def _plan_ebnf(self, text: str) -> tuple[str, Build]:
        if not isinstance(text, str):
            raise ValueError("grammar must be a string")
        return text, lambda d: GrammarAutomaton(lark_to_bnf(gbnf_to_lark(text), d), d)


@contextlib.contextmanager
def _input_errors(kind: str) -> Iterator[None]:
    """Turn what malformed input makes Python raise into ValueErrors that say so."""
    try:
        yield
    except RecursionError:
        raise ValueError(
            f"{kind} is nested too deeply to compile (Python's recursion limit of "
            f"{sys.getrecursionlimit()} frames)"
        ) from None
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        if kind != "json_schema":
            raise
        # a keyword whose value has the wrong JSON type, e.g. "required": 5
        raise ValueError(f"malformed JSON schema ({type(exc).__name__}: {exc})") from None
