"""JSON Schema -> regex IR (and rules for recursive `$ref`s): the converter and its dispatch.

The parts: `json_schema_resolve` (keyword vocabulary, `$ref` resolution, `allOf` merging),
`json_schema_strings` and `json_schema_numbers` (scalar translators), `json_schema_objects`
(objects and arrays), `json_schema_disjoint` (the `oneOf` proof), `json_schema_memo` (sub-schema
IR shared across compiles); here: dispatch, `$ref`s, combinators, enums and the free "any JSON
value".

Generated form (what a model is made to write):
- compact by default: no whitespace anywhere, e.g. `{"a":1,"b":[1,2]}`; with `whitespace_pattern`
  (a regex) that pattern is allowed after `{`, `[`, `,` and `:`, and before `}`, `]`, `,`, `:`;
- object properties in `properties` order, optional ones skippable; where an `anyOf`/`oneOf`
  branch is merged with its parent's own properties, the branch's own properties may
  interleave with the parent's, each side in its order (the rule: `json_schema_objects`);
  additional properties (allowed unless `additionalProperties` is false) come after the
  declared ones, with keys different from the declared ones; with `key_order` "any"
  (`GrammarLimits.json_key_order`) members come in any order, declared and additional ones
  alike, each declared one at most once (`json_schema_key_order`), except where a member's
  value holds a rule (a recursive `$ref`) or past `MAX_ANY_ORDER_PROPERTIES` properties;
- strings use the shortest JSON escapes (`\\"`, `\\\\`, `\\n`, `\\u001f`, ...) and never
  `\\uXXXX` for characters that need no escape inside constrained keys;
- integers without fraction or exponent; numbers with a fraction and exponent allowed, except
  that bounded numbers and `multipleOf` use no exponent (a bound at 0 alone keeps it); bounds
  and `multipleOf` are exact decimals, and ranges and multiples become regexes polynomial in
  their digits, within the limits `json_schema_numbers` names;
- values the schema leaves free (`{}`, `true`, extra properties, items without a schema) are any
  JSON value nested at most `free_depth` arrays/objects deep (`GrammarLimits.free_value_depth`,
  the `grammar_free_value_depth` knob), so the language stays regular: one definition per
  depth, each built from the one below and shared by every use (the IR is a DAG of size
  linear in the depth; the automaton is built as it is walked, so only the depths a
  value reaches cost states);
- `enum`/`const` values are written compactly;
- keywords beside a `$ref` apply from draft 2019-09 on and are ignored in drafts 3 to 7 (as
  those drafts say; `json_schema_resolve.ref_siblings_apply` tells the draft);
- `uniqueItems` on arrays whose elements have finitely many values (enum/const/boolean/null):
  the arrays of distinct values, built when the sets of values an array may hold number at
  most `json_schema_objects.MAX_UNIQUE_STATES`; with other items it raises unless
  `maxItems` <= 1;
- `patternProperties`: names not declared are written after the declared ones; a name's value
  follows every pattern it matches (or `additionalProperties` if none); `minProperties` and
  `maxProperties` count declared and extra pairs alike;
- `dependencies`/`dependentRequired`/`dependentSchemas` become one case per set of present
  trigger properties (at most 64 cases);
- `not` of a schema is the union of the `not`s of its keywords (`json_schema_negation`): a
  type, const/enum of scalars, a `pattern`, a bound (its complementary bound on the type it
  applies to), `required` and `properties` (a name absent, a declared value failing its
  schema), `anyOf` of required names, a `not` (its operand); other keywords under `not`
  raise;
- `if`/`then`/`else` is (`if` and `then`) or (`not if` and `else`), so a condition is
  supported wherever its `not` is;
- `pattern` and `patternProperties` are read as `re.search` reads them, except that `\\d` and
  `\\w` are ECMA-262's ASCII classes (JSON Schema's patterns are ECMA-262 regexes); `^` and `$`
  may stand anywhere (`^$|^[a-z]+$`, `(a|$)*`), except inside a bounded repeat of more than 4
  copies;
- `pattern`/`format` with `minLength`/`maxLength` intersect exactly (`regex_algebra`); the
  formats in `json_schema_formats.FORMATS` are enforced (each a regular subset of what
  `jsonschema`'s format checker accepts), other formats are annotations (as JSON Schema
  2019-09 on makes every format) and allow any string;
- `additionalItems` has no effect unless `items` is an array (as the specification says).
The language is regular unless `$ref`s recurse; then each schema met again inside its own
conversion (through `$ref`s, `allOf` merges of recursive targets included) becomes a grammar
rule. `oneOf` is the union of its branches where each pair of branches is proven to share no
value (`json_schema_disjoint`: JSON types, const/enum values, a required property with
disjoint schemas or forbidden by the other branch; else `disjoint`'s first-byte type check).
Otherwise: strings that exactly one branch accepts (one product automaton); each branch with
the `not` of every other branch it may share values with (A and not B, B and not A; by cases
where there are two or more); each branch only where the names other branches require beyond
its own are absent (sound, not complete); else it is rejected rather than treated as `anyOf`, which could accept a value
matching two branches.

Supported keywords: see `json_schema_resolve.HANDLED`; annotations (title, description,
examples, default, $schema, $id, $comment, $defs, ...) change nothing. Standard keywords that
are not implemented (`UNSUPPORTED`) raise `ValueError` naming them and where they are; keywords
outside the JSON Schema vocabularies (e.g. `x-order`, `example`) are annotations by the
specification and are ignored.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable

from .budget import GrammarLimits
from .disjoint import check_disjoint
from .json_schema_disjoint import DisjointProver, json_common, json_type, listed_values
from .json_schema_formats import FORMATS
from .json_schema_memo import MAX_MEMO_DEPS, MAX_MEMO_READS, SubschemaMemo
from .json_schema_negation import (
    absent_name_sets,
    bound_failures,
    negation_clauses,
    object_failures,
    types_failing,
)
from .json_schema_numbers import NUMBER, check_numbers, integer_ir, number_ir
from .json_schema_objects import (
    DEPENDENCY_KEYS,
    PROPERTY_CHAINS,
    ContainerConverter,
    interleaved,
)
from .json_schema_resolve import (
    CONDITIONAL,
    HANDLED,
    MAX_MERGED_BRANCHES,
    TYPES,
    UNSUPPORTED,
    SchemaResolver,
    conditional_cases,
    ref_siblings_apply,
)
from .json_schema_strings import (
    JSON_CHAR,
    compact_json,
    exclusive_strings,
    spellings,
    string_ir,
)
from .nfa import CompileTimeout, Deadline, EmptyLanguage, untrack_ir
from .regex_algebra import combine, search
from .regex_ir import EMPTY, Alt, Ref, alt, literal, opt, seq, star
from .regex_parse import parse_regex
from .regex_terms import NEVER
from .states import untracked

_NONE: frozenset[str] = frozenset()  # no rules


class Unproven(ValueError):
    """`oneOf` branches not proven to share no value (the fallbacks may still separate them)."""


def _product_factors(items: list) -> tuple[list, list] | None:
    """The two lists whose pairs `items` are, as merged `allOf` parts make them
    (`SchemaResolver.merge`: `{"allOf": [x, y]}` for x in the first, y in the second), or
    None."""
    if not all(isinstance(i, dict) and set(i) == {"allOf"} and len(i["allOf"]) == 2 for i in items):
        return None
    firsts: list = []
    seconds: list = []
    for item in items:
        x, y = item["allOf"]
        if x not in firsts:
            firsts.append(x)
        if y not in seconds:
            seconds.append(y)
    pairs = [{"allOf": [x, y]} for x in firsts for y in seconds]
    if len(firsts) < 2 or len(seconds) < 2 or pairs != items:
        return None
    return firsts, seconds


def _meets_no_value_of(case: dict, pos: dict) -> bool:
    """Whether no value of `pos` meets `case` (an object failing a `not`'s clause): it has a
    name absent that `pos` requires, or present with a value failing the very schema that
    `pos` gives that name."""
    required, declared = pos.get("required", ()), pos.get("properties", {})
    for name, sub in case["properties"].items():
        if sub is False and name in required:
            return True
        own = declared.get(name) if isinstance(sub, dict) else None
        if own is not None and sub.get("not") == own and name in case.get("required", ()):
            return True
    return False


class SchemaConverter(ContainerConverter):
    """Walks one schema; `convert` returns IR, recursive `$ref`s land in `defs`."""

    def __init__(
        self,
        root,
        whitespace_pattern: str | None,
        deadline: Deadline,
        free_depth: int,
        memo: SubschemaMemo | None = None,
        key_order: str = GrammarLimits.json_key_order,
    ):
        self.deadline = deadline
        self.memo = memo  # sub-schema IR shared with other compiles
        self.key_order = key_order
        # what the memo keys on beside the schema (the draft: whether `$ref` siblings apply)
        self._options = (whitespace_pattern, free_depth, key_order, ref_siblings_apply(root))
        self.schemas = SchemaResolver(root, deadline, None if memo is None else memo.number)
        self.ws = EMPTY if whitespace_pattern is None else parse_regex(whitespace_pattern)
        self.defs: dict[str, object] = {}
        self._converted: dict[int, object] = {}  # IR by `SchemaResolver.key` of the schema
        # What each conversion read of the document (see `convert`): ($ref, target number)s
        # by key, or the key in `_unshared`; `_unshared_uses` counts uses of the latter.
        self._deps: dict[int, tuple[tuple[str, int], ...]] = {}
        self._unshared: set[int] = set()
        self._unshared_uses = 0
        # Schemas (by key) under conversion -> their rule's name, and the names used inside.
        self._pending: dict[int, str] = {}
        self._recursive: set[str] = set()
        # Conversions under way, outermost first: (number in the order they started, name);
        # their names also as a set.
        # Logs that a conversion's own part (from where the log stood when it started) tells
        # it by: names of conversions whose reads its IR relies on (it is "open" on those still
        # under way: it recurses into their rules, say), and rules its IR uses. Per conversion
        # made: the rules its IR uses; per one that ended open, its number.
        self._chain: list[tuple[int, str]] = []
        self._under_way: set[str] = set()
        self._open_log: list[str] = []
        self._uses_log: list[str] = []
        self._started = 0
        self._rules_of: dict[int, frozenset[str]] = {}
        self._open_of: dict[int, int] = {}
        self._any = free_values(whitespace_pattern, free_depth)
        self._toks: dict[str, object] = {}  # punctuation with its whitespace, by text

    # ---- helpers -------------------------------------------------------------------------
    def _tok(self, text: str):
        got = self._toks.get(text)
        if got is None:
            got = self._toks[text] = seq(self.ws, literal(text), self.ws)
        return got

    def any_value(self):
        return self._any

    # ---- main dispatch -------------------------------------------------------------------
    def convert(self, schema, where: str = "#"):
        self.deadline.check()
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            return NEVER
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: a schema must be an object or a boolean, got {schema!r}")
        # Each distinct sub-schema is translated once; its IR is shared by every use. A schema
        # met again inside its own conversion (through `$ref`s, merged `allOf` parts included)
        # becomes a grammar rule. What a conversion read of the document around it is the
        # `$ref`s it resolved and their targets (`deps`, those of conversions it reused
        # included): with the same ones, the same schema has the same IR in any document, so
        # the memo keeps it for later compiles, with the rules its IR uses, unless it is open
        # on a conversion still under way (it uses an ancestor's rule, or reuses an open
        # conversion made inside that ancestor's) or reads more than MAX_MEMO_DEPS references
        # (MAX_MEMO_READS with repeats). A rule's name holds its schema's key, and a rule kept
        # means the language of its schema in any document where its reads point at the same
        # targets: rules from several compiles mix.
        key = self.schemas.key(schema)
        got = self._converted.get(key)
        if got is not None:
            self._reuse(key)
            return got
        got = self._from_memo(key)
        if got is not None:
            return got
        name = self._pending.get(key)
        if name is not None:
            self._recursive.add(name)
            self._open_log.append(name)
            self._uses_log.append(name)
            return Ref(name)
        name = self._pending[key] = f"{where}@{key}"
        start, unshared = len(self.schemas.resolved), self._unshared_uses
        open_from, uses_from = len(self._open_log), len(self._uses_log)
        started = self._started = self._started + 1
        self._chain.append((started, name))
        self._under_way.add(name)
        self.schemas.enter(where)
        try:
            got = self._convert_object(schema, where)
        except BaseException:  # what it logged goes: a caller that goes on never uses its IR
            del self._open_log[open_from:], self._uses_log[uses_from:]
            raise
        finally:
            self.schemas.leave()
            del self._pending[key]
            self._chain.pop()
            self._under_way.discard(name)
        opened = _NONE
        if len(self._open_log) > open_from:  # kept: those still under way (ancestors)
            opened = frozenset(self._under_way.intersection(self._open_log[open_from:]))
            self._open_log[open_from:] = opened
        if name in self._recursive:
            self.defs[name] = got
            got = Ref(name)
            self._uses_log.append(name)
        self._converted[key] = got
        reads = len(self.schemas.resolved) - start  # repeats included
        # a tuple of (str, int) tuples: the collector stops tracking it, a frozenset it never
        # would (the memo keeps thousands)
        deps = (
            tuple(dict.fromkeys(self.schemas.resolved[start:])) if reads <= MAX_MEMO_READS else None
        )
        uses = _NONE
        if len(self._uses_log) > uses_from:  # written once each for the conversions around
            uses = frozenset(self._uses_log[uses_from:])
            self._uses_log[uses_from:] = uses
        if opened:
            self._unshared.add(key)
            self._open_of[key] = started
            self._rules_of[key] = uses
        elif self._unshared_uses != unshared or deps is None or len(deps) > MAX_MEMO_DEPS:
            self._unshared.add(key)
            self._unshared_uses += 1
        else:
            self._deps[key] = deps
            self._rules_of[key] = uses
            if self.memo is not None:
                rules = tuple((rule, self.defs[rule]) for rule in uses)
                # Kept across compiles, out of the collector's sight (as a grammar's IR is):
                # IR this compile's grammar does not read (a part that `seq` or `alt` merged
                # into a new node) would otherwise be walked by every full collection.
                untrack_ir(got, *(body for _rule, body in rules))
                self.memo.put(untracked((*self._options, key)), untracked((got, deps, rules)))
        return got

    def _reuse(self, key: int) -> None:
        """Account for reusing this compile's conversion of `key` (see `convert`)."""
        started = self._open_of.get(key)
        # the innermost conversion under way that was when it started
        at = -1 if started is None else bisect.bisect_left(self._chain, (started,)) - 1
        if at >= 0:
            outer = self._chain[at][1]
            # What an open conversion relies on was made inside the conversions under way when
            # it ran (those it was open on included), whose reads count it: the user is open
            # on the innermost of them that is still under way.
            self._open_log.append(outer)
            self._uses_log.extend(self._rules_of[key])
        elif key in self._unshared:
            self._unshared_uses += 1
        else:
            self.schemas.resolved.extend(self._deps[key])
            self._uses_log.extend(self._rules_of[key])

    def _from_memo(self, key: int):
        """IR an earlier compile made of `key` reading the same `$ref` targets, or None."""
        got = None if self.memo is None else self.memo.get((*self._options, key))
        if got is None:
            return None
        ir, deps, rules = got
        if not all(self.schemas.points_to(ref, number) for ref, number in deps):
            return None
        for rule, body in rules:
            self.defs.setdefault(rule, body)
        self._converted[key] = ir
        self._deps[key] = deps
        self._rules_of[key] = frozenset(rule for rule, _body in rules) if rules else _NONE
        self._uses_log.extend(self._rules_of[key])
        self.schemas.resolved.extend(deps)
        return ir

    def _convert_object(self, schema: dict, where: str):
        if "$ref" in schema and self.schemas.bare_ref(schema):
            return self._ref(schema["$ref"], where)
        if not CONDITIONAL.isdisjoint(schema):
            return self.convert(conditional_cases(schema), where)
        if not UNSUPPORTED.isdisjoint(schema):
            unknown = sorted(set(schema) & UNSUPPORTED)
            raise ValueError(f"{where}: unsupported JSON Schema keyword(s): {', '.join(unknown)}")
        check_numbers(schema, where)
        if "format" in schema and schema["format"] not in FORMATS:
            # An unknown format is an annotation (JSON Schema 2019-09 on): any string.
            return self.convert({k: v for k, v in schema.items() if k != "format"}, where)
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.convert({"allOf": [{"$ref": schema["$ref"]}, rest]}, where)
        if "allOf" in schema:
            return self.convert(self.schemas.flatten(schema, where), where)
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
        """A `$ref` target's IR (converted once, see `convert`)."""
        ref, target = self.schemas.follow(ref, where)
        return self.convert(target, ref)

    # ---- combinators ---------------------------------------------------------------------
    def _not(self, schema, where: str):
        """`not` of a schema: the union of the `not`s of its keywords (`json_schema_negation`),
        each a type, const/enum of scalars, a pattern, a bound, object constraints (required
        names, declared names' values; anyOf of required names), or a `not` (its operand)."""
        neg = self.schemas.flatten(schema["not"], f"{where}/not")
        pos = {k: v for k, v in schema.items() if k != "not"}
        if neg is False:
            return self.convert(pos, where)
        clauses = negation_clauses(neg) if isinstance(neg, dict) else []
        if not clauses:  # `not` of a schema every value meets
            return NEVER
        if len(clauses) > 1:
            return Alt(
                tuple(
                    self.convert(self.schemas.merge(pos, {"not": clause}, where), where)
                    for clause in clauses
                )
            )
        neg = clauses[0]
        keys = set(neg)
        if keys == {"not"}:  # not (not X) is X
            return self.convert(self.schemas.merge(pos, neg["not"], where), where)
        types = pos.get("type", list(TYPES))
        types = [types] if isinstance(types, str) else list(types)
        if keys == {"type"}:
            kept = types_failing(neg["type"], types)
            if kept is None:
                raise ValueError(f"{where}: 'not' integer among numbers is not supported")
            return self.convert({**pos, "type": kept}, where) if kept else NEVER
        cases = self._clause_failures(neg, pos, where)
        if cases is not None:
            return Alt(tuple(self.convert(self.schemas.merge(pos, c, where), where) for c in cases))
        if "anyOf" in pos or "oneOf" in pos:
            # The forms below write strings from `pos` itself (`string_ir`), which reads no
            # branches: the `not` goes into each branch instead.
            return self._alternatives({**pos, "not": neg}, where)
        if keys == {"pattern"}:
            if "string" not in types:
                return NEVER
            if "enum" in pos or "const" in pos:  # the values that fail the pattern
                kept = [
                    v
                    for v in listed_values(pos) or []
                    if isinstance(v, str) and not search(neg["pattern"], v, self.deadline)
                ]
                rest = {k: v for k, v in pos.items() if k not in ("enum", "const")}
                return self.convert({**rest, "enum": kept}, where)
            return string_ir(
                {**pos, "type": "string"}, where, self.deadline, exclude=neg["pattern"]
            )
        if keys and keys <= {"enum", "const"}:
            values = listed_values(neg) or []
            if "enum" in pos or "const" in pos:
                kept = json_common(listed_values(pos) or [], values, inside=False)
                rest = {k: v for k, v in pos.items() if k not in ("enum", "const")}
                return self.convert({**rest, "enum": kept}, where)
            if types == ["string"]:
                words = [v for v in values if isinstance(v, str)]
                return string_ir(pos, where, self.deadline, exclude_words=words)
            # The excluded values are scalars: arrays and objects are kept whole, uncombined.
            nested = [t for t in types if t in ("array", "object")]
            flat = [t for t in types if t not in nested]
            parts = [self.convert({**pos, "type": nested}, where)] if nested else []
            scalars = self.convert({**pos, "type": flat}, where) if flat else None
            try:
                spelled = Alt(tuple(spellings(v) for v in values))
                if scalars is not None:
                    parts.append(
                        combine(
                            [scalars, spelled], lambda got: got[0] and not got[1], self.deadline
                        )
                    )
                return Alt(tuple(parts))
            except CompileTimeout:
                raise
            except ValueError as exc:
                raise ValueError(f"{where}: unsupported 'not' of const/enum: {exc}") from None
        raise ValueError(
            f"{where}: unsupported form of 'not' of {', '.join(sorted(keys))} (supported: "
            "type, const/enum of scalars, pattern, bounds, required, properties, anyOf of "
            "required, and allOf of them)"
        )

    def _clause_failures(self, neg: dict, pos: dict, where: str) -> list | None:
        """The schemas of the values of `pos` failing `neg`, one clause of a `not`
        (`negation_clauses`) of required names, object constraints or a bound, each to be
        merged with `pos`; None for other clauses."""
        absent = absent_name_sets(neg, set(neg), self.schemas.inline, where)
        if absent is not None:
            cases = [{"type": "object", "properties": dict.fromkeys(n, False)} for n in absent]
        else:
            closed = pos.get("additionalProperties") is False and not pos.get("patternProperties")
            cases = object_failures(neg, list(pos.get("properties", {})) if closed else None)
            if cases is None:
                return bound_failures(neg)
        # Left out unconverted: cases no value of `pos` meets (`oneOf` branches that share the
        # object's `properties` and `required` names fail each other only by the names only
        # they require), each a product's factor in `_excluding_others`.
        return [c for c in cases if not _meets_no_value_of(c, pos)]

    def _failures(self, neg, pos: dict, where: str) -> list | None:
        """The schemas of the values of `pos` failing `neg` (their union is `not neg`), each
        to be merged with `pos`, where every clause of `neg` is a type, a `not`, or one
        `_clause_failures` writes; None otherwise."""
        neg = self.schemas.flatten(neg, f"{where}/not")
        if isinstance(neg, bool):
            return [] if neg else [{}]  # every value meets true, and fails false
        types = pos.get("type", TYPES)
        out: list = []
        for clause in negation_clauses(neg):
            keys = set(clause)
            if keys == {"type"}:
                kept = types_failing(clause["type"], [types] if isinstance(types, str) else types)
                if kept is None:
                    return None
                out += [{"type": kept}] if kept else []
            elif keys == {"not"}:
                out.append(clause["not"])
            else:
                cases = self._clause_failures(clause, pos, where)
                if cases is None:
                    return None
                out += cases
        return out

    def _alternatives(self, schema, where: str):
        if "anyOf" in schema and "oneOf" in schema:
            # (any of A) and (exactly one of O): any of (a and exactly one of O), a in A
            both = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
            each = [{"allOf": [a, {"oneOf": schema["oneOf"]}]} for a in schema["anyOf"]]
            return self.convert({**both, "anyOf": each}, where)
        key = "anyOf" if "anyOf" in schema else "oneOf"
        rest = {
            k: v for k, v in schema.items() if k != key and (k in HANDLED or k == PROPERTY_CHAINS)
        }
        schemas = []
        for i, sub in enumerate(schema[key]):
            merged = (
                interleaved(
                    rest,
                    self.schemas.merge(rest, self.schemas.inline(sub, f"{where}/{key}/{i}"), where),
                )
                if rest
                else sub
            )
            schemas.append(merged)
        if key == "oneOf":
            schemas = self._drop_shared_types(schemas, where)
        converted: dict[int, object] = {}

        def branch(i: int):
            """Branch i's IR, converted when first asked for: a `oneOf` whose check fails
            converts only the branches the check read (a refusal in a fraction of the time)."""
            if i not in converted:
                converted[i] = self.convert(schemas[i], f"{where}/{key}/{i}")
            return converted[i]

        factors = _product_factors(schema[key]) if key == "oneOf" else None
        if factors is not None:  # exact by its two lists where each has an exclusive form
            try:
                return self._by_factors(factors, rest, where)
            except CompileTimeout:
                raise
            except ValueError:
                pass  # taken as any other oneOf
        if key == "oneOf":
            try:
                self._check_exclusive(schemas, branch, where)
            except Unproven as unproven:
                # Its message, not the exception: raising a held exception again from a frame
                # that names it makes a cycle (traceback, frame) that only the collector frees.
                reason = str(unproven)
                strings = self._exclusive_strings(schemas, where)
                if strings is not None:
                    return strings
                try:
                    return Alt(tuple(self._excluding_others(schemas, where, reason)))
                except CompileTimeout:
                    raise
                except ValueError:
                    return Alt(tuple(self._separated_by_required(schemas, where, reason)))
        return Alt(tuple(branch(i) for i in range(len(schemas))))

    def _by_factors(self, factors: tuple[list, list], rest: dict, where: str):
        """IR of a `oneOf` that is the pairs of two lists (`allOf` parts each with a `oneOf`,
        merged: `_product_factors`): exactly one pair holds where exactly one of each list
        does (the pairs that hold are the product of the two counts), so it is the union over
        pairs of each list's exclusive form, which `_exclusive_forms` writes for each list
        alone. Raises ValueError where a list has no exclusive form, both lists need a `not`,
        or a pair does not convert."""
        reason = f"{where}: the oneOf's two lists have no exclusive forms"
        forms = [self._exclusive_forms(rest, factor, where, reason) for factor in factors]
        out = []
        for first in forms[0]:
            for second in forms[1]:
                if first is None or second is None:
                    continue  # a branch that never holds alone
                if "not" in first and "not" in second:
                    raise Unproven(reason)
                merged = interleaved(rest, self.schemas.merge(first, second, where))
                out.append(self.convert(merged, f"{where}/oneOf"))
        return Alt(tuple(out)) if out else NEVER

    def _exclusive_forms(self, rest: dict, branches: list, where: str, reason: str) -> list:
        """Schemas each of which holds where `rest` and exactly that one of `branches` hold
        (None: never alone): the branches themselves where the prover keeps every pair apart,
        else those of `_separated_forms`."""
        flat = [
            self.schemas.flatten(
                self.schemas.merge(rest, self.schemas.inline(b, where), where), where
            )
            for b in branches
        ]
        prover = self._prover(where)
        if all(
            prover.disjoint(flat[i], flat[j])
            for i in range(len(flat))
            for j in range(i + 1, len(flat))
        ):
            return flat
        return self._separated_forms(flat, reason)

    def _excluding_others(self, schemas: list, where: str, reason: str) -> list:
        """IR of `oneOf` branches the prover cannot keep apart, each with the `not` of every
        other branch it may share values with (A and not B, B and not A: exactly one); with
        two or more of those, the `not`s are written by cases (types, required names, object
        constraints, bounds: `_failures`). Raises `Unproven(reason)` where a branch holds a `not`
        already, a `not` is one the converter cannot write, or the cases pass
        `MAX_MERGED_BRANCHES`."""
        flat = [self.schemas.flatten(s, f"{where}/oneOf/{i}") for i, s in enumerate(schemas)]
        if not all(isinstance(s, dict) and "not" not in s for s in flat):
            raise Unproven(reason)
        prover = self._prover(where)
        out = []
        for i, s in enumerate(flat):
            others = [t for j, t in enumerate(flat) if j != i and not prover.disjoint(s, t)]
            here = f"{where}/oneOf/{i}"
            try:
                if len(others) <= 1:
                    out.append(self.convert({**s, "not": others[0]} if others else s, here))
                    continue
                # Two or more: the union, over one way to fail each, of the branch and those.
                failures = [self._failures(t, s, here) for t in others]
                if (
                    any(f is None for f in failures)
                    or math.prod(map(len, failures)) > MAX_MERGED_BRANCHES
                ):
                    raise Unproven(reason)
                cases = []
                for picks in itertools.product(*failures):
                    merged = s
                    for case in picks:
                        merged = self.schemas.merge(merged, case, here)
                    cases.append(self.convert(merged, here))
                out.append(Alt(tuple(cases)))
            except CompileTimeout:
                raise
            except ValueError:
                raise Unproven(reason) from None
        return out

    def _exclusive_strings(self, schemas: list, where: str):
        """IR of `oneOf` branches that are all strings (`json_schema_strings`), the strings
        exactly one matches; None when a branch is not, or the product is past its limits."""
        flat = [self.schemas.flatten(s, f"{where}/oneOf/{i}") for i, s in enumerate(schemas)]
        try:
            return exclusive_strings(flat, HANDLED | UNSUPPORTED, self.deadline)
        except CompileTimeout:
            raise
        except ValueError:
            return None

    def _separated_by_required(self, schemas: list, where: str, reason: str) -> list:
        """IR of `oneOf` branches the prover cannot keep apart, each taken only where, for every
        other branch, a name that branch requires beyond this one's is absent; a branch whose
        other keywords equal another's and which requires all of that one's names is never the
        only match. Exact where the branches differ only in `required` ("exactly one of these
        fields"); otherwise sound (what a branch allows matches it and no other), though an
        object that fails another branch only by a value, with all its names present, is left
        out. Raises `Unproven(reason)` where that does not hold, a branch already holds a `not`, or
        the cases pass `MAX_MERGED_BRANCHES`."""
        flat = [self.schemas.flatten(s, f"{where}/oneOf/{i}") for i, s in enumerate(schemas)]
        out = []
        for i, form in enumerate(self._separated_forms(flat, reason)):
            if form is None:
                out.append(NEVER)
                continue
            try:
                out.append(self.convert(form, f"{where}/oneOf/{i}"))
            except CompileTimeout:
                raise
            except ValueError:
                raise Unproven(reason) from None
        return out

    def _separated_forms(self, flat: list, reason: str) -> list:
        """Per branch of `flat` (flattened `oneOf` branches), the branch with the `not` of
        the names the other branches require beyond its own, or None where it never holds
        alone (see `_separated_by_required`)."""
        if not all(isinstance(s, dict) and "not" not in s for s in flat):
            raise Unproven(reason)
        required = [set(s.get("required", [])) for s in flat]
        others = [{k: v for k, v in s.items() if k != "required"} for s in flat]
        out: list[dict | None] = []
        for i, s in enumerate(flat):
            beyond, never = [], False
            for j in range(len(flat)):
                if j == i:
                    continue
                names = sorted(required[j] - required[i])
                if names:
                    beyond.append(names)
                elif others[j] == others[i]:
                    never = True  # every value of this branch matches branch j too
                else:
                    raise Unproven(reason)
            out.append(
                None if never else {**s, "not": {"anyOf": [{"required": n} for n in beyond]}}
            )
        return out

    def _prover(self, where: str) -> DisjointProver:
        inline = lambda s: self.schemas.flatten(s, where)  # noqa: E731
        return DisjointProver(inline, FORMATS, HANDLED | UNSUPPORTED, self.deadline)

    def _drop_shared_types(self, schemas: list, where: str) -> list:
        """`oneOf` branches without the JSON types that two of them accept whole (no value of
        such a type matches exactly one branch)."""
        whole = [self._prover(where).whole_types(s) for s in schemas]
        drop = {t for t in TYPES if sum(t in w for w in whole) >= 2}
        if "number" not in drop:
            drop.discard("integer")  # "number but not integer" is no `type`
        if not drop:
            return schemas
        kept = {"type": [t for t in TYPES if t not in drop]}
        return [
            self.schemas.merge(self.schemas.flatten(s, f"{where}/oneOf/{i}"), kept, where)
            for i, s in enumerate(schemas)
        ]

    def _check_exclusive(self, schemas: list, branch: Callable[[int], object], where: str) -> None:
        """Raise `Unproven` unless every pair of `oneOf` branches is proven to share no value
        (`branch(i)`: branch i's IR, read only for the pairs the schemas alone do not keep
        apart; its conversion's own errors pass through)."""
        prover = self._prover(where)
        for i in range(len(schemas)):
            for j in range(i + 1, len(schemas)):
                self.deadline.check()
                if prover.disjoint(schemas[i], schemas[j]):
                    continue
                pair = [branch(i), branch(j)]  # a branch that does not convert fails the oneOf
                try:
                    check_disjoint(pair, where, self.deadline)
                except CompileTimeout:
                    raise
                except ValueError as exc:
                    if "overlap" not in str(exc):
                        raise Unproven(str(exc)) from exc
                    raise Unproven(
                        f"{where}: oneOf branches {i} and {j} may overlap (proven exclusive only "
                        "by JSON type, const/enum values or a required property); use anyOf if "
                        "either may match"
                    ) from None

    def _enum(self, schema, where: str):
        return Alt(tuple(literal(compact_json(v)) for v in self._enum_values(schema, where)))

    def _enum_values(self, schema, where: str) -> list:
        """The `enum`/`const` values that the schema's other keywords allow, one per text."""
        values = listed_values(schema) or []
        by_text: dict[str, object] = {}
        for value in values:
            by_text.setdefault(compact_json(value), value)
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k in HANDLED}
        types = _plain_types(rest)
        if types is not None:
            return [v for v in by_text.values() if json_type(v) in types]
        if rest:
            from .automaton import RegexAutomaton

            try:
                automaton = RegexAutomaton(self.convert(rest, where), self.deadline)
            except EmptyLanguage:
                return []  # the other keywords allow no value
            by_text = {
                t: v
                for t, v in by_text.items()
                if _matches(automaton, t.encode("utf-8"), self.deadline)
            }
        return list(by_text.values())


