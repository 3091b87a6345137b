"""Schema-level proof that two `oneOf` branches share no valid JSON value.

`oneOf` is exact only when no value satisfies two branches; the generated grammar accepts the
union of the branches, so a pair of branches is allowed only when this module (or the JSON type
check in `disjoint`) proves them exclusive. The proof is sound but incomplete: a branch pair is
disjoint when their JSON types cannot meet, when their `const`/`enum` values cannot meet or fail
the other branch's simple assertions, or (for objects) when some property is required by one
branch and its schemas in the two branches are disjoint (the other forbidding it included), or
the other refuses the names one requires by `not` of required names.
`whole_types` finds the JSON types a branch accepts whole: a type two branches accept whole
has no value that `oneOf` allows, so the converter takes it out of every branch first.
"""

from __future__ import annotations

import json
import math
import re

from .nfa import CompileTimeout, Deadline
from .regex_algebra import search

_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
# Keywords that constrain values of one JSON type only (numbers' apply to integers too).
TYPE_KEYWORDS = {
    "object": {
        "properties", "required", "additionalProperties", "patternProperties", "minProperties",
        "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
        "unevaluatedProperties",
    },
    "array": {
        "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
        "contains", "minContains", "maxContains", "unevaluatedItems",
    },
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}  # fmt: skip
_TYPED = set().union(*TYPE_KEYWORDS.values())


def json_key(value) -> str:
    """Text that is equal for equal JSON values: 1 and 1.0 alike, true unlike 1, keys unordered."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))


def _canonical(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def json_common(values: list, others: list, inside: bool = True) -> list:
    """The `values` equal to one of `others` (with inside=False: equal to none of them).

    Linear in both lists, so a request cannot make it quadratic with two long enums.
    """
    keys = set(map(json_key, others))
    return [v for v in values if (json_key(v) in keys) == inside]


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


def listed_values(schema: dict) -> list | None:
    """The values `const` and `enum` allow (those in both where both are given), None when
    the schema has neither."""
    if "const" not in schema:
        return list(schema["enum"]) if "enum" in schema else None
    values = [schema["const"]]
    return json_common(values, list(schema["enum"])) if "enum" in schema else values


def _types(schema) -> set[str]:
    """JSON types a value of `schema` may have (integer stands for integral numbers too)."""
    got = schema.get("type", _TYPES)
    out = {got} if isinstance(got, str) else set(got)
    if "number" in out:
        out.add("integer")
    values = listed_values(schema)
    if values is not None:
        out &= {json_type(v) for v in values} | (
            {"number"} if any(json_type(v) == "integer" for v in values) else set()
        )
    return out


class DisjointProver:
    """Proves branch exclusivity; `inline(schema)` must resolve a top-level `$ref` (and may
    merge `allOf` parts in)."""

    def __init__(self, inline, formats: dict[str, str], vocabulary: set[str], deadline: Deadline):
        self.inline = inline
        self.formats = formats
        self.vocabulary = vocabulary  # the keywords that constrain values
        self.deadline = deadline

    def whole_types(self, schema) -> set[str]:
        """The JSON types every value of which `schema` accepts (proven; may miss some)."""
        schema = self._resolve(schema)
        if schema is True or schema == {}:
            return set(_TYPES)
        if not isinstance(schema, dict):
            return set()
        applied = {k for k in schema if k in self.vocabulary and k != "type"}
        out = set()
        for kind in _types(schema):
            own = TYPE_KEYWORDS.get("number" if kind == "integer" else kind, set())
            if applied <= _TYPED - own:
                out.add(kind)
        return out

    def disjoint(self, a, b, depth: int = 0) -> bool:
        if depth > 8:
            return False
        a, b = self._resolve(a), self._resolve(b)
        if a is None or b is None:
            return False
        if a is False or b is False:
            return True
        if a is True or b is True or not isinstance(a, dict) or not isinstance(b, dict):
            return False
        common = _types(a) & _types(b)
        if not common:
            return True
        va, vb = listed_values(a), listed_values(b)
        if va is not None and vb is not None:
            return not json_common(va, vb)
        if va is not None:
            return all(self.excludes(b, v) for v in va)
        if vb is not None:
            return all(self.excludes(a, v) for v in vb)
        if common == {"object"}:
            return self._objects_disjoint(a, b, depth)
        return False

    def _objects_disjoint(self, a, b, depth: int) -> bool:
        # A property one side requires must, where the other has it, meet both its schemas.
        req_a, req_b = set(a.get("required", [])), set(b.get("required", []))
        if _refuses_names(a, req_b) or _refuses_names(b, req_a):
            return True
        for key in req_a | req_b:
            sa, sb = self._property(a, key), self._property(b, key)
            if self.disjoint(sa, sb, depth + 1):
                return True
        return False

    def excludes(self, schema, value, depth: int = 0) -> bool:
        """True when `value` is proven invalid under `schema`."""
        if depth > 8:
            return False
        schema = self._resolve(schema)
        if schema is False:
            return True
        if not isinstance(schema, dict):
            return False
        kind = json_type(value)
        if kind not in _types(schema):
            return True
        values = listed_values(schema)
        if values is not None and not json_common([value], values):
            return True
        if kind == "string":
            return self._string_excludes(schema, value)
        if kind in ("integer", "number"):
            return _number_excludes(schema, value)
        if kind == "object":
            if _refuses_names(schema, set(value)):
                return True
            return any(key not in value for key in schema.get("required", [])) or any(
                self.excludes(self._property(schema, key), v, depth + 1) for key, v in value.items()
            )
        return False

    def _string_excludes(self, schema, value: str) -> bool:
        if len(value) < schema.get("minLength", 0):
            return True
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return True
        if "pattern" in schema and not search(schema["pattern"], value, self.deadline):
            return True
        fmt = schema.get("format")
        return fmt in self.formats and re.fullmatch(self.formats[fmt], value) is None

    def _resolve(self, schema):
        """`inline(schema)`, or None when it cannot be resolved (which proves nothing)."""
        try:
            return self.inline(schema)
        except CompileTimeout:
            raise
        except ValueError:
            return None

    def _property(self, schema, key: str):
        """What applies to property `key` of an object under `schema`."""
        if key in schema.get("properties", {}):
            return schema["properties"][key]
        patterns = schema.get("patternProperties", {})
        hits = [s for p, s in patterns.items() if search(p, key, self.deadline)]
        if hits:
            return {"allOf": hits}
        return schema.get("additionalProperties", True)


def _refuses_names(schema: dict, present: set) -> bool:
    """Whether `schema`'s `not` of required names refuses every object holding the names
    `present` (all the names it lists are among them)."""
    neg = schema.get("not")
    return isinstance(neg, dict) and set(neg) == {"required"} and set(neg["required"]) <= present


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
