"""Grammar (CFG) automaton rows, computed from cached lexer byte groups (one state per live lexer
target when a parser state has one element, columns grouped when it has several), against a
byte-by-byte reference of what a row means."""

import gc

import numpy as np

from radixflow.grammars.cfg import GrammarAutomaton, bnf_from_ebnf
from radixflow.grammars.nfa import Deadline
from radixflow.grammars.regex_ir import Alt, Ref, Repeat, Seq, literal
from radixflow.grammars.regex_parse import parse_regex


def nested_lists() -> GrammarAutomaton:
    """`value ::= [a-c]{1,3} | "ab" | "[" (value ("," value)*)? "]"`: recursion, so parser
    states hold several lexer elements (a name may end or go on; "ab" or a longer name)."""
    value = Alt((
        parse_regex("[a-c]{1,3}"),
        literal("ab"),
        Seq((literal("["), Repeat(Seq((Ref("value"), Repeat(Seq((literal(","), Ref("value"))),
                                                             0, None))), 0, 1), literal("]"))),
    ))  # fmt: skip
    bnf = bnf_from_ebnf({"start": Ref("value"), "value": value}, "start", Deadline(20.0))
    return GrammarAutomaton(bnf, Deadline(20.0))


def reference_successor(auto: GrammarAutomaton, state: int, byte: int) -> frozenset:
    """The elements after `byte`: each element's lexer step, expanded by the parser."""
    out: frozenset = frozenset()
    for node, lex, _fresh in auto.sets[state]:
        if lex >= 0:
            t = int(auto.lexer.row(lex)[byte])
            if t >= 0:
                out |= set(auto._successors(node, t))
    return out


def test_grammar_rows_match_a_byte_by_byte_reference():
    auto = nested_lists()
    todo, seen, sizes = [auto.initial], {auto.initial}, set()
    while todo and len(seen) < 300:
        state = todo.pop(0)
        row = auto.row(state)
        sizes.add(min(2, sum(lex >= 0 for _n, lex, _f in auto.sets[state])))
        for b in range(256):
            want = reference_successor(auto, state, b)
            got = int(row[b])
            assert (got < 0 and not want) or frozenset(auto.sets[got]) == want, (state, b)
        for t in np.unique(row[row >= 0]).tolist():
            if t not in seen:
                seen.add(t)
                todo.append(t)
    assert sizes >= {1, 2}  # both the one-element and the several-element paths ran
    assert len(seen) > 20


def test_a_walked_grammar_leaves_nothing_for_the_cyclic_collector_to_walk():
    """Earley items, waiting lists and parser states are tuples of ints (sets by number), and
    the chart is lists of dicts and tuples of ints (no object per set), so after a collection
    a walked grammar is out of the collector's sight: a cache of walked grammars does not make
    each full collection walk every item. (Where the rows are in C, the chart is out of its
    sight as it is made: `test_grammar_native_rows`.)"""
    auto = nested_lists()
    todo, seen = [auto.initial], {auto.initial}
    while todo and len(seen) < 200:
        for t in np.unique(auto.row(todo.pop(0))).tolist():
            if t >= 0 and t not in seen:
                seen.add(t)
                todo.append(t)
    gc.collect()
    gc.collect()  # a tuple of tuples is let go once its items are, at a collection after
    parser = auto.parser
    assert len(parser.waiting) > 5 and len(seen) >= 200
    assert not any(gc.is_tracked(auto.sets[s]) for s in seen)
    assert not any(map(gc.is_tracked, (*parser.waiting, *parser.expected, *parser.next)))
