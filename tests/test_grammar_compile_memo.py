"""Compile-time sharing: sub-schema IR memoised across compiles, IR facts known at construction,
the lazily built "any name but the declared ones" table. Each is compared with its plain twin
(no memo, facts computed from scratch, Python's own string comparison)."""

import gc
import json
import random
from pathlib import Path

import jsonschema
import pytest
from automaton_walk import accepts

from radixflow.grammars import json_schema_memo
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.cfg import GrammarAutomaton, bnf_from_ebnf
from radixflow.grammars.json_schema import SchemaConverter, schema_to_ir
from radixflow.grammars.json_schema_memo import SubschemaMemo, shared_memo
from radixflow.grammars.json_schema_resolve import canonical_schema
from radixflow.grammars.native_rows import dfa_rows
from radixflow.grammars.nfa import Deadline
from radixflow.grammars.regex_algebra import exclude_words
from radixflow.grammars.regex_facts import IrFacts
from radixflow.grammars.regex_ir import (
    Alt,
    Chars,
    Dfa,
    Repeat,
    Seq,
    children,
    literal,
    utf8_sequences,
)
from radixflow.grammars.regex_parse import parse_regex, parse_search_regex
from radixflow.grammars.regex_terms import NEVER

SUITE = Path(__file__).resolve().parents[2] / "shared/peer-data/json-schema-test-suite/tests"


def language(schema, memo: SubschemaMemo | None):
    """The byte automaton of `schema`, built as the compiler builds it, with or without `memo`."""
    ir, defs = schema_to_ir(canonical_schema(schema), None, Deadline(20.0), 16, memo)
    if not defs:
        return RegexAutomaton(ir, Deadline(20.0))
    bnf = bnf_from_ebnf({"start": ir, **defs}, "start", Deadline(20.0))
    return GrammarAutomaton(bnf, Deadline(20.0))


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def suite_groups() -> list[dict]:
    groups = []
    for draft in ("draft2020-12", "draft7"):
        for path in sorted((SUITE / draft).glob("*.json")):
            groups += json.loads(path.read_text())
    return groups


def verdicts(groups: list[dict], memo: SubschemaMemo | None) -> list:
    """Per group: None when it does not compile, else whether each instance is accepted."""
    out = []
    for group in groups:
        try:
            auto = language(group["schema"], memo)
        except ValueError:
            out.append(None)
            continue
        out.append([accepts(auto, compact(case["data"])) for case in group["tests"]])
    return out


@pytest.mark.skipif(not SUITE.is_dir(), reason="JSON-Schema-Test-Suite not in ../shared/peer-data")
def test_memoised_sub_schemas_keep_every_language_of_the_test_suite():
    groups = suite_groups()
    plain = verdicts(groups, None)
    memo = SubschemaMemo()
    # In order, then backwards: each group meets sub-schemas that other documents (drafts
    # with other `$ref` rules included) put in the memo first.
    assert verdicts(groups, memo) == plain
    assert verdicts(groups[::-1], memo) == plain[::-1]
    assert len(memo) > 100
    compiled = [v for v in plain if v is not None]
    assert len(compiled) > 200 and sum(map(len, compiled)) > 1000


def ir_nodes(root) -> set[int]:
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(children(node))
    return seen


ITEM = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"}},
    "required": ["name"],
}


def test_a_sub_schema_seen_in_an_earlier_compile_is_not_converted_again():
    memo = SubschemaMemo()
    first = {"type": "array", "items": ITEM}
    second = {"type": "object", "properties": {"a": {"type": "boolean"}, "item": ITEM}}
    ir_first, _ = schema_to_ir(canonical_schema(first), None, Deadline(None), 16, memo)
    ir_second, _ = schema_to_ir(canonical_schema(second), None, Deadline(None), 16, memo)
    item, _ = schema_to_ir(canonical_schema(ITEM), None, Deadline(None), 16, memo)
    assert id(item) in ir_nodes(ir_first) and id(item) in ir_nodes(ir_second)
    alone, _ = schema_to_ir(canonical_schema(ITEM), None, Deadline(None), 16, None)
    assert alone is not item  # without the memo each compile converts it
    # Other options are other languages: never taken from the memo.
    spaced, _ = schema_to_ir(canonical_schema(ITEM), r"[ ]?", Deadline(None), 16, memo)
    shallow, _ = schema_to_ir(canonical_schema(ITEM), None, Deadline(None), 3, memo)
    assert spaced is not item and shallow is not item


