"""JSON Schema objects and arrays -> regex IR: property order, counts, pattern properties,
dependencies; array items, their counts and `uniqueItems`.

Mixed into `SchemaConverter` (see `json_schema` for the generated form). Property names are
built at the code point level and mapped to JSON string characters afterwards, so names that
match a `patternProperties` pattern, match none, or are not declared are exact regular sets
(`regex_algebra.combine`).

Property order: the declared properties are split into chains, each written in its own
order, and the chains interleave freely. A plain object has one chain (`properties` order,
then names only in `required`). Where an `anyOf`/`oneOf` branch is merged with its parent
schema's own properties, the parent's properties are one chain and the properties only the
branch declares are another (`interleaved`): with parent `{a, b}` and branch `{c, d}`, the
orders a b c d, c d a b and a c b d are accepted, b a and d c are not. A property both
declare belongs to the parent's chain. The chains are carried to the object by the private
schema key `PROPERTY_CHAINS`; when interleaving would need more than `MAX_INTERLEAVINGS`
positions, the chains are written one after another (the merged schema's declared order).
Properties not declared come after all declared ones. With `key_order` "any" none of this
applies: the members come in any order (`json_schema_key_order`).

`propertyNames` (a pattern, length bounds, enum/const; `json_schema_names`) holds for every
name: a declared name it refuses is dropped (the object is impossible if that name is required),
and the other names are those it allows.
"""

from __future__ import annotations

import itertools
import math

from .json_schema_disjoint import json_key
from .json_schema_key_order import any_order_members
from .json_schema_names import PatternNames, property_name_language
from .json_schema_strings import compact_json, json_chars, json_string_literal
from .regex_algebra import combine, exclude_words, matches
from .regex_ir import (
    EMPTY,
    Alt,
    Repeat,
    Seq,
    alt,
    literal,
    map_chars,
    seq,
)
from .regex_terms import NEVER

MAX_DEPENDENCY_CASES = 64
DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
# Not a JSON Schema keyword ("$" names are reserved to the specification, so no user schema
# sets it by accident): [[key, ...], ...], the chains of a merged schema's properties.
PROPERTY_CHAINS = "$radixflowPropertyChains"
MAX_INTERLEAVINGS = 256  # product over the chains of (length + 1): the object's positions
MAX_UNIQUE_STATES = 4096  # sets of values an array with uniqueItems may have written


def interleaved(parent: dict, merged):
    """`merged` (`parent` merged into an `anyOf`/`oneOf` branch), marked so that the
    properties only the branch declares form a chain of their own."""
    if not isinstance(merged, dict) or not isinstance(merged.get("properties"), dict):
        return merged
    chains = parent.get(PROPERTY_CHAINS) or [list(parent.get("properties", {}))]
    known = {key for chain in chains for key in chain}
    own = [key for key in merged["properties"] if key not in known]
    if not own or not known:
        return merged
    return {**merged, PROPERTY_CHAINS: [*chains, own]}


def property_chains(schema: dict, keys: list[str]) -> list[list[str]]:
    """`keys` (in declared order) split into the chains that `schema` marks; keys no chain
    names join the last chain."""
    wanted, chains = set(keys), []
    for chain in schema.get(PROPERTY_CHAINS, []):
        chains.append([key for key in chain if key in wanted])
        wanted -= set(chains[-1])
    left = [key for key in keys if key in wanted]
    if chains:
        chains[-1] += left
    else:
        chains.append(left)
    chains = [chain for chain in chains if chain]
    if math.prod(len(chain) + 1 for chain in chains) > MAX_INTERLEAVINGS:
        return [[key for chain in chains for key in chain]]
    return chains


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


