"""What one HTTP request may ask for: the limits behind `radixflow serve`'s request flags."""

from __future__ import annotations

from dataclasses import dataclass

# Tokens longer than this many characters on average are rare enough to refuse such prompts
# before tokenizing them (tokenizing megabytes holds a CPU for seconds).
CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class ServerLimits:
    """What one HTTP request may ask for; each is a `radixflow serve` flag."""

    max_body_bytes: int = 16 * 2**20
    max_prompt_chars: int | None = None  # None: CHARS_PER_TOKEN x the context length
    max_requests_per_call: int = 256  # prompts x n

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_chars", "max_requests_per_call"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
