"""Constrained decoding: regexes, JSON Schemas, Lark/GBNF grammars and choice lists as token masks.

compiler = GrammarCompiler(tokenizer)
grammar = compiler.compile_json_schema({"type": "object", ...})
m = grammar.matcher()
bitmask = allocate_token_bitmask(batch, compiler.vocab_size)
m.fill_mask(bitmask[i]); ...; m.accept(token_id)
"""

from .budget import GrammarBudgetExceeded, GrammarLimits
from .compiler import GrammarCompiler
from .masks import allocate_token_bitmask
from .matcher import CompiledGrammar, GrammarMatcher
from .nfa import CompileTimeout

__all__ = [
    "CompileTimeout",
    "CompiledGrammar",
    "GrammarBudgetExceeded",
    "GrammarCompiler",
    "GrammarLimits",
    "GrammarMatcher",
    "allocate_token_bitmask",
]
