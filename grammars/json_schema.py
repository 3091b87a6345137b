"""JSON Schema -> regex IR (and rules for recursive `$ref`s): the converter and its dispatch.

The parts: `json_schema_resolve` (keyword vocabulary, `$ref` resolution, `allOf` merging),
`json_schema_strings` and `json_schema_numbers` (scalar translators), `json_schema_objects`
(objects), `json_schema_disjoint` (the `oneOf` proof); here: dispatch, `$ref`s, combinators,
arrays and the free "any JSON value".

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

Supported keywords: see `json_schema_resolve.HANDLED`; annotations (title, description,
examples, default, $schema, $id, $comment, $defs, ...) change nothing. Standard keywords that
are not implemented (`UNSUPPORTED`) raise `ValueError` naming them and where they are; keywords
outside the JSON Schema vocabularies (e.g. `x-order`, `example`) are annotations by the
specification and are ignored.
"""

from __future__ import annotations

from .disjoint import check_disjoint
from .json_schema_disjoint import DisjointProver, json_common
from .json_schema_numbers import NUMBER, check_numbers, integer_ir, number_ir
from .json_schema_objects import DEPENDENCY_KEYS, ObjectConverter
from .json_schema_resolve import HANDLED, TYPES, UNSUPPORTED, SchemaResolver
from .json_schema_strings import FORMATS, JSON_CHAR, compact_json, spellings, string_ir
from .nfa import CompileTimeout, Deadline
from .regex_algebra import combine
from .regex_ir import EMPTY, Alt, Ref, Repeat, alt, literal, opt, parse_regex, seq, star
from .regex_terms import NEVER

ANY_VALUE_DEPTH = 3


class SchemaConverter(ObjectConverter):
    """Walks one schema; `convert` returns IR, recursive `$ref`s land in `defs`."""

    def __init__(self, root, whitespace_pattern: str | None, deadline: Deadline):
        self.deadline = deadline
        self.schemas = SchemaResolver(root, deadline)
        self.ws = EMPTY if whitespace_pattern is None else parse_regex(whitespace_pattern)
        self.defs: dict[str, object] = {}
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
        return alt(self._string_plain(), NUMBER, literal("true"), literal("false"), literal("null"))

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
        check_numbers(schema, where)
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref" and k in HANDLED}
            if rest:
                return self.convert({"allOf": [{"$ref": schema["$ref"]}, rest]}, where)
            return self._ref(schema["$ref"], where)
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for i, sub in enumerate(schema["allOf"]):
                merged = self.schemas.merge(
                    merged, self.schemas.inline(sub, f"{where}/allOf/{i}"), where
                )
            return self.convert(merged, where)
        if any(k in schema for k in DEPENDENCY_KEYS):
            return self._dependency_cases(schema, where)
        if "not" in schema:
            return self._not(schema, where)
        if "anyOf" in schema or "oneOf" in schema:
            return self._alternatives(schema, where)
        if "enum" in schema or "const" in schema:
            return self._enum(schema, where)
        types = schema.get("type", list(TYPES))
        types = [types] if isinstance(types, str) else list(types)
        bad = [t for t in types if t not in TYPES]
        if bad:
            raise ValueError(f"{where}: unknown type(s) {bad}")
        if "integer" in types and "number" in types:
            types.remove("integer")
        return Alt(tuple(self._typed(t, schema, where) for t in types))

    def _typed(self, kind: str, schema, where: str):
        """IR for the values of JSON type `kind` under `schema`."""
        if kind == "string":
            return string_ir(schema, where, self.deadline)
        if kind == "integer":
            return integer_ir(schema, where)
        if kind == "number":
            return number_ir(schema, where)
        if kind == "array":
            return self._array(schema, where)
        if kind == "object":
            return self._object(schema, where)
        return literal("null") if kind == "null" else alt(literal("true"), literal("false"))

    def _ref(self, ref: str, where: str):
        if ref in self.schemas.stack:
            self._recursive.add(ref)
            return Ref(ref)
        if ref in self.defs:
            return Ref(ref)
        if ref in self._ref_ir:
            return self._ref_ir[ref]
        self.schemas.stack.append(ref)
        ir = self.convert(self.schemas.resolve(ref, where), ref)
        self.schemas.stack.pop()
        if ref in self._recursive:
            self.defs[ref] = ir
            return Ref(ref)
        self._ref_ir[ref] = ir
        return ir

    # ---- combinators ---------------------------------------------------------------------
    def _not(self, schema, where: str):
        """`not` of a type, const/enum of scalars, required names or a pattern."""
        neg = self.schemas.inline(schema["not"], f"{where}/not")
        pos = {k: v for k, v in schema.items() if k != "not"}
        if neg is True or neg == {}:
            return NEVER
        if neg is False:
            return self.convert(pos, where)
        keys = set(neg) & (HANDLED | UNSUPPORTED)
        types = pos.get("type", list(TYPES))
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
                    self.schemas.merge(pos, {"type": "object", "properties": {k: False}}, where),
                    where,
                )
                for k in dict.fromkeys(neg["required"])
            ]
            return Alt(tuple(options))
        if keys == {"pattern"} or keys == {"type", "pattern"} and neg["type"] == "string":
            if "string" not in types:
                return NEVER
            return string_ir(
                {**pos, "type": "string"}, where, self.deadline, exclude=neg["pattern"]
            )
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
                return string_ir(pos, where, self.deadline, exclude_words=words)
            try:
                spelled = Alt(tuple(spellings(v) for v in values))
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
        rest = {k: v for k, v in schema.items() if k != key and k in HANDLED}
        branches, schemas = [], []
        for i, sub in enumerate(schema[key]):
            merged = (
                self.schemas.merge(rest, self.schemas.inline(sub, f"{where}/{key}/{i}"), where)
                if rest
                else sub
            )
            schemas.append(merged)
            branches.append(self.convert(merged, f"{where}/{key}/{i}"))
        if key == "oneOf":
            self._check_exclusive(schemas, branches, where)
        return Alt(tuple(branches))

    def _check_exclusive(self, schemas: list, branches: list, where: str) -> None:
        """Raise unless every pair of `oneOf` branches is proven to share no value."""
        prover = DisjointProver(lambda s: self.schemas.inline(s, where), FORMATS, self.deadline)
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
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k in HANDLED}
        texts = list(dict.fromkeys(compact_json(v) for v in values))
        if rest:
            from .automaton import RegexAutomaton

            automaton = RegexAutomaton(self.convert(rest, where), self.deadline)
            texts = [t for t in texts if _matches(automaton, t.encode("utf-8"), self.deadline)]
        return Alt(tuple(literal(t) for t in texts))

    # ---- types ---------------------------------------------------------------------------
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
