"""Lark grammar text -> BNF, using lark's own grammar loader (imports, templates, `~` repeats).

Grammars come from requests, and lark's loader cannot be interrupted, so what could make it
slow or reach outside is bounded on lark's parse tree of the text before the loader runs:
- the text has at most `MAX_GRAMMAR_CHARS` characters;
- `%import` reads only the grammars bundled with lark (`common`, `lark`, `python`, `unicode`)
  and `.lark` files under the configured `import_paths`; a relative import in the request's
  grammar, or any other name, is refused before a file is opened;
- lark multiplies inline alternatives out (`(a|b) (c|d)` becomes four expansions, `x? y?`
  four, `(a|b) ~ 0..20` over a million), so the expansions it would build are counted and
  capped at `MAX_EXPANSIONS`;
- terminals that name terminals are copied out by lark in time exponential in the nesting
  (`T1: T0 T0`, `T2: T1 T1`, ...), so what such names add is capped at `MAX_TERMINAL_GROWTH`;
- a template may not pass a template instance on inside its own body (`_t{x}: x | _t{_t{x}}`
  would make lark instantiate templates without end).
This counts what lark 1.2-1.3 does (`REPEAT_BREAK_THRESHOLD` and `SMALL_FACTOR_THRESHOLD`
come from its loader).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import lark
from lark import Tree
from lark.exceptions import GrammarError, LarkError
from lark.grammar import Terminal
from lark.load_grammar import (
    REPEAT_BREAK_THRESHOLD,
    SMALL_FACTOR_THRESHOLD,
    _parse_grammar,
    load_grammar,
)

from .cfg import BNF, nullable_ir
from .nfa import Deadline
from .regex_parse import parse_regex

MAX_GRAMMAR_CHARS = 100_000
MAX_EXPANSIONS = 10_000
MAX_TERMINAL_GROWTH = 2_000
BUNDLED_GRAMMARS = os.path.join(os.path.dirname(lark.__file__), "grammars")

# lark's common.ESCAPED_STRING relies on a look-behind; this is the language its lexer produces.
_REGULAR_EQUIVALENTS = {r'".*?(?<!\\)(\\\\)*?"': r'"([^"\\\n]|\\[^\n])*"'}


class ImportLoader:
    """A lark import source that reads the bundled grammars and `import_paths`, nothing else."""

    def __init__(self, import_paths: Sequence[str] = ()):
        self.roots = [os.path.realpath(p) for p in import_paths] + [BUNDLED_GRAMMARS]

    def __call__(self, base_path, grammar_path: str) -> tuple[str, str]:
        # lark passes base_path None for `%import name...` and the importing grammar's folder
        # for `%import .name...`; the request's own grammar has no folder (an empty one).
        if base_path is not None and not (
            isinstance(base_path, str) and os.path.isabs(base_path) and self._allowed(base_path)
        ):
            raise ValueError("relative %import is not allowed in a request's grammar")
        for root in self.roots if base_path is None else [base_path]:
            path = os.path.realpath(os.path.join(root, grammar_path))
            if self._allowed(path) and os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    return path, f.read()
        bundled = sorted(n[:-5] for n in os.listdir(BUNDLED_GRAMMARS) if n.endswith(".lark"))
        raise ValueError(
            f"%import {grammar_path[:-5].replace(os.sep, '.')!r}: no such grammar; imports may "
            f"name lark's bundled grammars ({', '.join(bundled)}) or files under "
            "grammar_import_paths"
        )

    def _allowed(self, path: str) -> bool:
        return any(os.path.commonpath([root, path]) == root for root in self.roots)


def lark_to_bnf(
    text: str,
    deadline: Deadline | None = None,
    import_paths: Sequence[str] = (),
    start: str = "start",
) -> BNF:
    """BNF for a Lark grammar; every terminal becomes its regex."""
    deadline = deadline or Deadline(None)
    check_length(text)
    try:
        _check_size(_parse_grammar(text, "<grammar>"))
        deadline.check()
        grammar, _ = load_grammar(text, "<grammar>", [ImportLoader(import_paths)], False)
        deadline.check()
        terminals, rules, ignore = grammar.compile([start], set())
    except (GrammarError, LarkError) as exc:
        raise ValueError(f"invalid Lark grammar: {exc}") from None
    return _lower(terminals, rules, ignore, start, deadline)


def check_length(text: str) -> None:
    """Raise ValueError if a grammar's text is longer than `MAX_GRAMMAR_CHARS`."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(
            f"grammar has {len(text)} characters, more than the limit of {MAX_GRAMMAR_CHARS} "
            "(MAX_GRAMMAR_CHARS)"
        )


def _check_size(tree: Tree) -> None:
    """Raise ValueError if lark would take long on the grammar with parse tree `tree`."""
    rules: list[Tree] = []
    terms: dict[str, Tree] = {}
    for stmt in tree.children:
        if stmt.data in ("override", "extend"):
            stmt = stmt.children[0]
        if stmt.data == "rule":
            rules.append(stmt)
        elif stmt.data == "term":
            terms[stmt.children[0]] = stmt.children[-1]
    count = _Expansions()
    total = sum(count.of(rule.children[-1]) for rule in rules) + count.extra
    if total > MAX_EXPANSIONS:
        raise ValueError(
            f"grammar expands to more than {MAX_EXPANSIONS} rule alternatives (MAX_EXPANSIONS); "
            "lark multiplies out inline alternatives, optionals and short ~ repeats, so give "
            "them rules of their own"
        )
    if _TerminalGrowth(terms).total() > MAX_TERMINAL_GROWTH:
        raise ValueError(
            f"terminals that name terminals grow by more than {MAX_TERMINAL_GROWTH} parts "
            "(MAX_TERMINAL_GROWTH) once the names are replaced by their definitions"
        )
    for rule in rules:
        if rule.children[2].children and _passes_instances(rule.children[-1]):
            raise ValueError(
                f"template {rule.children[1]} passes a template instance on in its own body, "
                "which can instantiate templates without end"
            )


