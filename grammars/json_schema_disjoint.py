"""Schema-level proof that two `oneOf` branches share no valid JSON value.

`oneOf` is exact only when no value satisfies two branches; the generated grammar accepts the
union of the branches, so a pair of branches is allowed only when this module (or the JSON type
check in `disjoint`) proves them exclusive. The proof is sound but incomplete: a branch pair is
disjoint when their JSON types cannot meet, when their `const`/`enum` values cannot meet or fail
the other branch's simple assertions, or (for objects) when some property is required by both
with disjoint schemas, or required by one and forbidden by the other.
"""

from __future__ import annotations

import math
import re

_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def json_equal(a, b) -> bool:
    """JSON value equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(schema) -> list | None:
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if "enum" in schema else None


def _types(schema) -> set[str]:
    """JSON types a value of `schema` may have (integer stands for integral numbers too)."""
    got = schema.get("type", _TYPES)
    out = {got} if isinstance(got, str) else set(got)
    if "number" in out:
        out.add("integer")
    values = _values(schema)
    if values is not None:
        out &= {json_type(v) for v in values} | (
            {"number"} if any(json_type(v) == "integer" for v in values) else set()
        )
    return out


class DisjointProver:
    """Proves branch exclusivity; `inline(schema)` must resolve a top-level `$ref`."""

    def __init__(self, inline, formats: dict[str, str]):
        self.inline = inline
        self.formats = formats

    def disjoint(self, a, b, depth: int = 0) -> bool:
        if depth > 8:
            return False
        try:
            a, b = self.inline(a), self.inline(b)
        except ValueError:
            return False
        if a is False or b is False:
            return True
        if a is True or b is True or not isinstance(a, dict) or not isinstance(b, dict):
            return False
        common = _types(a) & _types(b)
        if not common or common == {"number"}:
            return True
        va, vb = _values(a), _values(b)
        if va is not None and vb is not None:
            return not any(json_equal(x, y) for x in va for y in vb)
        if va is not None:
            return all(self.excludes(b, v) for v in va)
        if vb is not None:
            return all(self.excludes(a, v) for v in vb)
        if common == {"object"}:
            return self._objects_disjoint(a, b, depth)
        return False

    def _objects_disjoint(self, a, b, depth: int) -> bool:
        req_a, req_b = set(a.get("required", [])), set(b.get("required", []))
        for key in req_a | req_b:
            sa, sb = _property(a, key), _property(b, key)
            if key in req_a and key in req_b and self.disjoint(sa, sb, depth + 1):
                return True
            if (key in req_a and sb is False) or (key in req_b and sa is False):
                return True
        return False

    def excludes(self, schema, value) -> bool:
        """True when `value` is proven invalid under `schema`."""
        try:
            schema = self.inline(schema)
        except ValueError:
            return False
        if schema is False:
            return True
        if not isinstance(schema, dict):
            return False
        kind = json_type(value)
        if kind not in _types(schema):
            return True
        values = _values(schema)
        if values is not None and not any(json_equal(value, v) for v in values):
            return True
        if kind == "string":
            return self._string_excludes(schema, value)
        if kind in ("integer", "number"):
            return _number_excludes(schema, value)
        return False

    def _string_excludes(self, schema, value: str) -> bool:
        if len(value) < schema.get("minLength", 0):
            return True
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return True
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return True
        fmt = schema.get("format")
        return fmt in self.formats and re.fullmatch(self.formats[fmt], value) is None


def _number_excludes(schema, value) -> bool:
    lo, hi = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    if value < lo or value > hi:
        return True
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_lo is True and value <= lo or ex_hi is True and value >= hi:
        return True
    if not isinstance(ex_lo, bool) and ex_lo is not None and value <= ex_lo:
        return True
    return not isinstance(ex_hi, bool) and ex_hi is not None and value >= ex_hi


def _property(schema, key: str):
    """What applies to property `key` of an object under `schema`."""
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    hits = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)]
    if hits:
        return {"allOf": hits}
    return schema.get("additionalProperties", True)