def test_a_sub_schema_that_uses_a_ref_is_shared_only_where_its_targets_are_equal(monkeypatch):
    memo = SubschemaMemo()
    inner = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/t"}},
        "required": ["x"],
        "additionalProperties": False,
    }
    # `inner` met a second time in one document (as `k`, then inside `c`'s items) is taken
    # from that compile's own conversions: what holds it depends on the `$ref` all the same.
    outer = {"type": "array", "items": inner}
    twice = {"properties": {"k": inner, "c": outer}, "required": ["c"]}
    docs = [
        {"$defs": {"t": {"type": "integer"}}, "type": "array", "items": inner},
        {"$defs": {"t": {"type": "string"}}, "type": "array", "items": inner},
        {"$defs": {"t": {"type": "integer"}}, "properties": {"k": inner}, "required": ["k"]},
        {"$defs": {"t": {"type": "string"}}, "properties": {"k": inner}, "required": ["k"]},
        {"$defs": {"t": {"type": "integer"}}, **twice},
        {"$defs": {"t": {"type": "string"}}, "properties": {"c": outer}, "required": ["c"]},
    ]
    for i, doc in enumerate(docs):
        auto = language(doc, memo)
        for value in (
            [{"x": 1}], [{"x": "s"}], {"k": {"x": 1}}, {"k": {"x": "s"}}, {"c": [{"x": 1}]},
            {"c": [{"x": "s"}]},
        ):  # fmt: skip
            want = jsonschema.Draft202012Validator(doc).is_valid(value)
            assert accepts(auto, compact(value)) == want, (i, value)
    # Another document whose reference points at an equal target reuses the conversion of
    # `inner` (and of `outer`); one whose target differs does not.
    reused = []
    take = SchemaConverter._from_memo

    def spy(self, key):
        got = take(self, key)
        reused.append(got is not None)
        return got

    monkeypatch.setattr(SchemaConverter, "_from_memo", spy)
    same = {"$defs": {"t": {"type": "string"}, "u": {"type": "null"}}, **twice}
    other = {"$defs": {"t": {"type": "boolean"}}, **twice}
    for doc, hits in ((same, 2), (other, 0)):
        reused.clear()
        auto = language(doc, memo)
        assert sum(reused) == hits
        for value in ({"c": [{"x": True}]}, {"c": [{"x": "s"}]}, {"k": {"x": "s"}, "c": []}):
            want = jsonschema.Draft202012Validator(doc).is_valid(value)
            assert accepts(auto, compact(value)) == want, value


# A tree and a forest that hold each other (mutual recursion through `$ref`s), and the leaf
# they both read: documents enter the cycle at either one.
TREE_DEFS = {
    "tree": {
        "type": "object",
        "properties": {"v": {"$ref": "#/$defs/leaf"}, "kids": {"$ref": "#/$defs/forest"}},
        "required": ["v"],
        "additionalProperties": False,
    },
    "forest": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2},
}
TREE_VALUES = [
    {"t": {"v": 1}}, {"t": {"v": "a"}}, {"t": {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}},
    {"t": {"v": 1, "kids": [{"v": "x"}]}}, {"t": {"v": 1, "kids": [{"v": 1}, {"v": 2}, {"v": 3}]}},
    {"f": [{"v": 1, "kids": []}]}, {"f": [{"v": 1, "kids": [{"v": True}]}]}, {"f": [{}]},
]  # fmt: skip


def tree_doc(leaf: dict, entry: str) -> dict:
    """A document whose property `t` or `f` (by `entry`) enters the tree/forest cycle."""
    where = {"t": "tree", "f": "forest"}[entry]
    return {
        "$defs": {**TREE_DEFS, "leaf": leaf},
        "properties": {entry: {"$ref": f"#/$defs/{where}"}},
        "required": [entry],
    }


