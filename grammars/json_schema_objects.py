"""JSON Schema objects -> regex IR: properties in order, counts, pattern properties, dependencies.

Mixed into `SchemaConverter` (see `json_schema` for the generated form). Property names are
built at the code point level and mapped to JSON string characters afterwards, so names that
match a `patternProperties` pattern, match none, or are not declared are exact regular sets
(`regex_algebra.combine`).
"""

from __future__ import annotations

import itertools

from .json_schema_strings import json_chars, json_string_literal
from .regex_algebra import ANY_CHAR, combine, exclude_words, search
from .regex_ir import EMPTY, Alt, Chars, Repeat, literal, map_chars, parse_search_regex, seq, star
from .regex_terms import NEVER

MAX_DEPENDENCY_CASES = 64
ANY_NAME = star(Chars(ANY_CHAR))
DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")


def _dependency_parts(schema, where: str) -> dict[str, tuple[list, list]]:
    """{trigger property: (required names, schemas)} from the dependency keywords."""
    out: dict[str, tuple[list, list]] = {}
    for key in DEPENDENCY_KEYS:
        for name, dep in schema.get(key, {}).items():
            names, subs = out.setdefault(name, ([], []))
            if isinstance(dep, list) and key != "dependentSchemas":
                names.extend(dep)
            elif isinstance(dep, (dict, bool)) and key != "dependentRequired":
                subs.append(dep)
            else:
                raise ValueError(f"{where}/{key}/{name}: invalid dependency {dep!r}")
    return out


class ObjectConverter:
    """The object part of `SchemaConverter`."""

    def _dependency_cases(self, schema, where: str):
        """`schema` with dependencies split into cases by which trigger properties are present."""
        parts = _dependency_parts(schema, where)
        base = {k: v for k, v in schema.items() if k not in DEPENDENCY_KEYS}
        if 2 ** len(parts) > MAX_DEPENDENCY_CASES:
            raise ValueError(f"{where}: more than {MAX_DEPENDENCY_CASES} dependency cases")
        options = []
        for present in itertools.product((False, True), repeat=len(parts)):
            case: dict = {"properties": {}, "required": []}
            subs = []
            for (name, (names, schemas)), here in zip(parts.items(), present, strict=True):
                if here:
                    case["required"] += [name, *names]
                    subs += schemas
                else:
                    case["properties"][name] = False
            merged = self.schemas.merge(base, case, where)
            for sub in subs:
                merged = self.schemas.merge(merged, self.schemas.inline(sub, where), where)
            options.append(self.convert(merged, where))
        return Alt(tuple(options))

    def _name_ir(self, node):
        """A JSON string (with quotes) whose content, as code points, is in `node`."""
        return seq(literal('"'), map_chars(node, json_chars), literal('"'))

    def _object(self, schema, where):
        props = schema.get("properties", {})
        required = list(schema.get("required", []))
        extra_schema = schema.get("additionalProperties", True)
        patterns = [
            (parse_search_regex(p), p, s) for p, s in schema.get("patternProperties", {}).items()
        ]

        def schema_of(key: str, declared):
            hits = [s for _ir, p, s in patterns if search(p, key, self.deadline)]
            if declared is None:
                return {"allOf": hits} if hits else extra_schema
            return {"allOf": [declared, *hits]} if hits else declared

        declared = [(k, schema_of(k, props[k])) for k in props]
        declared += [(k, schema_of(k, None)) for k in dict.fromkeys(required) if k not in props]
        entries = []
        for key, sub in declared:
            value = self.convert(sub, f"{where}/properties/{key}")
            if value is NEVER or sub is False:
                if key in required:
                    return NEVER
                continue
            pair = seq(json_string_literal(key), self._tok(":"), value)
            entries.append((pair, key in required))
        extra = self._extra_pair([k for k, _ in declared], patterns, extra_schema, where)
        lo, hi = int(schema.get("minProperties", 0)), schema.get("maxProperties")
        hi = None if hi is None else int(hi)
        cap = lo if hi is None else hi + 1
        sep = self._tok(",")
        memo: dict = {}

        def extras(first: bool, count: int):
            """Extra pairs after `count` pairs (no separator before the first if `first`)."""
            key = ("extras", first, count)
            if key in memo:
                return memo[key]
            low, high = max(lo - count, 0), None if hi is None else hi - count
            if extra is None or high == 0:
                out = EMPTY if low == 0 else NEVER
            elif not first:
                out = Repeat(seq(sep, extra), low, high)
            else:
                body = seq(extra, extras(False, min(count + 1, cap)))
                out = Alt((EMPTY, body)) if low == 0 else body
            memo[key] = out
            return out

        def rest(i: int, count: int, first: bool):
            """Pairs from entry i on, `count` pairs written so far (no separator if `first`)."""
            key = (i, count, first)
            if key in memo:
                return memo[key]
            if i == len(entries):
                out = extras(first, count)
            else:
                pair, req = entries[i]
                head = pair if first else seq(sep, pair)
                take = (
                    NEVER
                    if hi is not None and count >= hi
                    else seq(head, rest(i + 1, min(count + 1, cap), False))
                )
                out = take if req else Alt((take, rest(i + 1, count, first)))
            memo[key] = out
            return out

        return seq(literal("{"), self.ws, rest(0, 0, True), self.ws, literal("}"))

    def _extra_pair(self, declared: list[str], patterns: list, extra_schema, where: str):
        """IR of one `"name":value` pair for a property not declared, or None if none may be."""
        options = []
        for chosen in itertools.product((False, True), repeat=len(patterns)):
            self.deadline.check()
            subs = [s for (_ir, _p, s), on in zip(patterns, chosen, strict=True) if on]
            sub = {"allOf": subs} if subs else extra_schema
            if sub is False:
                continue
            # Declared names in this class of pattern matches are written where declared.
            kinds = [p for _ir, p, _s in patterns]
            taken = [
                k for k in declared if tuple(search(p, k, self.deadline) for p in kinds) == chosen
            ]
            names = ANY_NAME
            if patterns:
                want = tuple(chosen)
                irs = [ir for ir, _p, _s in patterns]
                names = combine(irs, lambda got, want=want: got == want, self.deadline)
            names = exclude_words(names, taken, self.deadline)
            if names is NEVER:
                continue
            value = self.convert(sub, f"{where}/additionalProperties")
            if value is NEVER:
                continue
            options.append(seq(self._name_ir(names), self._tok(":"), value))
        return Alt(tuple(options)) if options else None