@functools.lru_cache(maxsize=8)
def free_values(whitespace_pattern: str | None, depth: int):
    """IR of any JSON value nesting at most `depth` arrays/objects.

    Each level is built from the one below and shares every other node with it, so the IR
    stays small and linear in the depth. Built once per process for each (whitespace, depth):
    most schemas hold it somewhere, and it is then not built again per compile."""
    ws = EMPTY if whitespace_pattern is None else parse_regex(whitespace_pattern)
    string = seq(literal('"'), star(JSON_CHAR), literal('"'))
    comma, colon = (seq(ws, literal(t), ws) for t in ",:")
    open_array, open_object = seq(literal("["), ws), seq(literal("{"), ws)
    close_array, close_object = literal("]"), literal("}")
    scalar = alt(string, NUMBER, literal("true"), literal("false"), literal("null"))
    level = scalar
    for _ in range(depth):
        items = seq(level, star(seq(comma, level)))
        pair = seq(string, colon, level)
        pairs = seq(pair, star(seq(comma, pair)))
        array = seq(open_array, opt(seq(items, ws)), close_array)
        obj = seq(open_object, opt(seq(pairs, ws)), close_object)
        level = alt(scalar, array, obj)
    return level


# JSON types whose values' text matches the type's IR exactly when the value has the type.
_PLAIN_TYPES = frozenset({"string", "boolean", "null"})


