"""JSON Schema -> regex IR (and rules for recursive `$ref`s).

Generated form (what a model is made to write):
- compact by default: no whitespace anywhere, e.g. `{"a":1,"b":[1,2]}`; with `whitespace_pattern`
  (a regex) that pattern is allowed after `{`, `[`, `,` and `:`, and before `}`, `]`, `,`, `:`;
- object properties in `properties` order, optional ones skippable; additional properties
  (allowed unless `additionalProperties` is false) come after the declared ones, with keys
  different from the declared ones;
- strings use the shortest JSON escapes (`\\"`, `\\\\`, `\\n`, `\\u001f`, ...) and never
  `\\uXXXX` for characters that need no escape inside constrained keys;
- integers without fraction or exponent; numbers with a fraction and exponent allowed, except
  that bounded numbers use no exponent (bounds must be integer-valued);
- values the schema leaves free (`{}`, `true`, extra properties, items without a schema) are any
  JSON value nested at most `ANY_VALUE_DEPTH` arrays/objects deep, so the language stays regular;
- `enum`/`const` values are written compactly.
The language is regular unless `$ref`s recurse; then the recursive definitions become
grammar rules. `oneOf` requires branches of different JSON types (see `disjoint`); otherwise
it is rejected rather than treated as `anyOf`.

Supported keywords: see `_HANDLED`; annotations (title, description, examples, default,
$schema, $id, $comment, $defs, ...) change nothing. Standard keywords that are not implemented (`UNSUPPORTED`) raise `ValueError` naming them and where they
are; keywords outside the JSON Schema vocabularies (e.g. `x-order`, `example`) are annotations
by the specification and are ignored.
"""

from __future__ import annotations

import json
import math
import urllib.parse

from .nfa import Deadline
from .regex_ir import (
    EMPTY,
    Alt,
    Chars,
    Ref,
    Repeat,
    Seq,
    alt,
    chars,
    complement,
    intersect,
    literal,
    map_chars,
    normalize,
    opt,
    parse_regex,
    parse_search_regex,
    seq,
    star,
    subtract,
)

ANY_VALUE_DEPTH = 3

_HANDLED = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum",
}  # fmt: skip
# Keywords with validation meaning (drafts 3 to 2020-12) that are not implemented: they raise.
# Keywords outside the JSON Schema vocabularies are annotations by the spec and change nothing.
UNSUPPORTED = {
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
    "patternProperties", "propertyNames", "minProperties", "maxProperties",
    "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "uniqueItems", "multipleOf", "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "extends",
    "disallow", "divisibleBy",
}  # fmt: skip
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
NEVER = Alt(())

