"""Incremental detokenization and stop-string / stop-regex detection for one output stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import regex

# Seconds one stop_regex search may take: a pathological pattern fails its own request.
STOP_REGEX_TIMEOUT = 0.25


class TextDecoder(Protocol):
    """What the detokenizer needs of a tokenizer (a Hugging Face tokenizer has it)."""

    def decode(
        self, ids: list[int], /, *, skip_special_tokens: bool, spaces_between_special_tokens: bool
    ) -> str: ...


class StopRegexTimeout(ValueError):
    """A stop_regex search ran past STOP_REGEX_TIMEOUT."""


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text without re-decoding it all each step.

    The last few tokens are decoded again with their left context so multi-token characters
    and leading-space merges come out right; text is only released once it no longer ends in
    an incomplete UTF-8 sequence.
    """

    tokenizer: TextDecoder
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop_strings: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
    stop_regexes: list[str] = field(default_factory=list)
    text: str = ""
    _prefix_offset: int = 0
    _read_offset: int = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def update(self, ids: list[int]) -> str | None:
        """Consume ids (the whole output so far); returns the stop string (or the stop_regex
        pattern) matched, if any, after trimming the text there."""
        prefix_text = self._decode(ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        old_len = len(self.text)
        self.text += delta
        return self._find_stop(old_len)

    def reset(self) -> None:
        """Forget all output (the ids were rewritten); the next update decodes from the start."""
        self.text = ""
        self._prefix_offset = self._read_offset = 0

    def flush(self, ids: list[int]) -> None:
        """Release whatever is still held back (the request finished)."""
        rest = self._decode(ids[self._prefix_offset :])
        held = self._decode(ids[self._prefix_offset : self._read_offset])
        if len(rest) > len(held):
            self.text += rest[len(held) :]
        self._prefix_offset = self._read_offset = len(ids)

    @property
    def stream_text(self) -> str:
        """The text safe to stream: without a tail that may still grow into a stop string, so
        every streamed text is a prefix of the final one."""
        hold = 0
        for stop in self.stop_strings:
            for k in range(min(len(stop) - 1, len(self.text)), hold, -1):
                if self.text.endswith(stop[:k]):
                    hold = k
                    break
        return self.text[: len(self.text) - hold]

    def _find_stop(self, old_len: int) -> str | None:
        hits = []  # (start, end, what matched)
        for stop in self.stop_strings:
            pos = self.text.find(stop, max(0, old_len - len(stop) + 1))
            if pos != -1:
                hits.append((pos, pos + len(stop), stop))
        for pattern in self.stop_regexes:
            # A match may start anywhere before the new text, so the whole text is searched.
            try:
                found = regex.search(pattern, self.text, timeout=STOP_REGEX_TIMEOUT)
            except TimeoutError:
                raise StopRegexTimeout(
                    f"stop_regex {pattern!r} took over {STOP_REGEX_TIMEOUT} s to search"
                ) from None
            if found is not None:
                hits.append((found.start(), found.end(), pattern))
        if not hits:
            return None
        start, end, matched = min(hits)
        self.text = self.text[:end] if self.no_stop_trim else self.text[:start]
        return matched
