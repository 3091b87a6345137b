"""`not` of a schema, as the schemas of the ways to fail it.

A schema is the conjunction of its keywords, so its `not` is the union of theirs:
`negation_clauses` splits it into groups negated one by one (a type, enum/const, a pattern,
a bound, the object constraints), and a bound's `not` is the complementary bound on the
values it applies to (`minLength: 3` fails for strings of at most 2 characters; other types
meet it, so they never fail it).

An object fails `required`, `properties` and `additionalProperties` by lacking a required name,
by holding a declared name whose value fails that name's schema (the value's own `not`,
converted as any other), or by holding a name not declared whose value fails
`additionalProperties` (every value fails `false`); every other value meets them. The last
case is written for the objects whose names are known: those of a schema that allows its
declared names only. `not` of `anyOf` of required names is the objects lacking one name of each
list (`absent_name_sets`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from .json_schema_formats import FORMATS
from .json_schema_resolve import HANDLED, MAX_MERGED_BRANCHES, UNSUPPORTED

Inline = Callable[[object, str], object]  # `SchemaResolver.inline`: a schema, its $ref followed
# bound -> (the type it applies to, the bound its failures meet, the shift of its value)
_BOUND_FAILURES = {
    "minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}  # fmt: skip


# keywords negated together (`additionalProperties` means what it does beside `properties`)
_GROUPS = {
    "required": "object", "properties": "object", "additionalProperties": "object",
    "const": "enum",
}  # fmt: skip


def negation_clauses(neg: dict) -> list[dict]:
    """`neg`'s keywords in the groups whose conjunction it is (each negated on its own);
    a format that is an annotation constrains nothing and is left out."""
    groups: dict[str, dict] = {}
    for key, value in neg.items():
        if key not in HANDLED and key not in UNSUPPORTED:
            continue
        if key == "format" and value not in FORMATS:
            continue
        group = _GROUPS.get(key, key)
        groups.setdefault(group, {})[key] = value
    return list(groups.values())


def types_failing(bad, types) -> list[str] | None:
    """The types of `types` whose values all fail `{"type": bad}` (integers fail "number"
    too); None where `bad` holds integers and `types` numbers (the numbers that are not
    integers: no `type` says so)."""
    bad = {bad} if isinstance(bad, str) else set(bad)
    if "integer" in bad and "number" not in bad and "number" in types:
        return None
    return [t for t in types if t not in bad and not (t == "integer" and "number" in bad)]


def bound_failures(neg: dict) -> list | None:
    """The schema of the values failing `neg`, one bound (`minimum`, `maxLength`, ...): the
    complementary bound on the type the bound applies to ([] when none fails it); None when
    `neg` is not one bound."""
    if len(neg) != 1:
        return None
    ((key, value),) = neg.items()
    if key not in _BOUND_FAILURES or isinstance(value, bool):
        return None
    kind, failing, shift = _BOUND_FAILURES[key]
    if shift < 0 and value <= 0:
        return []  # every value has at least 0 characters, items or properties
    return [{"type": kind, failing: value + shift}]


def absent_name_sets(neg, keys: set, inline: Inline, where: str) -> list[list[str]] | None:
    """For `not` of required names (`{"required": R}`, or `anyOf` of such): the sets of names
    one of which must all be absent (one name from each R; the smallest sets only), None for
    any other `not`. `not` holds of objects only: `required` holds of the rest."""
    if keys == {"required"}:
        lists = [neg["required"]]
    elif keys == {"anyOf"}:
        parts = [inline(b, f"{where}/not/anyOf") for b in neg["anyOf"]]
        if not all(
            isinstance(b, dict) and set(b) & (HANDLED | UNSUPPORTED) == {"required"} for b in parts
        ):
            return None
        lists = [b["required"] for b in parts]
    else:
        return None
    picks = {frozenset(p) for p in itertools.product(*(dict.fromkeys(r) for r in lists))}
    if len(picks) > MAX_MERGED_BRANCHES:
        raise ValueError(
            f"{where}: 'not' of these required names makes more than {MAX_MERGED_BRANCHES} "
            "cases (MAX_MERGED_BRANCHES)"
        )
    smallest = [p for p in picks if not any(q < p for q in picks)]
    return sorted(sorted(p) for p in smallest)


def object_failures(neg: dict, names: list[str] | None = None) -> list | None:
    """The schemas of the objects failing `neg`, `required`, `properties` and/or
    `additionalProperties` (None for other keywords): one per required name (it is absent),
    one per declared name (present, with a value failing that name's schema), and one per name
    of `names` (all an object may hold) that `neg` does not declare (present, with a value
    failing `additionalProperties`; None when that may fail and `names` is None)."""
    if not neg or not set(neg) <= {"required", "properties", "additionalProperties"}:
        return None
    cases: list = [
        {"type": "object", "properties": {name: False}}
        for name in dict.fromkeys(neg.get("required", []))
    ]
    for name, sub in neg.get("properties", {}).items():
        if sub is True or sub == {}:
            continue  # no value fails it
        failing = True if sub is False else {"not": sub}
        cases.append({"type": "object", "required": [name], "properties": {name: failing}})
    extra = neg.get("additionalProperties", True)
    if extra is True or extra == {}:
        return cases  # no value fails it
    if names is None:
        return None
    failing = True if extra is False else {"not": extra}
    declared = neg.get("properties", {})
    cases += [
        {"type": "object", "required": [name], "properties": {name: failing}}
        for name in names
        if name not in declared
    ]
    return cases
