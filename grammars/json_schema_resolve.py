"""JSON Schema normalisation: the keyword vocabulary, local `$ref` resolution, `allOf` merging.

Works on schemas only (no regex IR): `SchemaResolver.merge` folds `allOf` parts (and a `$ref`
with sibling keywords) into one schema that the converter then translates.
"""

from __future__ import annotations

import urllib.parse

from .json_schema_disjoint import json_common
from .json_schema_numbers import check_numbers
from .nfa import Deadline
from .regex_algebra import search

# Keywords the converter implements; other known ones are annotations or UNSUPPORTED.
HANDLED = {
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
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class SchemaResolver:
    """Resolves local `$ref`s in `root` and merges `allOf` parts into one schema."""

    def __init__(self, root, deadline: Deadline):
        self.root = root
        self.deadline = deadline
        self.stack: list[str] = []  # $refs whose conversion is under way (the converter's)

    def resolve(self, ref: str, where: str):
        """The subschema a local `$ref` (a JSON pointer fragment) points to."""
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

    def inline(self, schema, where: str):
        """`schema` with a top-level $ref replaced by its (non-recursive) target."""
        seen = set()
        while isinstance(schema, dict) and "$ref" in schema:
            self.deadline.check()
            ref = schema["$ref"]
            if ref in seen or ref in self.stack:
                raise ValueError(f"{where}: recursive $ref {ref!r} inside allOf is not supported")
            seen.add(ref)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = self.merge(rest, self.resolve(ref, where), where)
        return schema

    def merge(self, a, b, where: str):
        """One schema for `allOf: [a, b]`; raises where the two cannot be merged."""
        if a is False or b is False:
            return False
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        self.deadline.check()
        b = self.inline(b, where)
        for part in (a, b):
            if not isinstance(part, dict):
                raise ValueError(f"{where}: a schema must be an object or a boolean, got {part!r}")
            check_numbers(part, where)
        if "allOf" in b:
            for sub in b["allOf"]:
                a = self.merge(a, self.inline(sub, where), where)
            b = {k: v for k, v in b.items() if k != "allOf"}
        if ("prefixItems" in a and "items" in b) or ("items" in a and "prefixItems" in b):
            raise ValueError(
                f"{where}: cannot merge prefixItems and items from different allOf parts"
            )
        out = dict(a)
        for key, val in b.items():
            if key not in HANDLED and key not in UNSUPPORTED:
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
                out[key] = sorted(both, key=TYPES.index)
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
                props[k] = self.merge(self.inline(sa, where), self.inline(sb, where), where)
            out["properties"] = props
            out["additionalProperties"] = self.merge(xa, xb, where)
        return out


def _unlisted_schema(patterns: dict | None, additional, key: str, deadline: Deadline):
    """What applies to property `key` of an object whose `properties` do not list it."""
    hits = [s for p, s in (patterns or {}).items() if search(p, key, deadline)]
    return {"allOf": hits} if hits else additional
