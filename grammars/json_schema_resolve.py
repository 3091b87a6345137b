"""JSON Schema normalisation: the keyword vocabulary, canonical form, `$ref` resolution, `allOf`.

Works on schemas only (no regex IR): `SchemaResolver.merge` folds `allOf` parts (and a `$ref`
with sibling keywords) into one schema that the converter then translates.

Canonical form (`canonical_schema`, the compiler's cache key): the keywords of every schema
object sorted; what is order-sensitive kept as written: the names of `properties` (their order
is the order the generated text writes them in) and of the other name-to-schema maps, every
array, and data (`const`, `enum`, `default`, `examples`). Two schemas with the same canonical
form have the same language. `SchemaResolver.key` numbers schema objects by structure (equal
structure, equal number) so that the converter translates each distinct sub-schema once.

Nothing here recurses with depth proportional to the input: the canonical form and keys are
iterative, the document may nest at most `MAX_DOCUMENT_DEPTH` arrays/objects, and conversion
and merging may nest at most `MAX_SCHEMA_DEPTH` levels (`$ref` chains included; a chain of
bare `{"$ref": ...}` schemas is followed in a loop and costs one level); past either a
`ValueError` names the limit.
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .json_schema_disjoint import json_common
from .json_schema_formats import FORMATS
from .json_schema_numbers import check_numbers
from .native_build import load_extension
from .nfa import Deadline
from .regex_algebra import search

# Keywords the converter implements; other known ones are annotations or UNSUPPORTED.
HANDLED = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "patternProperties", "minProperties", "maxProperties", "dependencies",
    "dependentRequired", "dependentSchemas", "not", "uniqueItems", "multipleOf", "propertyNames",
    "if", "then", "else",
}  # fmt: skip
# Keywords with validation meaning (drafts 3 to 2020-12) that are not implemented: they raise.
# Keywords outside the JSON Schema vocabularies are annotations by the spec and change nothing.
UNSUPPORTED = {
    "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "extends",
    "disallow", "divisibleBy",
}  # fmt: skip
_APPLYING = HANDLED | UNSUPPORTED  # keywords with validation meaning
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")

MAX_MERGED_BRANCHES = 64  # branches of two anyOf/oneOf lists merged in allOf (the pairs)
MAX_SCHEMA_DEPTH = 128  # nested conversions/merges (~4 Python frames each)
MAX_DOCUMENT_DEPTH = 2 * MAX_SCHEMA_DEPTH  # arrays/objects in the schema document
# Keywords whose value maps names to schemas (names kept in order) or is data (kept as is).
NAME_MAPS = frozenset({
    "properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies",
})  # fmt: skip
DATA = frozenset({"const", "enum", "default", "examples", "example"})
DOC_SOURCE = Path(__file__).with_name("schema_doc.c")


@functools.cache
def schema_doc() -> ModuleType | None:
    """The C module for `canonical_schema` and `SchemaResolver.key` (`schema_doc.c`), or None
    (the Python twins) with the reason logged or warned once."""
    return load_extension(
        "schema canonical form and keys", "they use the slower Python code", DOC_SOURCE
    )


def _too_deep(where: str, what: str, limit: int, knob: str) -> ValueError:
    return ValueError(
        f"{where}: {what} is nested too deeply: more than {limit} levels ({knob}, kept well "
        "below Python's recursion limit)"
    )


@dataclass(frozen=True)
class SchemaSource:
    """A JSON Schema request, parsed: what every grammar compiler (ours, the peers') keys on."""

    schema: Any  # as given (a dict or a boolean)
    canonical: Any  # `canonical_schema(schema)`
    whitespace_pattern: str | None
    key: str  # the cache key: the canonical form and the whitespace pattern, as JSON text


def parse_schema_source(schema, whitespace_pattern: str | None = None) -> SchemaSource:
    """`schema` (a dict, a boolean or JSON text) parsed and keyed; ValueError if the text is
    not JSON or `whitespace_pattern` is not a regex."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"JSON schema text is not valid JSON: {exc}") from None
    if whitespace_pattern is not None:
        try:
            re.compile(whitespace_pattern)
        except re.error as exc:
            raise ValueError(f"invalid whitespace_pattern: {exc}") from None
    canonical = canonical_schema(schema)
    key = json.dumps([canonical, whitespace_pattern])
    return SchemaSource(schema, canonical, whitespace_pattern, key)


def canonical_schema(schema):
    """A copy of `schema` in canonical form (see module docstring); raises past
    `MAX_DOCUMENT_DEPTH`."""
    native = schema_doc()
    if native is not None:
        try:
            return native.canonical(schema, NAME_MAPS, DATA, MAX_DOCUMENT_DEPTH)
        except native.TooDeep:
            pass  # the Python code names where
    return _canonical_schema(schema)


def _canonical_schema(schema):
    """`canonical_schema` in Python (the C one's twin)."""
    # Post-order over an explicit stack of (node, kind, depth, path, expanded); kind is
    # "schema", "map" (names to schemas) or "data" (left as written, never stacked). A path is
    # (parent's path, name), written out only for the error.
    done: dict[tuple[int, str], object] = {}
    stack: list[tuple[Any, str, int, Any, bool]] = [(schema, "schema", 0, None, False)]
    while stack:
        node, kind, depth, path, expanded = stack.pop()
        if not isinstance(node, (dict, list)) or (id(node), kind) in done:
            continue
        if depth > MAX_DOCUMENT_DEPTH:
            raise _too_deep(_path_text(path), "the schema document", MAX_DOCUMENT_DEPTH,
                            "MAX_DOCUMENT_DEPTH")  # fmt: skip
        children = _children(node, kind)
        if not expanded:
            stack.append((node, kind, depth, path, True))
            stack += [(c, k, depth + 1, (path, n), False) for n, c, k in children
                      if k != "data" and isinstance(c, (dict, list))]  # fmt: skip
            continue
        items = [(n, c if k == "data" else done.get((id(c), k), c)) for n, c, k in children]
        if isinstance(node, list):
            done[id(node), kind] = [c for _n, c in items]
        else:
            done[id(node), kind] = dict(sorted(items) if kind == "schema" else items)
    return done.get((id(schema), "schema"), schema)


def _path_text(path) -> str:
    """A `canonical_schema` path as a JSON pointer fragment."""
    names = []
    while path is not None:
        path, name = path
        names.append(str(name))
    return "/".join(["#", *reversed(names)])


def _children(node, kind: str) -> list[tuple[object, object, str]]:
    """(name, child, child's kind) for a dict or list of the given kind."""
    if isinstance(node, list):
        return [(i, c, kind) for i, c in enumerate(node)]
    if kind == "map":
        return [(k, c, "schema") for k, c in node.items()]
    return [
        (k, c, "map" if k in NAME_MAPS else "data" if k in DATA else "schema")
        for k, c in node.items()
    ]


class SchemaResolver:
    """Resolves local `$ref`s in `root` and merges `allOf` parts into one schema."""

    def __init__(self, root, deadline: Deadline, number: Callable[[Hashable], int] | None = None):
        """`number` numbers structures for `key` (shared by compiles: `json_schema_memo`);
        by default, numbers of this resolver's own."""
        self.root = root
        self.deadline = deadline
        self.ref_siblings = ref_siblings_apply(root)
        self.depth = 0  # conversions and merges under way, nested (`enter`)
        self._keys: dict[int, tuple[object, int]] = {}  # id -> (node kept alive, key)
        if number is None:
            shapes: dict[Hashable, int] = {}
            number = lambda shape: shapes.setdefault(shape, len(shapes))  # noqa: E731
        self._number = number
        # (ref, number of its target) per `resolve` call so far: what a conversion read of
        # the document around it
        self.resolved: list[tuple[str, int]] = []

    def enter(self, where: str) -> None:
        """One more nested conversion or merge; raises past `MAX_SCHEMA_DEPTH` (pair with
        `leave`)."""
        if self.depth >= MAX_SCHEMA_DEPTH:
            raise _too_deep(where, "the schema ($ref chains and allOf merges included)",
                            MAX_SCHEMA_DEPTH, "MAX_SCHEMA_DEPTH")  # fmt: skip
        self.depth += 1

    def leave(self) -> None:
        self.depth -= 1

    def key(self, node) -> int:
        """A number equal for structurally equal JSON values (keys in the order written)."""
        keys = self._keys
        got = keys.get(id(node))
        if got is not None:
            return got[1]
        native = schema_doc()
        if native is not None:
            try:
                return native.key(node, keys, self._number)
            except native.TooDeep:
                pass  # the Python code goes on from what C numbered
        stack = [(node, False)]
        while stack:
            item, expanded = stack.pop()
            if id(item) in keys:
                continue
            values = list(item.values()) if isinstance(item, dict) else item
            if not expanded:
                stack.append((item, True))
                stack += [(v, False) for v in values if isinstance(v, (dict, list))]
                continue
            parts = tuple([keys[id(v)][1] if isinstance(v, (dict, list)) else (v.__class__, v)
                           for v in values])  # fmt: skip
            shape = (tuple(item), parts) if isinstance(item, dict) else (None, parts)
            keys[id(item)] = (item, self._number(shape))
        return keys[id(node)][1]

    def follow(self, ref: str, where: str) -> tuple[str, object]:
        """(last $ref, its target) along a chain of bare `{"$ref": ...}` schemas; raises on a
        chain that comes back to itself (a schema with no content)."""
        first, seen = ref, {ref}
        target = self.resolve(ref, where)
        while isinstance(target, dict) and self.bare_ref(target):
            self.deadline.check()
            ref = target["$ref"]
            if ref in seen:
                raise ValueError(f"{where}: $ref {first!r} refers back to itself ({ref!r})")
            seen.add(ref)
            target = self.resolve(ref, where)
        return ref, target

    def ref_siblings_of(self, schema: dict) -> dict:
        """The keywords beside `schema`'s `$ref` that apply (none before draft 2019-09)."""
        if not self.ref_siblings:
            return {}
        return {k: v for k, v in schema.items() if k != "$ref" and k in _APPLYING}

    def bare_ref(self, schema: dict) -> bool:
        """True for a `$ref` with no keyword beside it that applies."""
        return "$ref" in schema and not self.ref_siblings_of(schema)

    def resolve(self, ref: str, where: str):
        """The subschema a local `$ref` (a JSON pointer fragment) points to."""
        if not ref.startswith("#"):
            raise ValueError(f"{where}: only local $ref ('#/...') is supported, got {ref!r}")
        node = json_pointer(self.root, ref)
        if node is None:
            raise ValueError(f"{where}: cannot resolve $ref {ref!r}")
        self.resolved.append((ref, self.number_of(node)))
        return node

    def points_to(self, ref: str, number: int) -> bool:
        """Whether `ref` resolves here to a value numbered `number` (see `number_of`)."""
        node = json_pointer(self.root, ref) if ref.startswith("#") else None
        return node is not None and self.number_of(node) == number

    def number_of(self, value) -> int:
        """`key` of any JSON value, scalars included."""
        if isinstance(value, (dict, list)):
            return self.key(value)
        return self._number(("value", (value.__class__, value)))

    def inline(self, schema, where: str):
        """`schema` with a top-level $ref replaced by its (non-recursive) target."""
        seen = set()
        while isinstance(schema, dict) and "$ref" in schema:
            self.deadline.check()
            ref = schema["$ref"]
            if ref in seen:
                raise ValueError(f"{where}: $ref {ref!r} refers back to itself")
            seen.add(ref)
            rest = self.ref_siblings_of(schema)
            schema = self.merge(rest, self.resolve(ref, where), where)
        return schema

    def flatten(self, schema, where: str):
        """`schema` inlined (`inline`) with its `allOf` parts merged into it."""
        schema = self.inline(schema, where)
        if not isinstance(schema, dict) or "allOf" not in schema:
            return schema
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for i, sub in enumerate(schema["allOf"]):
            merged = self.merge(merged, self.inline(sub, f"{where}/allOf/{i}"), where)
        return merged

    def merge(self, a, b, where: str):
        """One schema for `allOf: [a, b]`; raises where the two cannot be merged."""
        if a is False or b is False:
            return False
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        self.enter(where)
        try:
            return self._merge(a, b, where)
        finally:
            self.leave()

    def _merge(self, a, b, where: str):
        self.deadline.check()
        b = self.inline(b, where)
        for part in (a, b):
            if not isinstance(part, dict):
                raise ValueError(f"{where}: a schema must be an object or a boolean, got {part!r}")
            check_numbers(part, where)
        # a condition holds of its own part: as allOf/anyOf it cannot meet the other's `else`
        a, b = (conditional_cases(p) if not CONDITIONAL.isdisjoint(p) else p for p in (a, b))
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
            elif key in ("properties", "additionalProperties", "patternProperties"):
                continue  # merged together below
            elif out[key] == val:
                continue  # a keyword holds with itself (x and x is x), anyOf/oneOf lists too
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
            elif key == "format" and val not in FORMATS:
                continue  # an annotation (see `json_schema`)
            elif key == "format" and out[key] not in FORMATS:
                out[key] = val
            elif key == "enum":
                out[key] = json_common(list(out[key]), list(val))
            elif key == "const":
                if not json_common([out[key]], [val]):
                    return False  # two different values at once: no value meets both
            elif key in ("anyOf", "oneOf") and len(out[key]) * len(val) <= MAX_MERGED_BRANCHES:
                # Exactly one (or any) of each list holds <=> of the pairs, exactly one (any).
                out[key] = [{"allOf": [x, y]} for x in out[key] for y in val]
            elif key == "items" and "prefixItems" not in a and "prefixItems" not in b:
                out[key] = {"allOf": [out[key], val]}
            elif out[key] != val:
                raise ValueError(f"{where}: cannot merge differing {key!r} values in allOf")
        if any(k in part for part in (a, b) for k in _PROPERTY_KEYS):
            pa, pb = a.get("properties", {}), b.get("properties", {})
            xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
            ppa, ppb = a.get("patternProperties") or {}, b.get("patternProperties") or {}
            # Patterns on both sides: a name matching only one side's patterns meets the other
            # side's additionalProperties, which the merged patterns cannot say unless it is
            # open (or the pattern is the other side's too).
            if (set(ppb) - set(ppa) and xa not in (True, {})) or (
                set(ppa) - set(ppb) and xb not in (True, {})
            ):
                raise ValueError(
                    f"{where}: cannot merge patternProperties in allOf (a pattern only one part "
                    "has would meet the other part's additionalProperties)"
                )
            if ppa or ppb:
                out["patternProperties"] = {
                    p: self.merge(self.inline(ppa[p], where), self.inline(ppb[p], where), where)
                    if p in ppa and p in ppb
                    else ppa.get(p, ppb.get(p))
                    for p in {**ppa, **ppb}
                }  # fmt: skip
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


_PROPERTY_KEYS = ("properties", "additionalProperties", "patternProperties")


def _unlisted_schema(patterns: dict | None, additional, key: str, deadline: Deadline):
    """What applies to property `key` of an object whose `properties` do not list it."""
    hits = [s for p, s in (patterns or {}).items() if search(p, key, deadline)]
    return {"allOf": hits} if hits else additional


CONDITIONAL = frozenset(("if", "then", "else"))


def conditional_cases(schema: dict) -> dict:
    """`schema` with `if`/`then`/`else` as `allOf` of `anyOf` [`if` and `then`, `not if` and
    `else`]; `then` and `else` without `if` are dropped (they mean nothing then)."""
    rest = {k: v for k, v in schema.items() if k not in CONDITIONAL}
    if "if" not in schema:
        return rest
    cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
    cases = {"anyOf": [{"allOf": [cond, then]}, {"allOf": [{"not": cond}, other]}]}
    return {**rest, "allOf": [*rest.get("allOf", []), cases]}


def ref_siblings_apply(root) -> bool:
    """Whether keywords beside a `$ref` apply: from draft 2019-09 on; drafts 3 to 7 ignore
    them. The draft is the one `$schema` names; without it, a document with `definitions`
    and no `$defs` is taken for draft 7 or older."""
    if not isinstance(root, dict):
        return True
    dialect = root.get("$schema")
    if isinstance(dialect, str):
        return re.search(r"draft-0[3-7]", dialect) is None
    return "definitions" not in root or "$defs" in root


def json_pointer(root: Any, ref: str) -> Any:
    """What the local `$ref` (`#` and a URI-escaped JSON pointer) points to in `root`; None
    when it points at nothing."""
    node = root
    for part in [p for p in urllib.parse.unquote(ref[1:]).split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