class ContainerConverter:
    """The object and array part of `SchemaConverter`."""

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
        patterns = PatternNames(schema.get("patternProperties", {}), self.deadline)
        names = schema.get("propertyNames", True)
        if isinstance(names, dict):
            names = self.schemas.flatten(names, f"{where}/propertyNames")
        allowed = property_name_language(names, where, self.deadline)

        def schema_of(key: str, declared):
            if allowed is not None and not matches(allowed, key, self.deadline):
                return False  # a name `propertyNames` does not allow
            hits = [s for s, on in zip(patterns.schemas, patterns.matched(key), strict=True) if on]
            if declared is None:
                return {"allOf": hits} if hits else extra_schema
            return {"allOf": [declared, *hits]} if hits else declared

        declared = [(k, schema_of(k, props[k])) for k in props]
        declared += [(k, schema_of(k, None)) for k in dict.fromkeys(required) if k not in props]
        entries = {}
        for key, sub in declared:
            value = self.convert(sub, f"{where}/properties/{key}")
            if value is NEVER or sub is False:
                if key in required:
                    return NEVER
                continue
            pair = seq(json_string_literal(key), self._tok(":"), value)
            entries[key] = (pair, key in required)
        extra = self._extra_pair([k for k, _ in declared], patterns, allowed, extra_schema, where)
        lo, hi = int(schema.get("minProperties", 0)), schema.get("maxProperties")
        hi = None if hi is None else int(hi)
        sep = self._tok(",")
        if self.key_order == "any":
            members = any_order_members(list(entries.values()), extra, sep, lo, hi)
            if members is not None:
                return seq(literal("{"), self.ws, members, self.ws, literal("}"))
        # per chain, its (pair, pair after a separator, required) in order
        chains = [[(entries[k][0], seq(sep, entries[k][0]), entries[k][1]) for k in chain]
                  for chain in property_chains(schema, list(entries))]  # fmt: skip
        cap = lo if hi is None else hi + 1
        memo: dict = {}

        # Neither closure calls itself: a function in its own closure is a reference cycle,
        # which keeps all it reaches (this object's IR) alive until a full collection.
        def extras_after(count: int):
            """Extra pairs, each after a separator, after `count` pairs."""
            out = memo.get(count)
            if out is None:
                low, high = max(lo - count, 0), None if hi is None else hi - count
                if extra is None or high == 0:
                    out = EMPTY if low == 0 else NEVER
                else:
                    out = Repeat(seq(sep, extra), low, high)
                memo[count] = out
            return out

        def extras(first: int, count: int):
            """Extra pairs after `count` pairs (no separator before the first if `first`)."""
            if not first or extra is None or hi == count:
                return extras_after(count)
            body = seq(extra, extras_after(min(count + 1, cap)))
            return Alt((EMPTY, body)) if lo <= count else body

        # rest[at, count, first]: the pairs from chain positions `at` on, `count` pairs written
        # so far (no separator before the next if `first`): the next pair of any chain, or
        # that pair skipped if optional. Built from the end (positions in decreasing order),
        # so every continuation exists before it is used and nothing recurses per property.
        # A flat list: positions are numbered in mixed radix (chain c's digit weighs
        # `weights[c]`, the last chain's 1), so that `product` below counts them down, and
        # rest[at, count, first] is at ((position * width) + count) * 2 + first.
        ends = [len(chain) for chain in chains]
        # per chain, its first required pair: a position past one has a pair written before it
        leads = [
            next((i for i, link in enumerate(chain) if link[2]), len(chain)) for chain in chains
        ]
        weights = [math.prod(end + 1 for end in ends[c + 1 :]) for c in range(len(ends))]
        width = min(cap, sum(ends)) + 1  # counts past the number of pairs are never reached
        positions = weights[0] * (ends[0] + 1) if ends else 1
        rest: list = [None] * (positions * width * 2)
        orders = itertools.product(*(range(end, -1, -1) for end in ends))
        for position, at in zip(range(positions - 1, -1, -1), orders, strict=True):
            self.deadline.check()
            # per chain with a pair left: that pair, it after a separator, whether it is
            # required, and the position after it (none once every chain is done)
            nexts = [(*chains[c][i], position + weights[c])
                     for c, i in enumerate(at) if i < ends[c]]  # fmt: skip
            # Only what some order of writing reaches is built: no pair written yet (`first`)
            # until a chain's first required pair, and, where counts are kept, a separator
            # next only after a pair.
            opening = (1,) if all(i <= leads[c] for c, i in enumerate(at)) else ()
            for count in range(min(cap, sum(at)) + 1):
                more, up = hi is None or count < hi, min(count + 1, cap)
                for first in (0,) if count else opening if cap else (*opening, 0):
                    here = (position * width + count) * 2 + first
                    if not nexts:
                        rest[here] = extras(first, count)
                        continue
                    options = []
                    for pair, sep_pair, req, after in nexts:
                        if more:
                            options.append(
                                Seq((pair if first else sep_pair, rest[(after * width + up) * 2]))
                            )
                        if not req:
                            options.append(rest[(after * width + count) * 2 + first])
                    rest[here] = options[0] if len(options) == 1 else Alt(tuple(options))
        start = rest[1]  # position 0 of every chain, no pair written, the first one next
        return seq(literal("{"), self.ws, start, self.ws, literal("}"))

    def _extra_pair(
        self, declared: list[str], patterns: PatternNames, allowed, extra_schema, where: str
    ):
        """IR of one `"name":value` pair for a property not declared, or None if none may be;
        names are those `allowed` (IR over code points, None for any)."""
        signatures = {key: patterns.matched(key) for key in declared}
        options = []
        for chosen in patterns.classes(where):
            self.deadline.check()
            subs = [s for s, on in zip(patterns.schemas, chosen, strict=True) if on]
            sub = {"allOf": subs} if subs else extra_schema
            if sub is False:
                continue
            # Declared names in this class are written where declared.
            taken = [k for k in declared if signatures[k] == chosen]
            names = exclude_words(patterns.names(chosen), taken, self.deadline)
            if allowed is not None and names is not NEVER:
                names = combine([names, allowed], all, self.deadline)
            if names is NEVER:
                continue
            value = self.convert(sub, f"{where}/additionalProperties")
            if value is not NEVER:
                options.append(seq(self._name_ir(names), self._tok(":"), value))
        return Alt(tuple(options)) if options else None

    # ---- arrays ----------------------------------------------------------------------------
    def _array(self, schema, where):
        items = schema.get("items")
        if isinstance(items, list):  # draft 4 tuple form
            prefix, tail = items, schema.get("additionalItems", True)
        else:
            prefix = schema.get("prefixItems", [])
            tail = True if items is None else items  # additionalItems applies to arrays only
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        hi = None if hi is None else int(hi)
        if hi is not None and hi < lo:
            return NEVER  # bounds no length meets (merged parts, a `not` of a bound)
        unique = schema.get("uniqueItems", False)
        if not isinstance(unique, bool):
            raise ValueError(f"{where}: uniqueItems must be a boolean, got {unique!r}")
        if unique and (hi is None or hi > 1):
            return self._unique_array(prefix, tail, lo, hi, where)
        elems = [self.convert(s, f"{where}/prefixItems/{i}") for i, s in enumerate(prefix)]
        tail_ir = None if tail is False else self.convert(tail, f"{where}/items")
        sep = self._tok(",")
        k = len(elems)

        # after[i]: the continuation after i emitted elements, i >= 1, built from the end
        stop = k if hi is None else min(k, hi)  # from here on, no prefix element is next
        i = max(stop, 1)
        if (hi is not None and i >= hi) or tail_ir is None:
            after = EMPTY if i >= lo else NEVER
        else:
            after = Repeat(seq(sep, tail_ir), max(lo - i, 0), None if hi is None else hi - i)
        for i in range(stop - 1, 0, -1):
            more = seq(sep, elems[i], after)
            after = alt(more, EMPTY) if i >= lo else more

        if k:
            first = seq(elems[0], after)
        elif tail_ir is not None:
            first = seq(tail_ir, after)
        else:
            first = NEVER
        if hi == 0:
            first = NEVER
        return self._brackets(first, lo)

    def _brackets(self, first, lo: int):
        """`[` elements `]`, where `first` is the IR from the first element on; `[]` if lo is 0."""
        options = [seq(literal("["), self.ws, first, self.ws, literal("]"))]
        if lo == 0:
            options.append(seq(literal("["), self.ws, literal("]")))
        return Alt(tuple(options))

    def _unique_array(self, prefix: list, tail, lo: int, hi: int | None, where: str):
        """Arrays of pairwise different elements (`uniqueItems`), each from a finite value set.

        The state after some elements is the set of values written, so there are as many
        states as sets of at most `maxItems` values: more than `MAX_UNIQUE_STATES` raises.
        """
        slots = [self._finite_values(s, f"{where}/prefixItems/{i}") for i, s in enumerate(prefix)]
        others = {} if tail is False else self._finite_values(tail, f"{where}/items")
        universe = set(others).union(*slots)
        top = len(universe) if hi is None else min(hi, len(universe))
        if sum(math.comb(len(universe), j) for j in range(top + 1)) > MAX_UNIQUE_STATES:
            raise ValueError(
                f"{where}: uniqueItems over {len(universe)} values needs more than "
                f"{MAX_UNIQUE_STATES} states (MAX_UNIQUE_STATES)"
            )
        sep = self._tok(",")
        # elements[used]: the elements after those in `used` (each but the first after a
        # separator), for every reachable `used`, children first (a loop, not a recursion)
        elements: dict[frozenset, object] = {}
        stack = [frozenset()]
        while stack:
            used = stack[-1]
            if used in elements:  # pushed again before it was built
                stack.pop()
                continue
            i = len(used)
            choices = (slots[i] if i < len(slots) else others) if hi is None or i < hi else {}
            nexts = {key: used | {key} for key in choices if key not in used}
            todo = [n for n in nexts.values() if n not in elements]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            options = [EMPTY] if i >= lo else []
            for key, n in nexts.items():
                head = choices[key] if i == 0 else seq(sep, choices[key])
                options.append(seq(head, elements[n]))
            elements[used] = Alt(tuple(options))
        start = elements[frozenset()]
        return self._brackets(start, lo)

    def _finite_values(self, schema, where: str) -> dict[str, object]:
        """{JSON value key: IR of its spellings} of an enum/const/boolean/null schema."""
        schema = self.schemas.inline(schema, where)
        if schema is False:
            return {}
        types = schema.get("type") if isinstance(schema, dict) else None
        types = [types] if isinstance(types, str) else types
        if types and set(types) <= {"boolean", "null"} and not {"enum", "const"} & set(schema):
            schema = {**schema, "enum": [False, True, None]}
        if not isinstance(schema, dict) or not {"enum", "const"} & set(schema):
            raise ValueError(
                f"{where}: uniqueItems is supported for items that are enum/const/boolean/null "
                "values (or with maxItems <= 1)"
            )
        spelled: dict[str, list] = {}
        for value in self._enum_values(schema, where):
            spelled.setdefault(json_key(value), []).append(literal(compact_json(value)))
        return {key: Alt(tuple(texts)) for key, texts in spelled.items()}
