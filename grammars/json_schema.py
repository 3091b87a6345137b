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
  that bounded numbers use no exponent (bounds must be integer-valued); bounds must be finite
  numbers of at most `MAX_BOUND_DIGITS` digits (any finite double), and the range becomes a
  regex of size quadratic in the digits at most (`uint_range_regex`);
- values the schema leaves free (`{}`, `true`, extra properties, items without a schema) are any
  JSON value nested at most `ANY_VALUE_DEPTH` arrays/objects deep, so the language stays regular;
- `enum`/`const` values are written compactly.
- `patternProperties`: names not declared are written after the declared ones; a name's value
  follows every pattern it matches (or `additionalProperties` if none); `minProperties` and
  `maxProperties` count declared and extra pairs alike;
- `dependencies`/`dependentRequired`/`dependentSchemas` become one case per set of present
  trigger properties (at most 64 cases);
- `not` is supported for a type, const/enum of scalars, `required` names and a `pattern`;
  other forms raise;
- `pattern`/`format` with `minLength`/`maxLength` intersect exactly (`regex_algebra`);
- `additionalItems` has no effect unless `items` is an array (as the specification says).
The language is regular unless `$ref`s recurse; then the recursive definitions become
grammar rules. `oneOf` is the union of its branches, so each pair of branches must be proven
to share no value (`json_schema_disjoint`: JSON types, const/enum values, a required property
with disjoint schemas or forbidden by the other branch; else `disjoint`'s first-byte type
check); otherwise it is rejected rather than treated as `anyOf`, which could accept a value
matching two branches.

