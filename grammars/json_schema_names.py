"""The classes of property names that an object's `patternProperties` patterns make.

`PatternNames` parses the patterns once, tells which patterns a name matches, and lists the
classes (the sets of patterns some name matches exactly) without trying all 2**n subsets: a
set of patterns is a candidate only when every smaller set in it is one and all its patterns
share a name (patterns that exclude each other, the usual case, give n + 1 classes). Names
are code point strings here; the caller spells them as JSON.

Most patterns are anchored with a literal start (`^contacts:([0-3]):surName$`): a name matches
such a pattern only if it starts with that text, and two such patterns share a name only if
one's text starts the other's, so those tests come first and most walks never start.
"""

from __future__ import annotations

from collections.abc import Mapping

from .json_schema_numbers import check_numbers
from .json_schema_resolve import HANDLED, UNSUPPORTED
from .nfa import Deadline
from .regex_algebra import ANY_CHAR, combine, overlaps, restrict_length
from .regex_ir import Alt, Chars, literal, star, word_prefix
from .regex_parse import parse_search_regex
from .regex_terms import NEVER, NEVER_TERM, Terms

MAX_PATTERN_CLASSES = 256  # sets of patternProperties patterns that some name matches exactly
ANY_NAME = star(Chars(ANY_CHAR))


# What `propertyNames` may say of a name (a string): other keywords raise.
NAME_KEYWORDS = {"type", "pattern", "minLength", "maxLength", "enum", "const"}


def property_name_language(names, where: str, deadline: Deadline):
    """IR (over code points) of the names `propertyNames` allows (`names`, its schema with
    `$ref`s and `allOf` resolved), None when it allows every name."""
    if names is True or names == {}:
        return None
    if names is False:
        return NEVER
    if not isinstance(names, dict):
        raise ValueError(f"{where}/propertyNames: a schema must be an object or a boolean")
    check_numbers(names, f"{where}/propertyNames")
    unknown = sorted(set(names) & (HANDLED | UNSUPPORTED) - NAME_KEYWORDS)
    if unknown:
        raise ValueError(
            f"{where}/propertyNames: unsupported keyword(s) {', '.join(unknown)} (supported: "
            f"{', '.join(sorted(NAME_KEYWORDS))})"
        )
    kinds = names.get("type", "string")
    if "string" not in ([kinds] if isinstance(kinds, str) else kinds):
        return NEVER  # names are strings
    ir = ANY_NAME
    if "enum" in names or "const" in names:
        values = list(names["enum"]) if "enum" in names else [names["const"]]
        if "const" in names:
            values = [v for v in values if v == names["const"]]
        ir = Alt(tuple(literal(v) for v in dict.fromkeys(v for v in values if isinstance(v, str))))
    if "pattern" in names:
        ir = combine([ir, parse_search_regex(names["pattern"])], all, deadline)
    lo, hi = int(names.get("minLength", 0)), names.get("maxLength")
    if lo or hi is not None:
        ir = restrict_length(ir, lo, None if hi is None else int(hi), deadline)
    return ir


class PatternNames:
    """The `patternProperties` of one object: `schemas` in order, their patterns parsed once."""

    def __init__(self, patterns: Mapping[str, object], deadline: Deadline):
        self.deadline = deadline
        self.schemas = list(patterns.values())
        self.irs = [parse_search_regex(p) for p in patterns]
        self._terms = Terms(deadline) if self.irs else None  # most objects have no patterns
        self._starts = [self._terms.term(ir) for ir in self.irs] if self._terms else []
        self._prefixes = [word_prefix(ir) for ir in self.irs]  # '' for unanchored patterns
        self._meets: dict[frozenset[int], bool] = {}

    def matched(self, name: str) -> tuple[bool, ...]:
        """Which patterns `name` matches (as `re.search` would, in time linear in the name)."""
        if not self._starts:  # most objects
            return ()
        out = []
        for t, prefix in zip(self._starts, self._prefixes, strict=True):
            if not name.startswith(prefix):
                out.append(False)
                continue
            for ch in name:
                self.deadline.check()
                t = self._terms.deriv(t, ord(ch))
                if t == NEVER_TERM:
                    break
            out.append(self._terms.nullable(t))
        return tuple(out)

    def classes(self, where: str) -> list[tuple[bool, ...]]:
        """Candidate classes (which patterns a name matches), the empty one first; raises
        past `MAX_PATTERN_CLASSES`."""
        n = len(self.irs)
        if n == 0:  # most objects
            return [()]
        found: set[frozenset[int]] = {frozenset()}
        level = [frozenset([i]) for i in range(n)]
        while level:
            if len(found) + len(level) > MAX_PATTERN_CLASSES:
                raise ValueError(
                    f"{where}: the patternProperties patterns split names into more than "
                    f"{MAX_PATTERN_CLASSES} classes (MAX_PATTERN_CLASSES)"
                )
            found.update(level)
            grown = set()
            for group in level:
                for j in range(max(group) + 1, n):
                    bigger = group | {j}
                    if all(bigger - {i} in found for i in bigger) and self._meet(bigger):
                        grown.add(bigger)
            level = sorted(grown, key=sorted)
        ordered = sorted(found, key=lambda g: (len(g), sorted(g)))
        return [tuple(i in g for i in range(n)) for g in ordered]

    def _meet(self, group: frozenset[int]) -> bool:
        """Whether some name matches every pattern in `group`."""
        got = self._meets.get(group)
        if got is None:
            longest = max((self._prefixes[i] for i in group), key=len)
            if not all(longest.startswith(self._prefixes[i]) for i in group):
                got = False
            else:
                got = overlaps(self._terms, [self._starts[i] for i in sorted(group)])
            self._meets[group] = got
        return got

    def names(self, chosen: tuple[bool, ...]):
        """IR (over code points) of the names that match exactly the `chosen` patterns."""
        if not chosen:
            return ANY_NAME
        # A pattern that cannot share a name with every chosen one is never matched here.
        inside = [i for i, on in enumerate(chosen) if on]
        keep = [
            i
            for i in range(len(chosen))
            if chosen[i] or not inside or self._meet(frozenset([*inside, i]))
        ]
        want = tuple(chosen[i] for i in keep)
        irs = [self.irs[i] for i in keep]
        return combine(irs, lambda got: got == want, self.deadline)
