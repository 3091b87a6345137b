"""GBNF (llama.cpp's grammar format) -> Lark grammar text.

Rules `name ::= ...` become Lark rules (`root` is the start rule), string literals and
character classes become regex terminals, `.` any character, and `{m,n}` repeats Lark's
`~ m..n`. Texts longer than `lark_import.MAX_GRAMMAR_CHARS` are refused.
"""

from __future__ import annotations

import re

from .lark_import import check_length

_NAME = re.compile(r"[a-zA-Z0-9_-]+")
_RULE_START = re.compile(r"[a-zA-Z0-9_-]+\s*::=")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
            "^": "^", "/": "/"}  # fmt: skip


def _rule_name(name: str) -> str:
    return "start" if name == "root" else "g_" + name.lower().replace("-", "_")


def _esc(text: str) -> str:
    """Regex-escape for a Lark regex literal: no raw newlines, every '/' escaped."""
    out = []
    for c in text:
        cp = ord(c)
        if c.isalnum() and cp < 128:
            out.append(c)
        elif 0x20 <= cp < 0x7F:
            out.append("\\" + c)
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        else:
            out.append(f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}")
    return "".join(out)


def _regex_literal(pattern: str) -> str:
    return "/" + pattern + "/"


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, msg: str) -> ValueError:
        line = self.text.count("\n", 0, self.pos) + 1
        return ValueError(f"GBNF line {line}: {msg}")

    def skip(self, newlines: bool = True) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            else:
                break

    def char(self) -> str:
        """One (possibly escaped) character inside a literal or class."""
        c = self.text[self.pos]
        if c != "\\":
            self.pos += 1
            return c
        e = self.text[self.pos + 1 : self.pos + 2]
        if e in _ESCAPES:
            self.pos += 2
            return _ESCAPES[e]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is None:
            raise self.error(f"unknown escape \\{e}")
        digits = self.text[self.pos + 2 : self.pos + 2 + width]
        if not re.fullmatch(r"[0-9a-fA-F]+", digits) or len(digits) != width:
            raise self.error(f"bad escape \\{e}{digits}")
        self.pos += 2 + width
        return chr(int(digits, 16))

    def grammar(self) -> str:
        rules = []
        self.skip()
        while self.pos < len(self.text):
            m = _NAME.match(self.text, self.pos)
            if not m:
                raise self.error("expected a rule name")
            self.pos = m.end()
            self.skip()
            if not self.text.startswith("::=", self.pos):
                raise self.error("expected ::=")
            self.pos += 3
            rules.append(f"{_rule_name(m.group())}: {self.alternatives()}")
            self.skip()
        if not any(r.startswith("start:") for r in rules):
            raise ValueError("GBNF grammar has no root rule")
        return "\n".join(rules) + "\n"

    def alternatives(self) -> str:
        alts = [self.sequence()]
        while self.text.startswith("|", self.pos):
            self.pos += 1
            alts.append(self.sequence())
        return " | ".join(alts)

    def sequence(self) -> str:
        items = []
        while True:
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)":
                break
            if _RULE_START.match(self.text, self.pos):
                break
            atom = self.atom()
            items.append(self.postfix(atom))
        return " ".join(i for i in items if i)

    def atom(self) -> str:
        c = self.text[self.pos]
        if c == '"':
            self.pos += 1
            out = []
            while self.pos < len(self.text) and self.text[self.pos] != '"':
                out.append(self.char())
            if self.pos >= len(self.text):
                raise self.error("unterminated string")
            self.pos += 1
            return _regex_literal(_esc("".join(out))) if out else ""
        if c == "[":
            self.pos += 1
            negate = self.text.startswith("^", self.pos)
            self.pos += negate
            parts = []
            while self.pos < len(self.text) and self.text[self.pos] != "]":
                lo = self.char()
                if (
                    self.text.startswith("-", self.pos)
                    and self.text[self.pos + 1 : self.pos + 2] != "]"
                ):
                    self.pos += 1
                    parts.append(f"{_esc(lo)}-{_esc(self.char())}")
                else:
                    parts.append(_esc(lo))
            if self.pos >= len(self.text):
                raise self.error("unterminated character class")
            self.pos += 1
            return _regex_literal("[" + ("^" if negate else "") + "".join(parts) + "]")
        if c == ".":
            self.pos += 1
            return _regex_literal("(?s:.)")
        if c == "(":
            self.pos += 1
            inner = self.alternatives()
            self.skip()
            if not self.text.startswith(")", self.pos):
                raise self.error("expected )")
            self.pos += 1
            return f"({inner})" if inner else ""
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error(f"unexpected character {c!r}")
        self.pos = m.end()
        return _rule_name(m.group())

    def postfix(self, atom: str) -> str:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "*+?":
                self.pos += 1
                atom = f"({atom}){c}" if atom else ""
            elif c == "{":
                end = self.text.find("}", self.pos)
                m = re.fullmatch(r"\s*(\d+)\s*(,\s*(\d*)\s*)?", self.text[self.pos + 1 : end])
                if end < 0 or not m:
                    raise self.error("bad {m,n} repeat")
                self.pos = end + 1
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                atom = _repeat(atom, lo, hi) if atom else ""
            else:
                break
        return atom


def _repeat(atom: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"({atom})*" if lo == 0 else f"(({atom}) ~ {lo} ({atom})*)"
    if hi < lo:
        raise ValueError(f"GBNF repeat {{{lo},{hi}}} has max < min")
    if hi == 0:
        return ""
    if lo == 0:
        return f"(({atom}) ~ 1..{hi})?" if hi > 1 else f"({atom})?"
    return f"(({atom}) ~ {lo}..{hi})" if hi > lo else f"(({atom}) ~ {lo})"


def gbnf_to_lark(text: str) -> str:
    """Lark grammar text equivalent to a GBNF grammar."""
    check_length(text)
    return _Parser(text).grammar()
