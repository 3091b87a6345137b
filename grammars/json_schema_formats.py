"""String `format`s as regexes over code points (`FORMATS`), each within what `jsonschema` accepts.

Each language is a subset of what `jsonschema`'s draft 2020-12 format checker accepts with the
`jsonschema[format]` extras (rfc3987, fqdn, rfc3339-validator, jsonpointer), so a generated
string always validates; each covers what values commonly hold, and what one leaves out (a
URI's IP-literal host, most of `re`'s syntax) is said where it is written. `MAX_LENGTH`
holds what a regex does not say (`hostname`'s length cap). Formats not listed are annotations
(any string).
"""

from __future__ import annotations

# Year 0000 is no date (`date.fromisoformat`, rfc3339-validator).
_YEAR = r"([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"


def _ipv6() -> str:
    """RFC 3986's IPv6address: eight 16-bit groups, the last two maybe an IPv4 address, or at
    most seven of them around one `::`."""
    ls32 = rf"({_H16}:{_H16}|{_IPV4})"

    def right(n: int) -> str:  # n groups after the `::`
        return "" if n == 0 else _H16 if n == 1 else rf"({_H16}:){{{n - 2}}}{ls32}"

    def left(n: int) -> str:  # at most n groups before it
        return "" if n == 0 else rf"(({_H16}:){{0,{n - 1}}}{_H16})?"

    forms = [rf"({_H16}:){{6}}{ls32}"] + [f"{left(7 - n)}::{right(n)}" for n in range(8)]
    return f"({'|'.join(forms)})"


_IPV6 = _ipv6()
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(\.{_LABEL})*"

# RFC 3987's ucschar and iprivate, as rfc3987 writes them.
_UCSCHAR = (
    r"\xA0-\uD7FF\uF900-\uFDCF\uFDF0-\uFFEF"
    + "".join(rf"\U{p:04X}0000-\U{p:04X}FFFD" for p in range(1, 14))
    + r"\U000E1000-\U000EFFFD"
)
_IPRIVATE = r"\uE000-\uF8FF\U000F0000-\U000FFFFD\U00100000-\U0010FFFD"
_UNRESERVED = r"A-Za-z0-9\-._~"


def _uri(unreserved: str, private: str, relative: bool) -> str:
    """RFC 3986's URI (RFC 3987's IRI with `unreserved` widened to iunreserved and `private`
    in the query); with `relative`, URI-reference (IRI-reference). A host is a reg-name (an
    IPv4address is one); IP-literals (`http://[::1]/`) are left out: their IPv6 forms would
    make the automaton ten times larger, which every walk through a URI would pay for."""
    pct = "%[0-9A-Fa-f]{2}"
    sub = "!$&'()*+,;="

    def one_of(extra: str) -> str:
        return f"([{unreserved}{sub}{extra}]|{pct})"

    pchar, segment = one_of(":@"), f"{one_of(':@')}*"
    authority = rf"({one_of(':')}*@)?{one_of('')}*(:[0-9]*)?"
    tail = rf"(\?{one_of(':@/?' + private)}*)?(#{one_of(':@/?')}*)?"
    rooted = rf"//{authority}(/{segment})*|/({pchar}+(/{segment})*)?"
    uri = rf"[A-Za-z][A-Za-z0-9+.\-]*:({rooted}|{pchar}+(/{segment})*|){tail}"
    if not relative:
        return uri
    return rf"({uri}|({rooted}|{one_of('@')}+(/{segment})*|){tail})"


_POINTER = r"(/([^/~]|~[01])*)*"
# jsonschema rejects any digit after a 0 ("0", "10", "120" pass; "100", "406" do not).
_RELATIVE_START = r"(0|[1-9]+0?)"

# `format: regex` is checked with Python's `re.compile`, whose language is not regular. This
# is a regular part of it: literals, `.`, anchors, escapes of classes and punctuation, classes
# (no nested-set lookalikes: `[`, `--`, `&&`, `~~`, `||`), groups nested up to `_REGEX_DEPTH`
# deep, `|`, and one quantifier (lazy or not) after something repeatable. No back-references,
# look-arounds, flags or possessive quantifiers. Each depth repeats the automaton of a class
# and of a count, so ranges and `{n,m}` are cut to what a DFA tells apart in a few states.
_REGEX_DEPTH = 3
_ESCAPES = r"\\([dDwWsSntrfv]|[ -/:-@\[-`{-~])"
# A digit to a digit not below it, a to a lowercase letter, A to an uppercase one.
_RANGES = "|".join(f"{lo}-[{lo}-9]" for lo in range(10)) + "|a-[a-z]|A-[A-Z]"
_CLASS_ITEM = rf"([^\\\]\[\-&~|^]|{_ESCAPES}|{_RANGES})"
_ATOM = rf"([^\\.^$*+?{{}}\[\]()|]|\.|{_ESCAPES}|\[\^?(-?{_CLASS_ITEM}+-?|-)\])"


def _counts() -> str:
    """`{n}` and `{n,}` up to 999, and `{n,m}` with n <= m <= 999 where n has one digit, or m
    more digits than n or a larger tens digit (`{2,8}`, `{8,255}`, `{16,32}`; not `{10,15}`)."""
    one = "|".join(f"{n},[{n}-9]" for n in range(10))
    tens = "|".join(f"{a}[0-9],[{a + 1}-9][0-9]" for a in range(1, 9))
    longer = "[0-9],[1-9][0-9]{1,2}|[1-9][0-9],[1-9][0-9]{2}"
    return rf"\{{((0|[1-9][0-9]{{0,2}}),?|{one}|{tens}|{longer})\}}"


def _python_regex() -> str:
    """`_ATOM`s, each maybe quantified, anchors and `|`s, in groups up to `_REGEX_DEPTH` deep."""
    quantifier = rf"([*+?]|{_counts()})\??"

    def alternation(atom: str) -> str:
        return rf"({atom}({quantifier})?|\^|\$|\\[bBAZ]|\|)*"

    out = alternation(_ATOM)
    for _ in range(_REGEX_DEPTH):
        out = alternation(rf"({_ATOM}|\((\?:)?{out}\))")
    return out


FORMATS = {
    "date-time": rf"{_DATE}T{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "email": rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_HOSTNAME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": _uri(_UNRESERVED, "", relative=False),
    "uri-reference": _uri(_UNRESERVED, "", relative=True),
    "iri": _uri(_UNRESERVED + _UCSCHAR, _IPRIVATE, relative=False),
    "iri-reference": _uri(_UNRESERVED + _UCSCHAR, _IPRIVATE, relative=True),
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "json-pointer": _POINTER,
    "relative-json-pointer": rf"{_RELATIVE_START}(#|{_POINTER})",
    "regex": _python_regex(),
}
# fqdn's limit on a hostname's length (a trailing dot, which the regex leaves out, would not
# count). The IR of a length bound is a counted automaton that cannot be intersected again, so
# a cap joins the schema's own `maxLength` (`capped`) rather than the format's regex.
MAX_LENGTH = {"hostname": 253}


def capped(fmt: str | None, hi: int | None) -> int | None:
    """The bound `hi` on a string's length (None: no bound) with format `fmt`'s cap applied."""
    cap = MAX_LENGTH.get(fmt) if fmt is not None else None
    return hi if cap is None else cap if hi is None else min(hi, cap)
