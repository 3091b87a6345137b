"""Incremental detokenization and stop-string detection for one output stream."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text without re-decoding it all each step.

    The last few tokens are decoded again with their left context so multi-token characters
    and leading-space merges come out right; text is only released once it no longer ends in
    an incomplete UTF-8 sequence.
    """

    tokenizer: object
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop_strings: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
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
        """Consume ids (the whole output so far); returns the stop string matched, if any."""
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

    def _find_stop(self, old_len: int) -> str | None:
        hits = []
        for stop in self.stop_strings:
            pos = self.text.find(stop, max(0, old_len - len(stop) + 1))
            if pos != -1:
                hits.append((pos, stop))
        if not hits:
            return None
        pos, stop = min(hits)
        self.text = self.text[: pos + len(stop)] if self.no_stop_trim else self.text[:pos]
        return stop
