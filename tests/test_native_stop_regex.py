"""IncrementalDetokenizer's stop checks: stop_regex beside stop strings, trimming, the search
time limit, and the streamed text that never shows what a stop string may still remove."""

from __future__ import annotations

import re

import pytest

from radixflow.runtime.detokenizer import IncrementalDetokenizer, StopRegexTimeout


class CharTokenizer:
    """Token id i is the character chr(i)."""

    def decode(self, ids, **kwargs) -> str:
        return "".join(map(chr, ids))


def _run(text: str, **kwargs) -> tuple[IncrementalDetokenizer, str | None]:
    """Feed `text` one character (token) at a time until a stop matches."""
    detok = IncrementalDetokenizer(CharTokenizer(), **kwargs)
    ids: list[int] = []
    for ch in text:
        ids.append(ord(ch))
        matched = detok.update(ids)
        if matched is not None:
            return detok, matched
    return detok, None


@pytest.mark.parametrize(
    ("text", "patterns"),
    [
        ("order 66 now. then 12.", [r"\d+\."]),
        ("abc\nxyz END more", [r"E[A-Z]D", r"\n\w{3}"]),
        ("no match here", [r"\d"]),
    ],
)
def test_stop_regex_matches_pythons_leftmost_match(text, patterns):
    detok, matched = _run(text, stop_regexes=patterns)
    # Reference: the earliest-ending match over all patterns, as the stream reveals it.
    ends = [
        (m.end(), m.start(), p)
        for p in patterns
        for i in range(1, len(text) + 1)
        if (m := re.search(p, text[:i])) is not None
    ]
    if not ends:
        assert matched is None and detok.text == text
        return
    end, start, pattern = min(ends)
    assert matched == pattern and detok.text == text[:start]


def test_no_stop_trim_keeps_the_match_and_stop_strings_compete():
    detok, matched = _run("call 911 now", stop_regexes=[r"\d{3}"], no_stop_trim=True)
    assert (matched, detok.text) == (r"\d{3}", "call 911")
    detok, matched = _run("ab STOP 123", stop_strings=["STOP"], stop_regexes=[r"\d+"])
    assert (matched, detok.text) == ("STOP", "ab ")


def test_a_pathological_stop_regex_fails_on_time():
    detok = IncrementalDetokenizer(CharTokenizer(), stop_regexes=[r"(a|aa)+c"])
    with pytest.raises(StopRegexTimeout, match="stop_regex"):
        detok.update([ord("a")] * 60)


def test_stream_text_holds_back_a_possible_stop_string():
    detok, _ = _run("hello wor", stop_strings=["world!", "xyz"])
    assert detok.text == "hello wor" and detok.stream_text == "hello "
    detok, _ = _run("hello there", stop_strings=["world!"])
    assert detok.stream_text == "hello there"
