"""Python `re` syntax -> regex IR (`parse_regex`, `parse_search_regex`): the stdlib parser's
tree, its regular subset.

Back-references, look-arounds, conditionals, atomic groups, possessive repeats and word
boundaries raise `ValueError`. `^` and `$` may stand anywhere: a part of a pattern is read as
its words split by the anchors the paths that match them pass (`_Anchored`), and an anchor
holds only where nothing is matched before a `^` or after a `$`, so `^$|^[a-z]+$` (the usual
"empty or ...") and `(^|,)x` are exact; a repeat holding an anchor is written out, up to
`_MAX_ANCHORED_REPEAT` copies, or is a star (`(a|$)*`, `_anchored_star`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from .nfa import untrack_ir
from .regex_ir import (
    EMPTY,
    MAX_CODEPOINT,
    Alt,
    Chars,
    Ranges,
    Repeat,
    Seq,
    complement,
    intersect,
    normalize,
)

try:  # Python >= 3.11
    from re import _constants as sre_c
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]


def chars(spec: str) -> Chars:
    """IR for one character of a regex class body, e.g. chars('0-9a-f')."""
    return _to_ir(list(sre_parse.parse(f"[{spec}]")), 0)


@functools.cache
def _unicode_class(pattern: str) -> Ranges:
    """Code point ranges matched by a one-character `re` pattern like r'\\d' (Unicode mode)."""
    return tuple((m.start(), m.end() - 1) for m in re.finditer(pattern + "+", _every_char()))


def warm_unicode_classes() -> None:
    """Find the Unicode \\d, \\w and \\s classes now (a scan of every code point, ~25 ms
    each, once per process), so that no compile pays it: GrammarCompiler calls this."""
    for kind in _ASCII_CLASSES:
        _unicode_class("\\" + kind)


def _every_char() -> str:
    """Every code point in order, surrogates included (decoded in one call: a Python loop
    over chr() takes ten times longer)."""
    points = np.arange(MAX_CODEPOINT + 1, dtype="<u4").tobytes()
    return points.decode("utf-32-le", "surrogatepass")


_ASCII_CLASSES = {
    "d": ((48, 57),),
    "w": ((48, 57), (65, 90), (95, 95), (97, 122)),
    "s": ((9, 13), (32, 32)),
}


# Not an `re` flag (those stop at 256): JSON Schema's patterns are ECMA-262 regexes, whose
# \d and \w are the ASCII classes whatever the flags (\s stays `re`'s Unicode class).
_ECMA_CLASSES = 1 << 20


def _category(cat, flags: int) -> Ranges:
    name = str(cat).lower()
    kind = "d" if "digit" in name else "w" if "word" in name else "s"
    ascii_only = flags & re.ASCII or (flags & _ECMA_CLASSES and kind != "s")
    base = _ASCII_CLASSES[kind] if ascii_only else _unicode_class("\\" + kind)
    return complement(base) if "not" in name else base


def _fold_case(ranges: Ranges) -> Ranges:
    extra = []
    for lo, hi in ranges:
        if hi - lo > 5000:
            extra.extend(_fold_case(intersect(((lo, hi),), ((0, 0x24F),))))
            continue
        for cp in range(lo, hi + 1):
            c = chr(cp)
            for v in (c.lower(), c.upper()):
                if len(v) == 1:
                    extra.append((ord(v), ord(v)))
    return normalize(list(ranges) + extra)


def _in_ranges(items, flags: int) -> Ranges:
    out: list[tuple[int, int]] = []
    negate = False
    for op, av in items:
        if op is sre_c.NEGATE:
            negate = True
        elif op is sre_c.LITERAL:
            out.append((av, av))
        elif op is sre_c.RANGE:
            out.append(av)
        elif op is sre_c.CATEGORY:
            out.extend(_category(av, flags))
        else:
            raise ValueError(f"unsupported item in character class: {op}")
    ranges = normalize(out)
    if flags & re.IGNORECASE:
        ranges = _fold_case(ranges)
    return complement(ranges) if negate else ranges


def _set(ranges: Ranges, flags: int) -> Chars:
    if flags & re.IGNORECASE:
        ranges = _fold_case(ranges)
    return Chars(normalize(ranges))


_UNSUPPORTED = {
    "GROUPREF": "back-references",
    "GROUPREF_EXISTS": "conditional groups",
    "ASSERT": "look-ahead/look-behind assertions",
    "ASSERT_NOT": "negative look-ahead/look-behind assertions",
    "ATOMIC_GROUP": "atomic groups",
    "POSSESSIVE_REPEAT": "possessive repeats",
}


def _to_ir(items, flags: int):
    parts = []
    for op, av in items:
        name = str(op)
        if op is sre_c.LITERAL:
            parts.append(_set(((av, av),), flags))
        elif op is sre_c.NOT_LITERAL:
            parts.append(Chars(complement(_set(((av, av),), flags).ranges)))
        elif op is sre_c.ANY:
            parts.append(
                Chars(((0, MAX_CODEPOINT),) if flags & re.DOTALL else complement(((10, 10),)))
            )
        elif op is sre_c.IN:
            parts.append(Chars(_in_ranges(av, flags)))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            parts.append(Repeat(_to_ir(sub, flags), lo, None if hi == sre_c.MAXREPEAT else hi))
        elif op is sre_c.SUBPATTERN:
            _group, add, remove, sub = av
            parts.append(_to_ir(sub, (flags | add) & ~remove))
        elif op is sre_c.BRANCH:
            parts.append(Alt(tuple(_to_ir(b, flags) for b in av[1])))
        elif op is sre_c.AT:  # only reached through `_anchored_ir`, which takes them first
            raise ValueError(f"regex anchor {av} is not supported here")
        elif name in _UNSUPPORTED:
            raise ValueError(f"regex uses {_UNSUPPORTED[name]}, which are not regular")
        else:
            raise ValueError(f"unsupported regex construct {name}")
    return parts[0] if len(parts) == 1 else Seq(tuple(parts))


_STARTS = ("AT_BEGINNING", "AT_BEGINNING_STRING")
_ENDS = ("AT_END", "AT_END_STRING")
_NONE = Alt(())  # the empty language
_MAX_ANCHORED_REPEAT = 4  # a repeat holding an anchor is written out up to this many copies


@dataclass(frozen=True)
class _Anchored:
    """A regex part's words by the anchors the paths that match them pass: none, a `^`, a `$`,
    both. An anchor holds only where nothing is matched before a `^` or after a `$` (nor
    outside the match: a search's match starts at the text's start and ends at its end)."""

    plain: object
    start: object = _NONE
    end: object = _NONE
    both: object = _NONE

    def by_anchors(self) -> dict[tuple[bool, bool], object]:
        """{(passes a `^`, passes a `$`): IR}, the empty languages left out."""
        kinds = {(False, False): self.plain, (True, False): self.start,
                 (False, True): self.end, (True, True): self.both}  # fmt: skip
        return {k: ir for k, ir in kinds.items() if ir is not _NONE}


def _only_empty(node):
    """The empty word if `node` matches it, else the empty language."""
    facts = getattr(node, "facts", None)
    return EMPTY if facts is not None and facts[1] and not facts[0] else _NONE


def _anchored_seq(a: _Anchored, b: _Anchored) -> _Anchored:
    """`a` then `b`: a `^` in `b` needs `a` to match nothing, a `$` in `a` needs `b` to."""
    out: dict[tuple[bool, bool], list] = {}
    for (a_start, a_end), a_ir in a.by_anchors().items():
        for (b_start, b_end), b_ir in b.by_anchors().items():
            first = _only_empty(a_ir) if b_start else a_ir
            second = _only_empty(b_ir) if a_end else b_ir
            if first is not _NONE and second is not _NONE:
                out.setdefault((a_start or b_start, a_end or b_end), []).append(
                    _then(first, second)
                )
    return _anchored_from(out)


def _then(first, second):
    """`first` then `second`, as one flat sequence (what the NFA reads as a literal run)."""
    items = [p for part in (first, second) for p in (part.items if type(part) is Seq else (part,))]
    return EMPTY if not items else items[0] if len(items) == 1 else Seq(tuple(items))


def _anchored_from(parts: dict[tuple[bool, bool], list]) -> _Anchored:
    def union(key):
        got = parts.get(key, [])
        return _NONE if not got else got[0] if len(got) == 1 else Alt(tuple(got))

    return _Anchored(union((False, False)), union((True, False)), union((False, True)),
                     union((True, True)))  # fmt: skip


def _has_anchor(items) -> bool:
    for op, av in items:
        if op is sre_c.AT:
            return True
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and _has_anchor(av[2]):
            return True
        if op is sre_c.SUBPATTERN and _has_anchor(av[3]):
            return True
        if op is sre_c.BRANCH and any(_has_anchor(b) for b in av[1]):
            return True
    return False


def _anchored_ir(items, flags: int) -> _Anchored:
    """`_to_ir` of a regex part that holds `^`/`$` anchors anywhere, split by the anchors;
    the items between anchors are converted together (one flat sequence)."""
    out, run = _Anchored(EMPTY), []
    for op, av in items:
        if not _has_anchor([(op, av)]):
            run.append((op, av))
            continue
        if run:
            out, run = _anchored_seq(out, _Anchored(_to_ir(run, flags))), []
        if op is sre_c.AT:
            if str(av) in _STARTS:
                part = _Anchored(_NONE, start=EMPTY)
            elif str(av) in _ENDS:
                part = _Anchored(_NONE, end=EMPTY)
            else:
                raise ValueError(f"regex anchor {av} (\\b or \\B) is not supported")
        elif op is sre_c.SUBPATTERN:
            part = _anchored_ir(av[3], (flags | av[1]) & ~av[2])
        elif op is sre_c.BRANCH:
            options: dict[tuple[bool, bool], list] = {}
            for branch in av[1]:
                for key, ir in _anchored_ir(branch, flags).by_anchors().items():
                    options.setdefault(key, []).append(ir)
            part = _anchored_from(options)
        else:  # a repeat holding an anchor
            part = _anchored_repeat(_anchored_ir(av[2], flags), av[0], av[1])
        out = _anchored_seq(out, part)
    return _anchored_seq(out, _Anchored(_to_ir(run, flags))) if run else out


def _anchored_repeat(body: _Anchored, lo: int, hi: int) -> _Anchored:
    """`lo` to `hi` copies of `body`: `lo` written out, then `hi - lo` optional ones, or the
    star of `body` when `hi` is unbounded."""
    unbounded = hi == sre_c.MAXREPEAT
    if lo > _MAX_ANCHORED_REPEAT or (not unbounded and hi > _MAX_ANCHORED_REPEAT):
        raise ValueError(
            f"a regex anchor inside a repeat of more than {_MAX_ANCHORED_REPEAT} copies "
            "(other than unbounded) is not supported"
        )
    out = _Anchored(EMPTY)
    for _ in range(lo):
        out = _anchored_seq(out, body)
    if unbounded:
        return _anchored_seq(out, _anchored_star(body))
    optional = _Anchored(EMPTY)
    for _ in range(hi - lo):  # (body (body ...)?)?
        parts = {k: [ir] for k, ir in _anchored_seq(body, optional).by_anchors().items()}
        parts.setdefault((False, False), []).append(EMPTY)
        optional = _anchored_from(parts)
    return _anchored_seq(out, optional)


def _anchored_star(body: _Anchored) -> _Anchored:
    """Any number of copies of `body`. Copies before one that passes a `^` match nothing, as
    do those after one that passes a `$`, so (as the empty word) they drop out: the words are
    plain copies, after a `^` copy and before a `$` copy, or one copy passing both."""
    plain = Repeat(body.plain, 0, None) if body.plain is not _NONE else EMPTY
    parts: dict[tuple[bool, bool], list] = {(False, False): [plain]}
    if body.start is not _NONE:
        parts[True, False] = [Seq((body.start, plain))]
    if body.end is not _NONE:
        parts[False, True] = [Seq((plain, body.end))]
    if body.start is not _NONE and body.end is not _NONE:
        parts[True, True] = [Seq((body.start, plain, body.end))]
    if body.both is not _NONE:
        parts.setdefault((True, True), []).append(body.both)
    return _anchored_from(parts)


# Schemas repeat patterns (formats, the same `pattern` in every item of a list) and IR is
# immutable, so a pattern's IR is parsed once and shared.
@functools.lru_cache(maxsize=1024)
def _parse(pattern: str, flags: int, search: bool):
    try:
        tree = sre_parse.parse(pattern, flags)
    except (re.error, OverflowError) as exc:  # OverflowError: a repeat count past 2**32 - 2
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    flags = tree.state.flags | (_ECMA_CLASSES if search else 0)
    parts = _anchored_ir(list(tree), flags)
    if not search:  # the match is the whole text: every anchor holds where it can
        options = list(parts.by_anchors().values())
    else:
        anything = Repeat(Chars(((0, MAX_CODEPOINT),)), 0, None)
        around = {(False, False): (anything, anything), (True, False): (EMPTY, anything),
                  (False, True): (anything, EMPTY), (True, True): (EMPTY, EMPTY)}  # fmt: skip
        options = [
            Seq((around[key][0], ir, around[key][1])) for key, ir in parts.by_anchors().items()
        ]
    got = options[0] if len(options) == 1 else Alt(tuple(options))
    untrack_ir(got)  # kept by the cache, out of the collector's sight as a grammar's IR is
    return got


def parse_regex(pattern: str, flags: int = 0):
    """IR for strings that `re.fullmatch(pattern, s, flags)` accepts."""
    return _parse(pattern, flags, search=False)


def parse_search_regex(pattern: str, flags: int = 0):
    """IR for strings in which `re.search(pattern, s, flags)` finds a match (JSON Schema),
    with ECMA-262's ASCII \\d and \\w, as JSON Schema's patterns are ECMA-262 regexes."""
    return _parse(pattern, flags, search=True)