Supported keywords: see `_HANDLED`; annotations (title, description, examples, default,
$schema, $id, $comment, $defs, ...) change nothing. Standard keywords that are not implemented (`UNSUPPORTED`) raise `ValueError` naming them and where they
are; keywords outside the JSON Schema vocabularies (e.g. `x-order`, `example`) are annotations
by the specification and are ignored.
"""

from __future__ import annotations

import json
import math
import urllib.parse

from .disjoint import check_disjoint
from .json_schema_disjoint import DisjointProver, json_common
from .json_schema_objects import DEPENDENCY_KEYS, ObjectConverter
from .nfa import CompileTimeout, Deadline
from .regex_algebra import NEVER, combine, restrict_length, search
from .regex_algebra import exclude_words as exclude_words_from
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
MAX_BOUND_DIGITS = 309  # digits of the largest finite double

_HANDLED = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "patternProperties", "minProperties", "maxProperties", "dependencies",
    "dependentRequired", "dependentSchemas", "not",
}  # fmt: skip
# Keywords with validation meaning (drafts 3 to 2020-12) that are not implemented: they raise.
# Keywords outside the JSON Schema vocabularies are annotations by the spec and change nothing.
UNSUPPORTED = {
    "if", "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "uniqueItems", "multipleOf", "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "extends",
    "disallow", "divisibleBy",
}  # fmt: skip
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")

_HEX = chars("0-9a-fA-F")
_SPECIAL = normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_PLAIN = Chars(complement(_SPECIAL))
_ANY_CHAR = Chars(complement(()))
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


_JSON_CHARS: dict[tuple, object] = {}


def _json_chars(node: Chars):
    """One string-content character from `node`, as it appears inside a JSON string."""
    got = _JSON_CHARS.get(node.ranges)
    if got is None:
        plain = subtract(node.ranges, _SPECIAL)
        escaped = [literal(_escape_char(cp)) for lo, hi in intersect(node.ranges, _SPECIAL)
                   for cp in range(lo, hi + 1)]  # fmt: skip
        got = Alt((Chars(plain), *escaped)) if escaped else Chars(plain)
        if len(_JSON_CHARS) < 4096:
            _JSON_CHARS[node.ranges] = got
    return got


def json_string_literal(text: str) -> Seq:
    return literal(json.dumps(text, ensure_ascii=False))


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _any_digits(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _at_least(digits: str) -> list[str]:
    """Alternatives for the digit strings of len(digits) that are >= digits."""
    out = []
    for i, d in enumerate(map(int, digits)):
        rest = len(digits) - i - 1
        if digits[i + 1 :] == "0" * rest:  # digits itself and all above it from here on
            out.append(digits[:i] + _digit_class(d, 9) + _any_digits(rest))
            break
        if d < 9:
            out.append(digits[:i] + _digit_class(d + 1, 9) + _any_digits(rest))
    return out or [""]


def _at_most(digits: str) -> list[str]:
    """Alternatives for the digit strings of len(digits) that are <= digits."""
    out = []
    for i, d in enumerate(map(int, digits)):
        rest = len(digits) - i - 1
        if digits[i + 1 :] == "9" * rest:
            out.append(digits[:i] + _digit_class(0, d) + _any_digits(rest))
            break
        if d > 0:
            out.append(digits[:i] + _digit_class(0, d - 1) + _any_digits(rest))
    return out or [""]


def _digits_range(lo: str, hi: str) -> list[str]:
    """Alternatives (flat: no nesting) for the digit strings of len(lo) in [lo, hi].

    Below the first digit where lo and hi differ, the strings split into those that continue
    lo's digit (>= lo's rest), those with a digit in between (any rest) and those that
    continue hi's digit (<= hi's rest): O(digits) alternatives of O(digits) characters each.
    """
    same = next((i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if a != b), len(lo))
    if same == len(lo):
        return [lo]
    prefix, rest = lo[:same], len(lo) - same - 1
    lo_rest, hi_rest = lo[same + 1 :], hi[same + 1 :]
    first = int(lo[same]) + (lo_rest != "0" * rest)  # digits whose every continuation is in
    last = int(hi[same]) - (hi_rest != "9" * rest)
    out = [] if first == int(lo[same]) else [prefix + lo[same] + a for a in _at_least(lo_rest)]
    if first <= last:
        out.append(prefix + _digit_class(first, last) + _any_digits(rest))
    if last != int(hi[same]):
        out += [prefix + hi[same] + a for a in _at_most(hi_rest)]
    return out


def uint_range_regex(lo: int, hi: int | None) -> str:
    """Regex for non-negative integers (no leading zeros) in [lo, hi]; hi None = unbounded.

    Its size is quadratic in the number of digits at most, and it nests one group deep.
    """
    if hi is not None and hi < lo:
        return "(?!)"
    low = str(lo)
    if hi is not None and len(str(hi)) == len(low):
        return "(" + "|".join(_digits_range(low, str(hi))) + ")"
    parts = _digits_range(low, "9" * len(low))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(low)},}}")
    else:
        high = str(hi)
        if len(high) - len(low) > 1:  # every number of the lengths in between
            parts.append(f"[1-9][0-9]{{{len(low)},{len(high) - 2}}}")
        parts += _digits_range("1" + "0" * (len(high) - 1), high)
    return "(" + "|".join(parts) + ")"


def int_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex for integers (JSON form) in [lo, hi]; None = unbounded."""
    if lo is not None and hi is not None and hi < lo:
        return "(?!)"
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


