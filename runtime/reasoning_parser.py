"""`--reasoning-parser`: split a reply's `<think>...</think>` reasoning from its answer.

    deepseek-r1  the generation prompt already opened `<think>`: the reply starts inside the
                 reasoning, which ends at `</think>` (a reply without it is all reasoning
                 until it ends)
    qwen3        reasoning only when the reply starts with `<think>`; with
                 `chat_template_kwargs: {"enable_thinking": false}` everything is content

`ReasoningStream` gives the same split incrementally: text that may be the start of a tag is
held back until the next piece decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_inside: bool  # the reply begins inside the reasoning (the prompt opened <think>)

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        """(reasoning or None, content). With `final` False, a possibly partial tag at the end
        is held back (neither part has it yet)."""
        begin = 0
        if not self.starts_inside:
            stripped = text.lstrip()
            if stripped.startswith(START):
                begin = len(text) - len(stripped) + len(START)
            elif not final and START.startswith(stripped):
                return "", ""  # could still become <think>
            else:
                return None, text
        end = text.find(END, begin)
        if end < 0:
            reasoning = text[begin:]
            if not final:
                reasoning = reasoning[: len(reasoning) - _partial_tag(reasoning, END)]
            return reasoning.lstrip(), ""
        return text[begin:end].lstrip(), text[end + len(END) :].lstrip()


REASONING_PARSERS = {
    "deepseek-r1": ReasoningParser("deepseek-r1", starts_inside=True),
    "qwen3": ReasoningParser("qwen3", starts_inside=False),
}


def reasoning_parser(
    name: str | None, separate: bool = True, template_kwargs: dict | None = None
) -> ReasoningParser | None:
    """The parser a request uses: none when unset, when the request asks for
    `separate_reasoning: false`, or when it turned thinking off in the template."""
    if name is None or not separate:
        return None
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}: {name!r}")
    if (template_kwargs or {}).get("enable_thinking") is False:
        return None
    return REASONING_PARSERS[name]


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class ReasoningStream:
    """Feed the cumulative text; get (reasoning delta, content delta) each time."""

    parser: ReasoningParser
    sent_reasoning: int = 0
    sent_content: int = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        reasoning, content = self.parser.split(text, final)
        reasoning = reasoning or ""
        r_delta = reasoning[self.sent_reasoning :]
        c_delta = content[self.sent_content :]
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        self.sent_content = max(self.sent_content, len(content))
        return r_delta, c_delta