def test_a_recursive_sub_schema_is_shared_only_where_what_it_reads_is_equal(monkeypatch):
    memo = SubschemaMemo()
    reused = []
    take = SchemaConverter._from_memo

    def spy(self, key):
        before = len(self.defs)
        got = take(self, key)
        if len(self.defs) > before:  # a recursive conversion, with the rules it uses
            reused.append(key)
        return got

    monkeypatch.setattr(SchemaConverter, "_from_memo", spy)
    integer, string = {"type": "integer"}, {"type": "string"}
    # (document, whether it reuses a recursive conversion an earlier one made)
    steps = [
        (tree_doc(integer, "t"), False),
        (tree_doc(integer, "t"), True),  # the cycle, entered where it was before
        (tree_doc(integer, "f"), True),  # entered at the forest: the tree inside is reused
        (tree_doc(string, "t"), False),  # the leaf the cycle reads differs: converted anew
        (tree_doc(string, "f"), True),
    ]
    for i, (doc, reuses) in enumerate(steps):
        reused.clear()
        auto = language(doc, memo)
        _ir, defs = schema_to_ir(canonical_schema(doc), None, Deadline(None), 16, None)
        assert defs  # the document is recursive
        assert bool(reused) == reuses, i
        for value in TREE_VALUES:
            want = jsonschema.Draft202012Validator(doc).is_valid(value)
            assert accepts(auto, compact(value)) == want, (i, value)


LEAVES = [{"type": "integer"}, {"type": "string"}, {"enum": ["a", "b"]}, {"type": "null"}]


def random_definition(rng: random.Random, n: int) -> dict:
    """An object, array, anyOf or leaf whose parts refer to any of `n` definitions."""

    def ref() -> dict:
        return {"$ref": f"#/$defs/d{rng.randrange(n)}"}

    kind = rng.randrange(4)
    if kind == 0:
        props = {f"p{i}": ref() if rng.random() < 0.5 else rng.choice(LEAVES)
                 for i in range(rng.randint(1, 3))}  # fmt: skip
        required = [k for k in props if rng.random() < 0.3]
        return {"properties": props, "required": required, "additionalProperties": False}
    if kind == 1:
        return {"type": "array", "items": ref(), "maxItems": 2}
    return {"anyOf": [ref(), rng.choice(LEAVES)]} if kind == 2 else rng.choice(LEAVES)


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 5)
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 6:
        return {
            f"p{rng.randrange(4)}": random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))
        }
    return [rng.randint(-2, 3), rng.choice(["a", "zz"]), True, None, 1.5][kind]


def test_recursive_documents_that_share_definitions_agree_with_jsonschema_and_without_memo():
    """Documents over one set of mutually recursive definitions, a few of them changed per
    document and entered anywhere, compiled in turn with one memo (recursive conversions taken
    from earlier documents where what they read is equal): each accepts what jsonschema and the
    same document compiled without the memo accept."""
    compiled = 0
    for seed in range(6):
        rng = random.Random(seed)
        base = {f"d{i}": random_definition(rng, 6) for i in range(6)}
        memo = SubschemaMemo()
        for _ in range(8):
            defs = dict(base)
            for _ in range(rng.randint(0, 2)):
                defs[f"d{rng.randrange(6)}"] = random_definition(rng, 6)
            doc = {"$defs": defs, "$ref": f"#/$defs/d{rng.randrange(6)}"}
            try:
                auto = language(doc, memo)
            except ValueError:  # a definition that only refers to itself, say
                continue
            plain = language(doc, None)
            compiled += 1
            validator = jsonschema.Draft202012Validator(doc)
            for _ in range(30):
                value = random_value(rng)
                try:
                    want = validator.is_valid(value)
                except RecursionError:  # jsonschema on a left-recursive anyOf
                    break
                got = accepts(auto, compact(value))
                assert got == accepts(plain, compact(value)), (seed, doc, value)
                assert not got or want, (seed, doc, value)  # never an invalid value
    assert compiled >= 30


def test_what_holds_a_reused_conversion_reads_its_refs_too():
    # `inner` comes from the memo inside `outer`: `outer` then depends on `t` as well.
    memo = SubschemaMemo()
    inner = {"properties": {"x": {"$ref": "#/$defs/t"}}, "required": ["x"]}
    outer = {"type": "array", "items": inner}
    docs = [
        {"$defs": {"t": {"type": "string"}}, "properties": {"k": inner}},
        {"$defs": {"t": {"type": "string"}}, "properties": {"c": outer}},
        {"$defs": {"t": {"type": "integer"}}, "properties": {"c": outer}},
    ]
    for doc in docs:
        auto = language(doc, memo)
        for value in ({"c": [{"x": 1}]}, {"c": [{"x": "s"}]}, {"k": {"x": 1}}):
            want = jsonschema.Draft202012Validator(doc).is_valid(value)
            assert accepts(auto, compact(value)) == want, (doc, value)