class SchemaConverter(ObjectConverter):
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
        _check_numbers(schema, where)
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
        if any(k in schema for k in DEPENDENCY_KEYS):
            return self._dependency_cases(schema, where)
        if "not" in schema:
            return self._not(schema, where)
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
            self.deadline.check()
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
        self.deadline.check()
        b = self._inline(b, where)
        for part in (a, b):
            if not isinstance(part, dict):
                raise ValueError(f"{where}: a schema must be an object or a boolean, got {part!r}")
            _check_numbers(part, where)
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
                out[key] = json_common(list(out[key]), list(val))
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
            ppa, ppb = a.get("patternProperties"), b.get("patternProperties")
            if (ppa and (xb not in (True, {}) or (ppb and ppb != ppa))) or (
                ppb and xa not in (True, {})
            ):
                raise ValueError(f"{where}: cannot merge patternProperties in allOf")
            props = {}
            for k in list(pa) + [k for k in pb if k not in pa]:
                sa = pa[k] if k in pa else _unlisted_schema(ppa, xa, k, self.deadline)
                sb = pb[k] if k in pb else _unlisted_schema(ppb, xb, k, self.deadline)
                if sa is True or sa == {} or sb is True or sb == {}:
                    props[k] = sb if sa is True or sa == {} else sa
                    continue
                props[k] = self._merge(self._inline(sa, where), self._inline(sb, where), where)
            out["properties"] = props
            out["additionalProperties"] = self._merge(xa, xb, where)
        return out

    # ---- combinators ---------------------------------------------------------------------
    def _not(self, schema, where: str):
        """`not` of a type, const/enum of scalars, required names or a pattern."""
        neg = self._inline(schema["not"], f"{where}/not")
        pos = {k: v for k, v in schema.items() if k != "not"}
        if neg is True or neg == {}:
            return NEVER
        if neg is False:
            return self.convert(pos, where)
        keys = set(neg) & (_HANDLED | UNSUPPORTED)
        types = pos.get("type", list(_TYPES))
        types = [types] if isinstance(types, str) else list(types)
        if keys == {"type"}:
            bad = {neg["type"]} if isinstance(neg["type"], str) else set(neg["type"])
            if "integer" in bad and "number" not in bad and "number" in types:
                raise ValueError(f"{where}: 'not' integer among numbers is not supported")
            kept = [t for t in types if t not in bad and not (t == "integer" and "number" in bad)]
            return self.convert({**pos, "type": kept}, where) if kept else NEVER
        if keys == {"required"}:
            options = [
                self.convert(
                    self._merge(pos, {"type": "object", "properties": {k: False}}, where), where
                )
                for k in dict.fromkeys(neg["required"])
            ]
            return Alt(tuple(options))
        if keys == {"pattern"} or keys == {"type", "pattern"} and neg["type"] == "string":
            if "string" not in types:
                return NEVER
            return self._string({**pos, "type": "string"}, where, exclude=neg["pattern"])
        if keys and keys <= {"enum", "const"}:
            values = [neg["const"]] if "const" in neg else list(neg["enum"])
            if "const" in neg and "enum" in neg:
                values = json_common(values, list(neg["enum"]))
            if "enum" in pos or "const" in pos:
                own = [pos["const"]] if "const" in pos else list(pos["enum"])
                kept = json_common(own, values, inside=False)
                rest = {k: v for k, v in pos.items() if k not in ("enum", "const")}
                return self.convert({**rest, "enum": kept}, where)
            if types == ["string"]:
                words = [v for v in values if isinstance(v, str)]
                return self._string(pos, where, exclude_words=words)
            try:
                spelled = Alt(tuple(_spellings(v) for v in values))
                return combine(
                    [self.convert(pos, where), spelled],
                    lambda got: got[0] and not got[1],
                    self.deadline,
                )
            except CompileTimeout:
                raise
            except ValueError as exc:
                raise ValueError(f"{where}: unsupported 'not' of const/enum: {exc}") from None
        raise ValueError(
            f"{where}: unsupported form of 'not' (supported: not of type, const/enum of scalars, "
            "required, pattern)"
        )

    def _alternatives(self, schema, where: str):
        key = "anyOf" if "anyOf" in schema else "oneOf"
        if "anyOf" in schema and "oneOf" in schema:
            raise ValueError(f"{where}: anyOf together with oneOf is not supported")
        rest = {k: v for k, v in schema.items() if k != key and k in _HANDLED}
        branches, schemas = [], []
        for i, sub in enumerate(schema[key]):
            merged = (
                self._merge(rest, self._inline(sub, f"{where}/{key}/{i}"), where) if rest else sub
            )
            schemas.append(merged)
            branches.append(self.convert(merged, f"{where}/{key}/{i}"))
        if key == "oneOf":
            self._check_exclusive(schemas, branches, where)
        return Alt(tuple(branches))

    def _check_exclusive(self, schemas: list, branches: list, where: str) -> None:
        """Raise unless every pair of `oneOf` branches is proven to share no value."""
        prover = DisjointProver(lambda s: self._inline(s, where), FORMATS, self.deadline)
        for i in range(len(schemas)):
            for j in range(i + 1, len(schemas)):
                self.deadline.check()
                if prover.disjoint(schemas[i], schemas[j]):
                    continue
                try:
                    check_disjoint([branches[i], branches[j]], where, self.deadline)
                except ValueError as exc:
                    if "overlap" not in str(exc):
                        raise
                    raise ValueError(
                        f"{where}: oneOf branches {i} and {j} may overlap (proven exclusive only "
                        "by JSON type, const/enum values or a required property); use anyOf if "
                        "either may match"
                    ) from None

    def _enum(self, schema, where: str):
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        if "const" in schema and "enum" in schema:
            values = json_common(values, list(schema["enum"]))
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k in _HANDLED}
        texts = list(dict.fromkeys(_compact(v) for v in values))
        if rest:
            from .automaton import RegexAutomaton

            automaton = RegexAutomaton(self.convert(rest, where), self.deadline)
            texts = [t for t in texts if _matches(automaton, t.encode("utf-8"), self.deadline)]
        return Alt(tuple(literal(t) for t in texts))

    # ---- types ---------------------------------------------------------------------------
    def _null(self, schema, where):
        return literal("null")

    def _boolean(self, schema, where):
        return alt(literal("true"), literal("false"))

    def _string(
        self, schema, where, exclude: str | None = None, exclude_words: list[str] | None = None
    ):
        """A JSON string; `exclude` is a pattern it must not match, `exclude_words` values."""
        pattern, fmt = schema.get("pattern"), schema.get("format")
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        hi = None if hi is None else int(hi)
        if fmt is not None and fmt not in FORMATS:
            raise ValueError(f"{where}: unsupported string format {fmt!r}")
        parts = [parse_search_regex(pattern)] if pattern is not None else []
        parts += [parse_regex(FORMATS[fmt])] if fmt is not None else []
        if not parts and exclude is None and not exclude_words:
            return seq(literal('"'), Repeat(JSON_CHAR, lo, hi), literal('"'))
        ir = parts[0] if len(parts) == 1 else star(_ANY_CHAR)
        if len(parts) == 2:
            ir = combine(parts, all, self.deadline)
        if exclude is not None:
            keep = lambda got: got[0] and not got[1]  # noqa: E731
            ir = combine([ir, parse_search_regex(exclude)], keep, self.deadline)
        if exclude_words:
            ir = exclude_words_from(ir, exclude_words, self.deadline)
        if lo or hi is not None:
            ir = restrict_length(ir, lo, hi, self.deadline)
        if ir is NEVER:
            return NEVER
        return seq(literal('"'), map_chars(ir, _json_chars), literal('"'))

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
            tail = True if items is None else items  # additionalItems applies to arrays only
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


