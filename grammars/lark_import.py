"""Lark grammar text -> BNF, using lark's own grammar loader (imports, templates, `~` repeats)."""

from __future__ import annotations

from lark.exceptions import GrammarError, LarkError
from lark.load_grammar import load_grammar

from .cfg import BNF, nullable_ir
from .regex_ir import parse_regex

# lark's common.ESCAPED_STRING relies on a look-behind; this is the language its lexer produces.
_REGULAR_EQUIVALENTS = {r'".*?(?<!\\)(\\\\)*?"': r'"([^"\\\n]|\\[^\n])*"'}


def lark_to_bnf(text: str, start: str = "start") -> BNF:
    """BNF for a Lark grammar; every terminal becomes its regex."""
    try:
        grammar, _ = load_grammar(text, "<grammar>", [], False)
        terminals, rules, ignore = grammar.compile([start], set())
    except (GrammarError, LarkError) as exc:
        raise ValueError(f"invalid Lark grammar: {exc}") from None
    index: dict[str, int] = {}
    bnf = BNF(start=start)
    for term in terminals:
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
    for rule in rules:
        syms = tuple(sym[s.name] if s.is_term else str(s.name) for s in rule.expansion)
        bnf.rules.append((str(rule.origin.name), syms))
    for name in ignore:
        if name not in index:
            raise ValueError(f"%ignore names unknown terminal {name}")
        bnf.ignore.append(index[name])
    return bnf
