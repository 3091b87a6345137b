"""JSON strings as regex IR: characters and escapes, formats, constrained strings, spellings.

Strings use the shortest JSON escapes (`\\"`, `\\\\`, `\\n`, `\\u001f`, ...); a `pattern` or
`format` is built over code points, intersected with `minLength`/`maxLength` or an exclusion
exactly (`regex_algebra`), then mapped to JSON string characters (`json_chars`). Length bounds
stay counts (a repeat, or a `Dfa` with bounds), however large, never unrolled copies.
"""

from __future__ import annotations

import functools
import json

from .json_schema_disjoint import listed_values
from .json_schema_formats import FORMATS, capped
from .nfa import Deadline
from .regex_algebra import ANY_CHAR, combine, restrict_length
from .regex_algebra import exclude_words as exclude_words_from
from .regex_ir import (
    Alt,
    Chars,
    Ranges,
    Repeat,
    Seq,
    alt,
    complement,
    intersect,
    literal,
    map_chars,
    normalize,
    seq,
    star,
)
from .regex_parse import chars, parse_regex, parse_search_regex
from .regex_terms import NEVER

_HEX = chars("0-9a-fA-F")
_SPECIAL = normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_PLAIN = Chars(complement(_SPECIAL))
_ANY_CHAR = Chars(ANY_CHAR)
# Escapes share their backslash: a repeat builds this once per count it reaches.
JSON_CHAR = alt(
    _PLAIN, seq(chars("\\\\"), alt(chars('"\\\\/bfnrt'), seq(chars("u"), _HEX, _HEX, _HEX, _HEX)))
)


def warm_formats() -> None:
    """Parse every format's regex now (kept by `parse_regex`'s cache; up to a few ms each,
    once per process), so that no compile pays it: GrammarCompiler calls this."""
    for regex in FORMATS.values():
        parse_regex(regex)


# How JSON writes each character that must be escaped (control characters, quote, backslash).
_ESCAPES = {cp: json.dumps(chr(cp))[1:-1] for lo, hi in _SPECIAL for cp in range(lo, hi + 1)}


def _prefix_tree(texts: list[str]):
    """IR for exactly `texts` (distinct, non-empty) with common prefixes shared and final
    characters in one class: the 34 JSON escapes share their `\\` and `\\u00`."""
    last = normalize([(ord(t), ord(t)) for t in texts if len(t) == 1])
    longer: dict[str, list[str]] = {}
    for t in texts:
        if len(t) > 1:
            longer.setdefault(t[0], []).append(t[1:])
    options = [Chars(last)] if last else []
    options += [seq(Chars(((ord(c), ord(c)),)), _prefix_tree(rest)) for c, rest in longer.items()]
    return options[0] if len(options) == 1 else Alt(tuple(options))


@functools.lru_cache(maxsize=256)
def _escapes(special: Ranges):
    """`_prefix_tree` of the escapes of the characters `special`, one node per set of them:
    the classes of most strings escape the same 34 characters, and one node compiles to one set
    of automaton states."""
    return _prefix_tree([_ESCAPES[cp] for lo, hi in special for cp in range(lo, hi + 1)])


_JSON_CHARS: dict[tuple, object] = {}


def json_chars(node: Chars):
    """One string-content character from `node`, as it appears inside a JSON string."""
    got = _JSON_CHARS.get(node.ranges)
    if got is None:
        plain = intersect(node.ranges, _PLAIN.ranges)
        special = intersect(node.ranges, _SPECIAL)
        got = Alt((Chars(plain), _escapes(special))) if special else Chars(plain)
        if len(_JSON_CHARS) < 4096:
            _JSON_CHARS[node.ranges] = got
    return got


json_chars.keeps_text = True  # type: ignore[attr-defined]  # text is plain: written as itself


# Encoders made once: `json.dumps` with any option set builds a new encoder per call.
_TEXT = json.JSONEncoder(ensure_ascii=False).encode
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@functools.lru_cache(maxsize=8192)  # property names recur in every object that declares them
def json_string_literal(text: str) -> Seq:
    """`text` as a JSON string literal (quotes included)."""
    return literal(_TEXT(text))


def compact_json(value) -> str:
    """`value` as JSON text without whitespace (the generated form of enum/const values)."""
    return _COMPACT(value)