def test_the_memo_is_bounded_least_recently_used_out():
    memo = SubschemaMemo(max_entries=4)
    for i in range(12):
        schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": i}}}
        schema_to_ir(canonical_schema(schema), None, Deadline(None), 16, memo)
        assert len(memo) <= 4
    last = {"type": "string", "maxLength": 11}
    kept, _ = schema_to_ir(canonical_schema(last), None, Deadline(None), 16, memo)
    again, _ = schema_to_ir(canonical_schema(last), None, Deadline(None), 16, memo)
    assert kept is again
    with pytest.raises(ValueError, match="max_entries"):
        SubschemaMemo(max_entries=-1)


def test_a_full_numbering_starts_a_new_shared_memo(monkeypatch):
    small = SubschemaMemo(max_shapes=3)
    monkeypatch.setattr(json_schema_memo, "_shared", small)
    assert shared_memo() is small
    schema_to_ir(canonical_schema(ITEM), None, Deadline(None), 16, small)
    assert small.full
    fresh = shared_memo()
    assert fresh is not small and not fresh.full and len(fresh) == 0


# ---- facts at construction ---------------------------------------------------------------


def reference_facts(node) -> tuple[bool, bool]:
    """(dead, nullable) from scratch, ignoring what nodes carry."""
    if isinstance(node, Chars):  # dead when no code point in it has a UTF-8 encoding
        return not any(utf8_sequences(lo, hi) for lo, hi in node.ranges), False
    if isinstance(node, Seq):
        kids = [reference_facts(k) for k in node.items]
        return any(d for d, _ in kids), all(n for _, n in kids)
    if isinstance(node, Alt):
        kids = [reference_facts(k) for k in node.items]
        return all(d for d, _ in kids), any(n and not d for d, n in kids)
    if isinstance(node, Repeat):
        dead, nullable = reference_facts(node.item)
        return node.lo > 0 and dead, node.lo == 0 or nullable
    assert isinstance(node, Dfa)
    return not node.table.live(node.start, 0, node.lo, node.hi), node.nullable


PATTERNS = [
    "a", "ab|", "(a|b)*c", "[^\\x00-\\U0010ffff]", "[\\ud800-\\udfff]", "[\\ud800-\\udfffx]",
    "a{0}", "(a[^\\x00-\\U0010ffff])?", "(x|[\\ud800-\\udfff])+", "(()|a)", "a{2,5}b?",
    "\\d+(\\.\\d*)?", "((a|)b|)*", "[a-z]{3}|[\\ud800-\\udbff]{2}",
]  # fmt: skip


def corpus() -> list:
    out = [parse_regex(p) for p in PATTERNS] + [parse_search_regex("^ab+$"), NEVER]
    any_string = Repeat(Chars(((0, 0x10FFFF),)), 0, None)
    out += [exclude_words(any_string, ["a", "ab", ""]), Seq((literal("x"), NEVER))]
    out.append(Alt((NEVER, Repeat(NEVER, 0, 3), Repeat(NEVER, 1, 3))))
    return out


def test_facts_at_construction_equal_the_reference():
    facts = IrFacts(lambda: None)
    checked = 0
    for root in corpus():
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(children(node))
            want = reference_facts(node)
            if node.facts is not None:
                assert node.facts == want, node
            assert (facts.dead(node), facts.nullable(node)) == want, node
            checked += 1
    assert checked > 60


def test_nodes_without_facts_get_them_from_one_pass():
    # A Dfa whose length window needs its suffix lengths computes none at construction, nor
    # does what holds it; the NFA's facts compute them once and keep them on the nodes.
    table = exclude_words(Repeat(Chars(((97, 98),)), 0, None), ["a"]).table
    narrow = Dfa(table, 0, 3, 3)
    root = Seq((literal("x"), narrow))
    assert narrow.facts is None and root.facts is None
    facts = IrFacts(lambda: None)
    got = (facts.dead(root), facts.nullable(root))
    assert narrow.facts is not None and root.facts == got
    assert got == reference_facts(root) and narrow.facts == reference_facts(narrow)


# ---- any name but the declared ones ------------------------------------------------------


def test_all_but_the_declared_names_matches_python_and_is_shared():
    any_name = Repeat(Chars(((0, 0x10FFFF),)), 0, None)
    rng = random.Random(7)
    for _ in range(20):
        words = [
            "".join(rng.choice("ab\u00e9") for _ in range(rng.randint(0, 4))) for _ in range(6)
        ]
        auto = RegexAutomaton(exclude_words(any_name, words))
        for _ in range(60):
            text = "".join(rng.choice("ab\u00e9c") for _ in range(rng.randint(0, 5)))
            assert accepts(auto, text) == (text not in words), (words, text)
    table = exclude_words(any_name, ["x", "y"]).table
    assert exclude_words(any_name, ["x", "y"]).table is table


