"""Checks on text that reaches the tokenizer or a response from a client."""

from __future__ import annotations


def check_encodable(text: str, field_name: str) -> None:
    """Raise ValueError when `text` is not valid Unicode (a lone UTF-16 surrogate such as
    "\\ud800", which JSON can carry but no tokenizer or UTF-8 response can)."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field_name}: character {exc.start} is a lone UTF-16 surrogate "
            f"(U+{ord(text[exc.start]):04X}), which is not valid Unicode"
        ) from None