_HEX = chars("0-9a-fA-F")
_SPECIAL = normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_PLAIN = Chars(complement(_SPECIAL))
JSON_CHAR = alt(
    _PLAIN, seq(literal("\\"), chars('"\\\\/bfnrt')), seq(literal("\\u"), _HEX, _HEX, _HEX, _HEX)
)
_INT = parse_regex(r"-?(0|[1-9][0-9]*)")
_NUMBER = parse_regex(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_D2 = r"[0-9]{2}"
_DATE = (
    r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    r"|02-(0[1-9]|1[0-9]|2[0-8]))"
    r"|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
)
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6 = rf"(({_H16}:){{7}}{_H16}|(({_H16}:){{0,6}}{_H16})?::(({_H16}:){{0,6}}{_H16})?)"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(\.{_LABEL})*"
FORMATS = {
    "date-time": rf"{_DATE}T{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "email": rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_HOSTNAME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
}


def _escape_char(cp: int) -> str:
    return json.dumps(chr(cp))[1:-1]


def _json_chars(node: Chars):
    """One string-content character from `node`, as it appears inside a JSON string."""
    plain = subtract(node.ranges, _SPECIAL)
    escaped = [literal(_escape_char(cp)) for lo, hi in intersect(node.ranges, _SPECIAL)
               for cp in range(lo, hi + 1)]  # fmt: skip
    if not escaped:
        return Chars(plain)
    return Alt((Chars(plain), *escaped))


def json_string_literal(text: str) -> Seq:
    return literal(json.dumps(text, ensure_ascii=False))


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _key_not_in(keys: list[str]):
    """A JSON string (with quotes) whose content is none of `keys`."""

    def node(group: list[str], depth: int):
        options = []
        if all(len(k) != depth for k in group):
            options.append(EMPTY)
        nexts = sorted({k[depth] for k in group if len(k) > depth})
        taken = normalize([(ord(c), ord(c)) for c in nexts])
        other = _json_chars(Chars(subtract(complement(()), taken)))
        options.append(seq(other, star(JSON_CHAR)))
        for c in nexts:
            options.append(
                seq(
                    _json_chars(Chars(((ord(c), ord(c)),))),
                    node([k for k in group if len(k) > depth and k[depth] == c], depth + 1),
                )
            )
        return Alt(tuple(options))

    return seq(literal('"'), node(sorted(set(keys)), 0), literal('"'))


def _digits_range(lo: str, hi: str) -> str:
    """Regex for decimal strings of equal length between lo and hi (inclusive)."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return lo[0] + _digits_range(lo[1:], hi[1:])
    n = len(lo) - 1
    parts = [lo[0] + _digits_range(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + ("[0-9]" * n))
    parts.append(hi[0] + _digits_range("0" * n, hi[1:]))
    return "(" + "|".join(parts) + ")"


def uint_range_regex(lo: int, hi: int | None) -> str:
    """Regex for non-negative integers (no leading zeros) in [lo, hi]; hi None = unbounded."""
    if hi is not None and hi < lo:
        return "(?!)"
    parts = []
    length = len(str(lo))
    start = lo
    while hi is None or start <= hi:
        top = 10**length - 1
        if hi is not None and hi <= top:
            parts.append(_digits_range(str(start), str(hi)))
            break
        if hi is None and start == 10 ** (length - 1):
            parts.append(f"[1-9][0-9]{{{length - 1},}}" if length > 1 else "[1-9][0-9]*")
            break
        parts.append(_digits_range(str(start), str(top)))
        start, length = top + 1, length + 1
    return "(" + "|".join(parts) + ")"


def int_range_regex(lo: int | None, hi: int | None) -> str:
    parts = []
    if hi is None or hi >= 0:
        parts.append(uint_range_regex(max(lo or 0, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append(
            "-"
            + uint_range_regex(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)
        )
    return "(" + "|".join(parts) + ")"


_FRAC_ANY = r"(\.[0-9]+)?"
_FRAC_ZERO = r"(\.0+)?"
_FRAC_NONZERO = r"\.[0-9]*[1-9][0-9]*"


def _magnitude_regex(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool) -> list[str]:
    """Regexes for decimal magnitudes m (no sign, no exponent) with lo <(=) m <(=) hi."""
    if hi is not None and (hi < lo or (hi == lo and (lo_excl or hi_excl))):
        return []
    if hi is not None and hi == lo:
        return [str(lo) + _FRAC_ZERO]
    out = [str(lo) + (_FRAC_NONZERO if lo_excl else _FRAC_ANY)]
    if hi is None or hi - 1 >= lo + 1:
        out.append(uint_range_regex(lo + 1, None if hi is None else hi - 1) + _FRAC_ANY)
    if hi is not None and not hi_excl:
        out.append(str(hi) + _FRAC_ZERO)
    return out


def number_range_regex(lo, lo_excl, hi, hi_excl) -> str:
    """Decimal numbers (no exponent) in the range; bounds are ints or None."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        m_lo, m_excl = (0, False) if lo is None or lo < 0 else (lo, lo_excl)
        parts += _magnitude_regex(m_lo, m_excl, hi, hi_excl)
    if lo is None or lo < 0 or (lo == 0 and not lo_excl):
        m_lo, m_excl = (0, False) if hi is None or hi > 0 else (-hi, hi_excl)
        parts += [
            "-" + p for p in _magnitude_regex(m_lo, m_excl, None if lo is None else -lo, lo_excl)
        ]
    return "(" + "|".join(parts) + ")" if parts else "(?!)"


class SchemaConverter:
    """Walks one schema; `convert` returns IR, recursive `$ref`s land in `defs`."""

    def __init__(self, root, whitespace_pattern: str | None, deadline: Deadline):
        self.root = root
        self.deadline = deadline
        self.ws = EMPTY if whitespace_pattern is None else parse_regex(whitespace_pattern)
        self.defs: dict[str, object] = {}
        self._stack: list[str] = []
        self._recursive: set[str] = set()
        self._ref_ir: dict[str, object] = {}
        self._any = [self._scalar()]
        for _ in range(ANY_VALUE_DEPTH):
            inner = self._any[-1]
            self._any.append(alt(self._scalar(), self._array_of(inner), self._object_of(inner)))

    # ---- helpers -------------------------------------------------------------------------
    def _tok(self, text: str):
        return seq(self.ws, literal(text), self.ws)

    def _scalar(self):
        return alt(
            self._string_plain(), _NUMBER, literal("true"), literal("false"), literal("null")
        )

    def _string_plain(self):
        return seq(literal('"'), star(JSON_CHAR), literal('"'))

    def _array_of(self, item):
        body = seq(item, star(seq(self._tok(","), item)))
        return seq(literal("["), self.ws, opt(seq(body, self.ws)), literal("]"))

    def _object_of(self, value):
        pair = seq(self._string_plain(), self._tok(":"), value)
        body = seq(pair, star(seq(self._tok(","), pair)))
        return seq(literal("{"), self.ws, opt(seq(body, self.ws)), literal("}"))

    def any_value(self):
        return self._any[-1]

    def resolve(self, ref: str, where: str):
        if not ref.startswith("#"):
            raise ValueError(f"{where}: only local $ref ('#/...') is supported, got {ref!r}")
        node = self.root
        frag = urllib.parse.unquote(ref[1:])
        for part in [p for p in frag.split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ValueError(f"{where}: cannot resolve $ref {ref!r}")
        return node

    # ---- main dispatch -------------------------------------------------------------------
    def convert(self, schema, where: str = "#"):
        self.deadline.check()
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            return NEVER
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: a schema must be an object or a boolean, got {schema!r}")
        unknown = sorted(set(schema) & UNSUPPORTED)
        if unknown:
            raise ValueError(f"{where}: unsupported JSON Schema keyword(s): {', '.join(unknown)}")
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref" and k in _HANDLED}
            if rest:
                return self.convert({"allOf": [{"$ref": schema["$ref"]}, rest]}, where)
            return self._ref(schema["$ref"], where)
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for i, sub in enumerate(schema["allOf"]):
                merged = self._merge(merged, self._inline(sub, f"{where}/allOf/{i}"), where)
            return self.convert(merged, where)
        if "anyOf" in schema or "oneOf" in schema:
            return self._alternatives(schema, where)
        if "enum" in schema or "const" in schema:
            return self._enum(schema, where)
        types = schema.get("type", list(_TYPES))
        types = [types] if isinstance(types, str) else list(types)
        bad = [t for t in types if t not in _TYPES]
        if bad:
            raise ValueError(f"{where}: unknown type(s) {bad}")
        if "integer" in types and "number" in types:
            types.remove("integer")
        return Alt(tuple(getattr(self, f"_{t}")(schema, where) for t in types))

    def _ref(self, ref: str, where: str):
        if ref in self._stack:
            self._recursive.add(ref)
            return Ref(ref)
        if ref in self.defs:
            return Ref(ref)
        if ref in self._ref_ir:
            return self._ref_ir[ref]
        self._stack.append(ref)
        ir = self.convert(self.resolve(ref, where), ref)
        self._stack.pop()
        if ref in self._recursive:
            self.defs[ref] = ir
            return Ref(ref)
        self._ref_ir[ref] = ir
        return ir

    def _inline(self, schema, where: str):
        """`schema` with a top-level $ref replaced by its (non-recursive) target."""
        seen = set()
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen or ref in self._stack:
                raise ValueError(f"{where}: recursive $ref {ref!r} inside allOf is not supported")
            seen.add(ref)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = self._merge(rest, self.resolve(ref, where), where)
        return schema

    # ---- allOf merging -------------------------------------------------------------------
    def _merge(self, a, b, where: str):
        if a is False or b is False:
            return False
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        b = self._inline(b, where)
        if "allOf" in b:
            for sub in b["allOf"]:
                a = self._merge(a, self._inline(sub, where), where)
            b = {k: v for k, v in b.items() if k != "allOf"}
        if ("prefixItems" in a and "items" in b) or ("items" in a and "prefixItems" in b):
            raise ValueError(
                f"{where}: cannot merge prefixItems and items from different allOf parts"
            )
        out = dict(a)
        for key, val in b.items():
            if key not in _HANDLED and key not in UNSUPPORTED:
                continue
            if key not in out:
                out[key] = val
            elif key in ("properties", "additionalProperties"):
                continue  # merged together below
            elif key == "required":
                out[key] = list(dict.fromkeys(list(out[key]) + list(val)))
            elif key == "type":
                ta = {out[key]} if isinstance(out[key], str) else set(out[key])
                tb = {val} if isinstance(val, str) else set(val)
                both = ta & tb
                both |= {"integer"} if ("integer" in ta and "number" in tb) or (
                    "number" in ta and "integer" in tb) else set()  # fmt: skip
                out[key] = sorted(both, key=_TYPES.index)
            elif key in ("minimum", "minLength", "minItems", "exclusiveMinimum") and not isinstance(
                val, bool
            ):
                out[key] = max(out[key], val)
            elif key in ("maximum", "maxLength", "maxItems", "exclusiveMaximum") and not isinstance(
                val, bool
            ):
                out[key] = min(out[key], val)
            elif key == "enum":
                out[key] = [v for v in out[key] if v in val]
            elif key == "items" and "prefixItems" not in a and "prefixItems" not in b:
                out[key] = {"allOf": [out[key], val]}
            elif out[key] != val:
                raise ValueError(f"{where}: cannot merge differing {key!r} values in allOf")
        if (
            "properties" in a
            or "properties" in b
            or "additionalProperties" in a
            or "additionalProperties" in b
        ):
            pa, pb = a.get("properties", {}), b.get("properties", {})
            xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
            props = {}
            for k in list(pa) + [k for k in pb if k not in pa]:
                sa, sb = pa.get(k, xa), pb.get(k, xb)
                props[k] = self._merge(self._inline(sa, where), self._inline(sb, where), where)
            out["properties"] = props
            out["additionalProperties"] = self._merge(xa, xb, where)
        return out

    # ---- combinators ---------------------------------------------------------------------
    def _alternatives(self, schema, where: str):
        key = "anyOf" if "anyOf" in schema else "oneOf"
        if "anyOf" in schema and "oneOf" in schema:
            raise ValueError(f"{where}: anyOf together with oneOf is not supported")
        rest = {k: v for k, v in schema.items() if k != key and k in _HANDLED}
        branches = []
        for i, sub in enumerate(schema[key]):
            merged = (
                self._merge(rest, self._inline(sub, f"{where}/{key}/{i}"), where) if rest else sub
            )
            branches.append(self.convert(merged, f"{where}/{key}/{i}"))
        if key == "oneOf" and len(branches) > 1:
            from .disjoint import check_disjoint

            check_disjoint(branches, where, self.deadline)
        return Alt(tuple(branches))

    def _enum(self, schema, where: str):
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        if "const" in schema and "enum" in schema:
            values = [v for v in values if v in schema["enum"]]
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k in _HANDLED}
        texts = list(dict.fromkeys(_compact(v) for v in values))
        if rest:
            from .automaton import RegexAutomaton

            automaton = RegexAutomaton(self.convert(rest, where), self.deadline)
            texts = [t for t in texts if _matches(automaton, t.encode("utf-8"))]
        return Alt(tuple(literal(t) for t in texts))

    # ---- types ---------------------------------------------------------------------------
    def _null(self, schema, where):
        return literal("null")

    def _boolean(self, schema, where):
        return alt(literal("true"), literal("false"))

    def _string(self, schema, where):
        pattern, fmt = schema.get("pattern"), schema.get("format")
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if pattern is not None or fmt is not None:
            if lo or hi is not None:
                raise ValueError(
                    f"{where}: pattern/format together with min/maxLength is not supported"
                )
            if pattern is not None and fmt is not None:
                raise ValueError(f"{where}: pattern together with format is not supported")
            if pattern is not None:
                ir = parse_search_regex(pattern)
            elif fmt in FORMATS:
                ir = parse_regex(FORMATS[fmt])
            else:
                raise ValueError(f"{where}: unsupported string format {fmt!r}")
            return seq(literal('"'), map_chars(ir, _json_chars), literal('"'))
        return seq(
            literal('"'), Repeat(JSON_CHAR, int(lo), None if hi is None else int(hi)), literal('"')
        )

    def _bounds(self, schema, where):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        lo_x = hi_x = False
        ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if isinstance(ex_lo, bool):  # draft 4
            lo_x = ex_lo
        elif ex_lo is not None and (lo is None or ex_lo >= lo):
            lo, lo_x = ex_lo, True
        if isinstance(ex_hi, bool):
            hi_x = ex_hi
        elif ex_hi is not None and (hi is None or ex_hi <= hi):
            hi, hi_x = ex_hi, True
        return lo, lo_x, hi, hi_x

    def _integer(self, schema, where):
        lo, lo_x, hi, hi_x = self._bounds(schema, where)
        if lo is None and hi is None:
            return _INT
        ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
        if ilo is not None and ihi is not None and ilo > ihi:
            return NEVER
        return parse_regex(int_range_regex(ilo, ihi))

    def _number(self, schema, where):
        lo, lo_x, hi, hi_x = self._bounds(schema, where)
        if lo is None and hi is None:
            return _NUMBER
        for b in (lo, hi):
            if b is not None and b != math.floor(b):
                raise ValueError(f"{where}: non-integer bound {b} on a number is not supported")
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
        return parse_regex(number_range_regex(lo, lo_x, hi, hi_x))

    def _array(self, schema, where):
        items = schema.get("items")
        if isinstance(items, list):  # draft 4 tuple form
            prefix, tail = items, schema.get("additionalItems", True)
        else:
            prefix = schema.get("prefixItems", [])
            tail = True if items is None else items
            if "additionalItems" in schema:
                raise ValueError(
                    f"{where}: additionalItems without an items array is not supported"
                )
        elems = [self.convert(s, f"{where}/prefixItems/{i}") for i, s in enumerate(prefix)]
        tail_ir = None if tail is False else self.convert(tail, f"{where}/items")
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        hi = None if hi is None else int(hi)
        sep = self._tok(",")
        k = len(elems)

        def rest(i: int):  # continuation after i emitted elements
            if hi is not None and i >= hi:
                return EMPTY if i >= lo else NEVER
            if i >= k:
                if tail_ir is None:
                    return EMPTY if i >= lo else NEVER
                return Repeat(seq(sep, tail_ir), max(lo - i, 0), None if hi is None else hi - i)
            more = seq(sep, elems[i], rest(i + 1))
            return alt(more, EMPTY) if i >= lo else more

        if k:
            first = seq(elems[0], rest(1))
        elif tail_ir is not None:
            first = seq(tail_ir, rest(1))
        else:
            first = NEVER
        if hi == 0:
            first = NEVER
        options = [seq(literal("["), self.ws, first, self.ws, literal("]"))]
        if lo == 0:
            options.append(seq(literal("["), self.ws, literal("]")))
        return Alt(tuple(options))

    def _object(self, schema, where):
        props = schema.get("properties", {})
        required = list(schema.get("required", []))
        extra_schema = schema.get("additionalProperties", True)
        declared = [(k, props[k]) for k in props]
        declared += [(k, extra_schema) for k in required if k not in props]
        entries = []
        for key, sub in declared:
            value = self.convert(sub, f"{where}/properties/{key}")
            if value is NEVER or sub is False:
                if key in required:
                    return NEVER
                continue
            pair = seq(json_string_literal(key), self._tok(":"), value)
            entries.append((pair, key in required))
        sep = self._tok(",")
        extra = None
        if extra_schema is not False:
            value = self.convert(extra_schema, f"{where}/additionalProperties")
            if value is not NEVER:
                extra = seq(_key_not_in([k for k, _ in declared]), self._tok(":"), value)
        tail_b = star(seq(sep, extra)) if extra is not None else EMPTY
        tail_a = opt(seq(extra, tail_b)) if extra is not None else EMPTY
        a, b = tail_a, tail_b
        for pair, req in reversed(entries):
            if req:
                a, b = seq(pair, b), seq(sep, pair, b)
            else:
                a, b = alt(seq(pair, b), a), seq(opt(seq(sep, pair)), b)
        return seq(literal("{"), self.ws, a, self.ws, literal("}"))


def _matches(automaton, data: bytes) -> bool:
    state = automaton.initial
    for b in data:
        state = int(automaton.row(state)[b])
        if state < 0:
            return False
    return automaton.is_accepting(state)


def schema_to_ir(schema, whitespace_pattern: str | None, deadline: Deadline):
    """(IR of the top-level value, {ref: IR} of recursive definitions; empty when regular)."""
    if not isinstance(schema, (dict, bool)):
        raise ValueError(
            f"a JSON schema must be an object or a boolean, got {type(schema).__name__}"
        )
    conv = SchemaConverter(schema, whitespace_pattern, deadline)
    ir = conv.convert(schema)
    return ir, conv.defs