# ---- what compiles leave to Python's cyclic collector ------------------------------------


CYCLE_SCHEMAS = [
    # open additionalProperties with minProperties/maxProperties (the extra pairs' closures)
    {"properties": {"a": {"type": "integer"}}, "minProperties": 1, "maxProperties": 3},
    # prefixItems with bounds (the continuation after each element), uniqueItems over an enum
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "null"}], "maxItems": 4},
    {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 1},
    # an enum filtered through a temporary automaton, a pattern, a shared definition
    {"allOf": [{"enum": ["ab", "cd", 3]}, {"type": "string", "pattern": "^a"}]},
    {
        "$defs": {"t": {"type": "string", "maxLength": 4}},
        "properties": {"x": {"$ref": "#/$defs/t"}},
    },
    # oneOf branches that each meet both others: the fallback by cases fails (raising and
    # catching on the way) before the one by required names holds
    {"type": "object",
     "properties": {"id": {"type": "string"}, "win": {"type": "integer"}, "lose": {"type": "integer"},
                    "draw": {"type": "integer"}},
     "oneOf": [{"required": ["id", "win"], "properties": {"win": {"minimum": 0}}},
               {"required": ["id", "lose"]}, {"required": ["id", "draw"]}]},
]  # fmt: skip
# oneOfs no fallback holds: refused, each after its fallbacks raised
REFUSED_CYCLE_SCHEMAS = [
    {"oneOf": [{"minimum": 1}, {"maximum": 5}, {"multipleOf": 2}]},
    {"oneOf": [{"type": "array", "items": {"type": "integer"}},
               {"type": "array", "items": {"type": "string"}}]},
]  # fmt: skip


def test_compiling_and_walking_leave_no_reference_cycles():
    # Cyclic garbage waits for a collection of the generation it reached; a compile's (closures
    # that call themselves, an NFA holding its own bound method, an exception raised again from
    # the frame that names it) reached full collections.
    memo = SubschemaMemo()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for schema in CYCLE_SCHEMAS:
            auto = language(schema, memo)
            accepts(auto, compact(jsonschema_example(schema)))
            del auto
        for schema in REFUSED_CYCLE_SCHEMAS:
            with pytest.raises(ValueError, match="may overlap"):
                language(schema, memo)
        gc.collect()
        garbage = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []


def jsonschema_example(schema) -> object:
    """A value to walk (valid or not: the walk only has to read rows)."""
    return {"a": 1, "x": "ab"} if schema.get("type") != "array" else ["s", None]


def test_cached_tables_and_memo_entries_are_not_tracked_by_the_collector():
    any_name = Repeat(Chars(((0, 0x10FFFF),)), 0, None)
    node = exclude_words(any_name, ["alpha", "beta", "be"])
    auto = RegexAutomaton(seq_of(node))
    assert accepts(auto, "bet") and not accepts(auto, "be")
    table = node.table
    memo = SubschemaMemo()
    schema = {"$defs": {"t": {"type": "integer"}}, "items": {"$ref": "#/$defs/t"}}
    schema_to_ir(canonical_schema(schema), None, Deadline(None), 16, memo)
    for _ in range(3):  # a collection stops tracking a tuple once its items are not tracked
        gc.collect()
    untracked = [table.accepting, table.shortest, table.longest, table.moves._kids]
    assert not any(map(gc.is_tracked, untracked))
    deps = [got[1] for got in memo._entries.values()]
    assert any(ref == "#/$defs/t" for dep in deps for ref, _number in dep)
    assert not any(map(gc.is_tracked, deps))
    assert [table.moves[s] for s in range(len(table.moves))] == list(table.moves)
    with pytest.raises(IndexError):
        table.moves[len(table.moves)]