def _plain_types(rest: dict) -> frozenset[str] | None:
    """The JSON types `rest` allows when it holds nothing but a `type` of string, boolean and
    null (most enums: no automaton is needed to filter their values), else None."""
    if set(rest) != {"type"}:
        return None
    names = rest["type"] if isinstance(rest["type"], list) else [rest["type"]]
    if not names or not all(isinstance(n, str) and n in _PLAIN_TYPES for n in names):
        return None
    return frozenset(names)


def _matches(automaton, data: bytes, deadline: Deadline) -> bool:
    deadline.check()
    state = automaton.initial
    for b in data:
        state = int(automaton.row(state)[b])
        if state < 0:
            return False
    return automaton.is_accepting(state)


def schema_to_ir(
    schema,
    whitespace_pattern: str | None,
    deadline: Deadline,
    free_depth: int = GrammarLimits.free_value_depth,
    memo: SubschemaMemo | None = None,
    key_order: str = GrammarLimits.json_key_order,
):
    """(IR of the top-level value, {ref: IR} of recursive definitions; empty when regular).

    Values the schema leaves free nest at most `free_depth` arrays/objects deep; an object's
    members come in declared order, or in any order with `key_order` "any". With `memo`
    (`json_schema_memo.shared_memo()`), sub-schemas that earlier compiles converted reading the
    same `$ref` targets are taken from it, and this compile's are added."""
    if not isinstance(schema, (dict, bool)):
        raise ValueError(
            f"a JSON schema must be an object or a boolean, got {type(schema).__name__}"
        )
    conv = SchemaConverter(schema, whitespace_pattern, deadline, free_depth, memo, key_order)
    ir = conv.convert(schema)
    return ir, conv.defs