def _passes_instances(body: Tree) -> bool:
    """Does a template body use a template with a template instance as an argument?"""
    return any(
        isinstance(arg, Tree) and any(arg.find_data("template_usage"))
        for use in body.find_data("template_usage")
        for arg in use.children[1:]
    )


class _Expansions:
    """Counts the alternatives lark builds for rule trees (saturating just past the cap)."""

    def __init__(self) -> None:
        self.extra = 0  # alternatives of the helper rules lark adds (`*`, `+`, long `~`)

    def of(self, tree) -> int:
        """Alternatives that `tree` contributes to the rule it is inlined in."""
        if not isinstance(tree, Tree):
            return 1
        if tree.data == "expr":
            inner = self.of(tree.children[0])
            return self._expr(inner, tree.children[1], [int(t) for t in tree.children[2:]])
        kids = [self.of(t) for t in tree.children]
        if tree.data == "expansions":
            return _cap(sum(kids))
        if tree.data == "maybe":
            return _cap(kids[0] + 1)
        return _product(kids)  # a sequence, or a leaf

    def _expr(self, inner: int, op: str, bounds: list[int]) -> int:
        if op == "?":
            return _cap(inner + 1)
        if op in ("*", "+"):
            self.extra = _cap(self.extra + 2 * inner)  # _r: _r item | item
            return 1 + (op == "*")
        low, high = bounds[0], bounds[-1]
        if high < REPEAT_BREAK_THRESHOLD:  # inlined as one alternative per count
            return _cap(sum(_power(inner, n) for n in range(low, high + 1)))
        # split into helper rules of at most SMALL_FACTOR_THRESHOLD copies, about one per bit
        per_rule = _power(inner, SMALL_FACTOR_THRESHOLD) + SMALL_FACTOR_THRESHOLD
        self.extra = _cap(self.extra + _product([per_rule, high.bit_length()]))
        return 1


class _TerminalGrowth:
    """What naming terminals inside terminals adds, in parse tree leaves (saturating)."""

    def __init__(self, terms: dict[str, Tree]):
        self.terms = terms
        self.sizes: dict[str, int] = {}

    def total(self) -> int:
        return _cap(sum(map(self._named, self.terms.values())), MAX_TERMINAL_GROWTH)

    def _named(self, tree: Tree) -> int:
        """Leaves that the terminal names in `tree` stand for."""
        names = tree.scan_values(lambda v: isinstance(v, Terminal))
        return _cap(sum(self._size(t.name) for t in names), MAX_TERMINAL_GROWTH)

    def _size(self, name: str) -> int:
        """Leaves of terminal `name` with the terminals it names replaced (1 if not ours)."""
        got = self.sizes.get(name)
        if got is None:
            self.sizes[name] = 1  # a cycle, which lark reports itself
            tree = self.terms.get(name)
            if tree is not None:
                leaves = sum(1 for _ in tree.scan_values(lambda v: True))
                self.sizes[name] = _cap(leaves + self._named(tree), MAX_TERMINAL_GROWTH)
            got = self.sizes[name]
        return got


def _cap(n: int, limit: int = MAX_EXPANSIONS) -> int:
    """`n`, or just past `limit` (counts saturate there, so they stay small ints)."""
    return min(n, limit + 1)


def _product(factors: list[int]) -> int:
    out = 1
    for f in factors:
        out = _cap(out * f)
    return out


def _power(base: int, exp: int) -> int:
    return _product([base] * min(exp, MAX_EXPANSIONS.bit_length() + 1)) if base > 1 else base


def _lower(terminals, rules, ignore, start: str, deadline: Deadline) -> BNF:
    """Our BNF from lark's compiled terminals and rules."""
    index: dict[str, int] = {}
    bnf = BNF(start=start)
    for term in terminals:
        deadline.check()
        if term.pattern is None:
            raise ValueError(f"terminal {term.name} is declared but has no pattern")
        try:
            pattern = term.pattern.to_regexp()
            ir = parse_regex(_REGULAR_EQUIVALENTS.get(pattern, pattern))
        except ValueError as exc:
            raise ValueError(f"terminal {term.name}: {exc}") from None
        index[term.name] = len(bnf.terminals)
        bnf.terminals.append(ir)
    # A terminal that can match empty text stands for "empty or one non-empty lexeme".
    sym: dict[str, object] = dict(index)
    for name, t in index.items():
        if nullable_ir(bnf.terminals[t]):
            sym[name] = f"__maybe_{name}"
            bnf.rules += [(sym[name], ()), (sym[name], (t,))]
    for i, rule in enumerate(rules):
        if i % 1024 == 0:
            deadline.check()
        syms = tuple(sym[s.name] if s.is_term else str(s.name) for s in rule.expansion)
        bnf.rules.append((str(rule.origin.name), syms))
    for name in ignore:
        if name not in index:
            raise ValueError(f"%ignore names unknown terminal {name}")
        bnf.ignore.append(index[name])
    return bnf