def test_memo_entries_and_parsed_patterns_leave_the_collector_as_they_are_kept():
    """What the memo and the pattern cache keep across compiles is out of the collector's sight
    at once, IR included (also parts `seq` merged into new nodes, which no grammar's IR holds):
    each full collection would walk it otherwise, thousands of objects in a server's life."""
    if dfa_rows() is None:
        pytest.skip("IR is taken out of the collector's sight by the native rows, not built here")
    memo = SubschemaMemo()
    schema = {"$defs": {"t": {"type": "string", "pattern": "^[a-z]+$"}},
              "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}  # fmt: skip
    schema_to_ir(canonical_schema(schema), None, Deadline(None), 16, memo)
    assert len(memo._entries) >= 3
    for key, (ir, deps, rules) in memo._entries.items():
        assert not gc.is_tracked(key) and not gc.is_tracked(deps) and not gc.is_tracked(rules)
        assert not any(map(gc.is_tracked, [ir, *children(ir)]))
    assert not gc.is_tracked(parse_search_regex("^[0-9]{2}-x$"))


def seq_of(node):
    return Seq((node,))


def test_a_text_source_is_planned_once_for_its_cache_key_and_its_compile(monkeypatch):
    # the engine asks for a request's cache key, then compiles it on its pool: the source is
    # parsed and canonicalized once
    from tiny_models import tiny_tokenizer

    from radixflow.grammars import GrammarCompiler
    from radixflow.grammars import compiler as compiler_module

    compiler = GrammarCompiler(tiny_tokenizer())
    text = json.dumps(ITEM)
    key = compiler.cache_key("json_schema", text)
    parsed = []
    real = compiler_module.parse_schema_source
    monkeypatch.setattr(
        compiler_module, "parse_schema_source", lambda *a: parsed.append(a) or real(*a)
    )
    grammar = compiler.compile("json_schema", text)
    assert parsed == [] and compiler.lookup(key) is grammar
    # a source past the kept plans is planned again, with the same key
    for i in range(compiler_module.RECENT_PLANS):
        compiler.cache_key("regex", f"a{{{i}}}")
    assert compiler.cache_key("json_schema", text) == key and len(parsed) == 1


def test_no_compile_scans_every_code_point_for_a_unicode_class(monkeypatch):
    # \s (and \d, \w outside ECMA patterns) is a scan of all 1.1M code points (~25 ms):
    # the compiler finds them when it is made, not in the first request's compile
    from tiny_models import tiny_tokenizer

    from radixflow.grammars import GrammarCompiler, regex_parse

    regex_parse._unicode_class.cache_clear()
    compiler = GrammarCompiler(tiny_tokenizer())
    scans = []
    monkeypatch.setattr(regex_parse, "_every_char", lambda: scans.append(1) or "")
    schema = {"type": "string", "pattern": "^\\s*[a-z]+\\s\\S$"}
    grammar = compiler.compile_json_schema(schema)
    assert scans == []
    assert accepts(grammar.automaton, '" \\t ab x"') and not accepts(grammar.automaton, '"ab"')


@pytest.mark.parametrize(
    "types", ["string", "boolean", "null", ["string", "null"], ["boolean", "string"]]
)
def test_enum_values_of_a_plain_type_equal_the_automatons_filter(monkeypatch, types):
    # an enum beside `type` string/boolean/null keeps its values by their Python type; the
    # values and their order are what filtering each value's text through the type's
    # automaton keeps
    import radixflow.grammars.json_schema as json_schema

    enum = ["a", 1, None, True, 'b"c\n', {"x": 1}, [1], 2.5, False, "", "a", "é"]
    schema = {"type": types, "enum": enum}

    def values() -> list:
        converter = SchemaConverter(schema, None, Deadline(None), 16)
        return converter._enum_values(schema, "#")

    fast = values()
    monkeypatch.setattr(json_schema, "_plain_types", lambda rest: None)
    assert fast == values()
    assert fast  # every type above keeps some of the values


def test_string_character_classes_share_their_escapes():
    """Classes that differ only in plain characters (each "any name but these" trie node leaves
    by its own class) spell their JSON escapes with one node, so the lazy NFA builds the escapes
    once rather than once a class; the language is each class's own."""
    from radixflow.grammars.json_schema_strings import json_chars
    from radixflow.grammars.regex_algebra import ANY_CHAR

    classes = [
        Chars(ANY_CHAR),
        Chars(((0, 0x60), (0x62, 0x10FFFF))),
        Chars(((0, 0x6D), (0x6F, 0x10FFFF))),
    ]
    spelled = [json_chars(c) for c in classes]
    assert all(isinstance(s, Alt) for s in spelled)
    assert spelled[0].items[1] is spelled[1].items[1] is spelled[2].items[1]
    for c, s in zip(classes, spelled, strict=True):
        automaton = RegexAutomaton(s)
        for text in ("a", "n", "z", "é", '\\"', "\\u001f", "\\n"):
            allowed = len(text) > 1 or any(lo <= ord(text) <= hi for lo, hi in c.ranges)
            assert accepts(automaton, text) == allowed, (c.ranges, text)