def _unlisted_schema(patterns: dict | None, additional, key: str, deadline: Deadline):
    """What applies to property `key` of an object whose `properties` do not list it."""
    hits = [s for p, s in (patterns or {}).items() if search(p, key, deadline)]
    return {"allOf": hits} if hits else additional


def _check_numbers(schema: dict, where: str) -> None:
    """Raise ValueError unless bounds are finite numbers and counts non-negative integers."""
    for key in _BOUNDS:
        value = schema.get(key)
        if value is None or (isinstance(value, bool) and key.startswith("exclusive")):
            continue  # draft 4 writes exclusiveMinimum/exclusiveMaximum as booleans
        if not _is_finite(value):
            raise ValueError(f"{where}: {key} must be a finite number, got {value!r}")
        if abs(value) >= 10**MAX_BOUND_DIGITS:
            raise ValueError(
                f"{where}: {key} has more than {MAX_BOUND_DIGITS} digits (MAX_BOUND_DIGITS)"
            )
    for key in _COUNTS:
        value = schema.get(key)
        if value is not None and not (_is_finite(value) and value >= 0 and value == int(value)):
            raise ValueError(f"{where}: {key} must be a non-negative integer, got {value!r}")


def _is_finite(value) -> bool:
    """A JSON number other than Infinity/NaN (which Python's json accepts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _hex_ir(value: int):
    """The four hex digits of `value`, either case."""
    return seq(*(chars(c + c.upper()) if c.isalpha() else literal(c) for c in f"{value:04x}"))


def _spellings(value):
    """Every JSON text of the scalar `value` that the generated form may contain."""
    if value is None or isinstance(value, bool):
        return literal(_compact(value))
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
        options.append(literal(_escape_char(cp) if cp < 0x20 or ch in '"\\' else ch))
        if ch == "/":
            options.append(literal("\\/"))
        parts.append(alt(*options))
    return seq(literal('"'), *parts, literal('"'))


def _matches(automaton, data: bytes, deadline: Deadline) -> bool:
    deadline.check()
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
