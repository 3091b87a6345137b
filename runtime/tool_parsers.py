"""`--tool-call-parser`: read the model's own tool-call format into OpenAI `tool_calls`.

    llama3          {"name": "f", "parameters": {...}}  (the whole reply; `<|python_tag|>` and
                    several calls separated by ";" allowed)
    hermes, qwen25,
    qwen3           <tool_call>{"name": "f", "arguments": {...}}</tool_call>  (any number, with
                    text around them, which stays content)
    mistral         [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]  or
                    [TOOL_CALLS]f[ARGS]{...}  (needs the special tokens kept in the text)

A call that does not parse, or names a function not among the request's tools, stays text.
`ToolCallStream` streams content until a call may begin, then holds the rest back and sends the
calls whole when the reply ends.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCallParser:
    name: str
    # text that opens a call section, and whether it must open the reply (llama3's bare JSON)
    start: tuple[str, ...]
    at_start_only: bool = False
    keeps_special_tokens: bool = False  # the markers are special tokens (mistral)

    def parse(self, text: str, tools: set[str]) -> tuple[str | None, list[dict[str, Any]]]:
        """(content or None, calls); no calls when the reply holds none of `tools`."""
        found = _FORMATS[self.name](text)
        if found is None:
            return text, []
        content, calls = found
        if not calls or not all(c[0] in tools for c in calls):
            return text, []
        return content.strip() or None, [tool_call(name, args) for name, args in calls]

    def call_begins(self, text: str) -> int | None:
        """Where a call section begins in `text` (or may begin, if the text ends with a
        partial marker); None when the text so far is plain content."""
        if self.at_start_only:
            stripped = text.lstrip()
            if not stripped:
                return None
            return 0 if any(m.startswith(stripped[: len(m)]) for m in self.start) else None
        hits = [i for i in (text.find(m) for m in self.start) if i >= 0]
        if hits:
            return min(hits)
        for n in range(min(max(len(m) for m in self.start) - 1, len(text)), 0, -1):
            if any(m.startswith(text[-n:]) for m in self.start):
                return len(text) - n
        return None


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """One entry of an assistant message's `tool_calls`, arguments as JSON text."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _llama3(text: str) -> tuple[str, list[tuple[str, Any]]] | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    calls, pos = [], 0
    while pos < len(body):
        try:
            value, end = _DECODER.raw_decode(body, pos)
        except json.JSONDecodeError:
            return None
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            return None
        args = value.get("parameters", value.get("arguments", {}))
        calls.append((value["name"], args))
        pos = end
        while pos < len(body) and body[pos] in "; \n\t":
            pos += 1
    return "", calls


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _hermes(text: str) -> tuple[str, list[tuple[str, Any]]] | None:
    calls = []
    for match in _HERMES.finditer(text):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            return None
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            return None
        calls.append((value["name"], value.get("arguments", value.get("parameters", {}))))
    return _HERMES.sub("", text), calls


def _mistral(text: str) -> tuple[str, list[tuple[str, Any]]] | None:
    content, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return content, []
    calls: list[tuple[str, Any]] = []
    rest = rest.strip()
    if rest.startswith("["):  # v0.3: a JSON list of calls
        try:
            value, _ = _DECODER.raw_decode(rest)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, list):
            return None
        for c in value:
            if not (isinstance(c, dict) and isinstance(c.get("name"), str)):
                return None
            calls.append((c["name"], c.get("arguments", {})))
        return content, calls
    for part in rest.split("[TOOL_CALLS]"):  # newer: name[ARGS]{...}, repeated
        name, sep, args = part.partition("[ARGS]")
        try:
            calls.append((name.strip(), json.loads(args)))
        except json.JSONDecodeError:
            return None
        if not sep:
            return None
    return content, calls


_FORMATS = {"llama3": _llama3, "hermes": _hermes, "mistral": _mistral}
TOOL_CALL_PARSERS = {
    "llama3": ToolCallParser("llama3", ("{", "<|python_tag|>"), at_start_only=True),
    "hermes": ToolCallParser("hermes", ("<tool_call>",)),
    "mistral": ToolCallParser("mistral", ("[TOOL_CALLS]",), keeps_special_tokens=True),
}
for _alias in ("qwen25", "qwen3"):
    TOOL_CALL_PARSERS[_alias] = ToolCallParser("hermes", ("<tool_call>",))


def tool_call_parser(name: str) -> ToolCallParser:
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_CALL_PARSERS)}: {name!r}")
    return TOOL_CALL_PARSERS[name]


@dataclass
class ToolCallStream:
    """Feed content as it grows; plain text goes out at once, a call section waits for
    `finish`, which returns the rest of the content and the calls."""

    parser: ToolCallParser
    tools: set[str]
    sent: int = 0
    held: bool = field(default=False)

    def feed(self, content: str) -> str:
        begin = self.parser.call_begins(content)
        upto = len(content) if begin is None else begin
        self.held = begin is not None
        out = content[self.sent : max(upto, self.sent)]
        self.sent = max(self.sent, upto)
        return out

    def finish(self, content: str) -> tuple[str, list[dict[str, Any]]]:
        rest, calls = self.parser.parse(content, self.tools)
        if not calls:
            return content[self.sent :], []
        # content before the call section went out already; what the parser kept is the rest
        rest = rest or ""
        return rest[self.sent :] if rest.startswith(content[: self.sent]) else "", calls