def string_ir(
    schema: dict,
    where: str,
    deadline: Deadline,
    exclude: str | None = None,
    exclude_words: list[str] | None = None,
):
    """A JSON string; `exclude` is a pattern it must not match, `exclude_words` values."""
    pattern, fmt = schema.get("pattern"), schema.get("format")
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"{where}: unsupported string format {fmt!r}")
    hi = capped(fmt, None if hi is None else int(hi))
    if hi is not None and hi < lo:
        return NEVER  # bounds no length meets (merged parts, a `not` of a bound)
    parts = [parse_search_regex(pattern)] if pattern is not None else []
    parts += [parse_regex(FORMATS[fmt])] if fmt is not None else []
    if not parts and exclude is None and not exclude_words:
        return seq(literal('"'), Repeat(JSON_CHAR, lo, hi), literal('"'))
    ir = parts[0] if len(parts) == 1 else star(_ANY_CHAR)
    if len(parts) == 2:
        ir = combine(parts, all, deadline)
    if exclude is not None:
        keep = lambda got: got[0] and not got[1]  # noqa: E731
        ir = combine([ir, parse_search_regex(exclude)], keep, deadline)
    if exclude_words:
        ir = exclude_words_from(ir, exclude_words, deadline)
    if lo or hi is not None:
        ir = restrict_length(ir, lo, hi, deadline)
    if ir is NEVER:
        return NEVER
    return seq(literal('"'), map_chars(ir, json_chars), literal('"'))


STRING_KEYWORDS = {"type", "pattern", "format", "minLength", "maxLength", "enum", "const"}


def exclusive_strings(schemas: list, vocabulary: set, deadline: Deadline):
    """IR of the JSON strings exactly one of `schemas` accepts (`oneOf` over strings), each a
    schema of strings only (type string; pattern, format, length bounds, enum/const), or None
    when one is not. Exact: the branches' code point languages (length bounds as counted
    repeats) in one product automaton (`regex_algebra.combine`), which may raise past its
    state limit."""
    contents = []
    for schema in schemas:
        if schema is False:
            contents.append(NEVER)
            continue
        keys = set(schema) & vocabulary if isinstance(schema, dict) else {"?"}
        if not keys <= STRING_KEYWORDS or schema.get("type") not in ("string", ["string"]):
            return None
        parts = [parse_search_regex(schema["pattern"])] if "pattern" in schema else []
        if schema.get("format") in FORMATS:  # other formats are annotations
            parts.append(parse_regex(FORMATS[schema["format"]]))
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        hi = capped(schema.get("format"), None if hi is None else int(hi))
        if lo or hi is not None:
            parts.append(Repeat(_ANY_CHAR, lo, hi))
        values = listed_values(schema)
        if values is not None:
            parts.append(Alt(tuple(literal(v) for v in values if isinstance(v, str))))
        if not parts:
            contents.append(star(_ANY_CHAR))
        else:
            contents.append(parts[0] if len(parts) == 1 else combine(parts, all, deadline))
    ir = combine(contents, lambda got: sum(got) == 1, deadline, at_most_one=True)
    return NEVER if ir is NEVER else seq(literal('"'), map_chars(ir, json_chars), literal('"'))


def _hex_ir(value: int):
    """The four hex digits of `value`, either case."""
    return seq(*(chars(c + c.upper()) if c.isalpha() else literal(c) for c in f"{value:04x}"))


def spellings(value):
    """Every JSON text of the scalar `value` that the generated form may contain."""
    if value is None or isinstance(value, bool):
        return literal(compact_json(value))
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return alt(literal(str(int(value))), *([literal("-0")] if value == 0 else []))
    if not isinstance(value, str):
        raise ValueError("only strings, booleans, null and integers are supported")
    parts = []
    for ch in value:
        cp = ord(ch)
        forms = [literal("\\u"), _hex_ir(cp)] if cp <= 0xFFFF else None
        options = [seq(*forms)] if forms else []
        if cp > 0xFFFF:
            hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
            options.append(seq(literal("\\u"), _hex_ir(hi), literal("\\u"), _hex_ir(lo)))
        options.append(literal(_ESCAPES.get(cp, ch)))
        if ch == "/":
            options.append(literal("\\/"))
        parts.append(alt(*options))
    return seq(literal('"'), *parts, literal('"'))
