"""JSON numbers as regex: unbounded integers and numbers, integer and decimal ranges, bounds.

A range becomes a regex of size quadratic in the digits of its bounds at most
(`uint_range_regex`); bounded numbers use no exponent, and their bounds must be integer-valued
finite numbers of at most `MAX_BOUND_DIGITS` digits (`check_numbers` rejects the rest).
"""

from __future__ import annotations

import math

from .regex_ir import parse_regex
from .regex_terms import NEVER

MAX_BOUND_DIGITS = 309  # digits of the largest finite double
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
INTEGER = parse_regex(r"-?(0|[1-9][0-9]*)")
NUMBER = parse_regex(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _any_digits(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _at_least(digits: str) -> list[str]:
    """Alternatives for the digit strings of len(digits) that are >= digits."""
    out = []
    for i, d in enumerate(map(int, digits)):
        rest = len(digits) - i - 1
        if digits[i + 1 :] == "0" * rest:  # digits itself and all above it from here on
            out.append(digits[:i] + _digit_class(d, 9) + _any_digits(rest))
            break
        if d < 9:
            out.append(digits[:i] + _digit_class(d + 1, 9) + _any_digits(rest))
    return out or [""]


def _at_most(digits: str) -> list[str]:
    """Alternatives for the digit strings of len(digits) that are <= digits."""
    out = []
    for i, d in enumerate(map(int, digits)):
        rest = len(digits) - i - 1
        if digits[i + 1 :] == "9" * rest:
            out.append(digits[:i] + _digit_class(0, d) + _any_digits(rest))
            break
        if d > 0:
            out.append(digits[:i] + _digit_class(0, d - 1) + _any_digits(rest))
    return out or [""]


def _digits_range(lo: str, hi: str) -> list[str]:
    """Alternatives (flat: no nesting) for the digit strings of len(lo) in [lo, hi].

    Below the first digit where lo and hi differ, the strings split into those that continue
    lo's digit (>= lo's rest), those with a digit in between (any rest) and those that
    continue hi's digit (<= hi's rest): O(digits) alternatives of O(digits) characters each.
    """
    same = next((i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if a != b), len(lo))
    if same == len(lo):
        return [lo]
    prefix, rest = lo[:same], len(lo) - same - 1
    lo_rest, hi_rest = lo[same + 1 :], hi[same + 1 :]
    first = int(lo[same]) + (lo_rest != "0" * rest)  # digits whose every continuation is in
    last = int(hi[same]) - (hi_rest != "9" * rest)
    out = [] if first == int(lo[same]) else [prefix + lo[same] + a for a in _at_least(lo_rest)]
    if first <= last:
        out.append(prefix + _digit_class(first, last) + _any_digits(rest))
    if last != int(hi[same]):
        out += [prefix + hi[same] + a for a in _at_most(hi_rest)]
    return out


def uint_range_regex(lo: int, hi: int | None) -> str:
    """Regex for non-negative integers (no leading zeros) in [lo, hi]; hi None = unbounded.

    Its size is quadratic in the number of digits at most, and it nests one group deep.
    """
    if hi is not None and hi < lo:
        return "(?!)"
    low = str(lo)
    if hi is not None and len(str(hi)) == len(low):
        return "(" + "|".join(_digits_range(low, str(hi))) + ")"
    parts = _digits_range(low, "9" * len(low))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(low)},}}")
    else:
        high = str(hi)
        if len(high) - len(low) > 1:  # every number of the lengths in between
            parts.append(f"[1-9][0-9]{{{len(low)},{len(high) - 2}}}")
        parts += _digits_range("1" + "0" * (len(high) - 1), high)
    return "(" + "|".join(parts) + ")"


def int_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex for integers (JSON form) in [lo, hi]; None = unbounded."""
    if lo is not None and hi is not None and hi < lo:
        return "(?!)"
    parts = []
    if hi is None or hi >= 0:
        parts.append(uint_range_regex(max(lo or 0, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append(
            "-"
            + uint_range_regex(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)
        )
    return "(" + "|".join(parts) + ")"


_FRAC_ANY = r"(\.[0-9]+)?"
_FRAC_ZERO = r"(\.0+)?"
_FRAC_NONZERO = r"\.[0-9]*[1-9][0-9]*"


def _magnitude_regex(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool) -> list[str]:
    """Regexes for decimal magnitudes m (no sign, no exponent) with lo <(=) m <(=) hi."""
    if hi is not None and (hi < lo or (hi == lo and (lo_excl or hi_excl))):
        return []
    if hi is not None and hi == lo:
        return [str(lo) + _FRAC_ZERO]
    out = [str(lo) + (_FRAC_NONZERO if lo_excl else _FRAC_ANY)]
    if hi is None or hi - 1 >= lo + 1:
        out.append(uint_range_regex(lo + 1, None if hi is None else hi - 1) + _FRAC_ANY)
    if hi is not None and not hi_excl:
        out.append(str(hi) + _FRAC_ZERO)
    return out


def number_range_regex(lo, lo_excl, hi, hi_excl) -> str:
    """Decimal numbers (no exponent) in the range; bounds are ints or None."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        m_lo, m_excl = (0, False) if lo is None or lo < 0 else (lo, lo_excl)
        parts += _magnitude_regex(m_lo, m_excl, hi, hi_excl)
    if lo is None or lo < 0 or (lo == 0 and not lo_excl):
        m_lo, m_excl = (0, False) if hi is None or hi > 0 else (-hi, hi_excl)
        parts += [
            "-" + p for p in _magnitude_regex(m_lo, m_excl, None if lo is None else -lo, lo_excl)
        ]
    return "(" + "|".join(parts) + ")" if parts else "(?!)"


def bounds(schema: dict) -> tuple:
    """(low, low exclusive, high, high exclusive) from the four bound keywords (drafts 4 on)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo_x = hi_x = False
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_lo, bool):  # draft 4
        lo_x = ex_lo
    elif ex_lo is not None and (lo is None or ex_lo >= lo):
        lo, lo_x = ex_lo, True
    if isinstance(ex_hi, bool):
        hi_x = ex_hi
    elif ex_hi is not None and (hi is None or ex_hi <= hi):
        hi, hi_x = ex_hi, True
    return lo, lo_x, hi, hi_x


def integer_ir(schema: dict, where: str):
    """A JSON integer within the schema's bounds."""
    lo, lo_x, hi, hi_x = bounds(schema)
    if lo is None and hi is None:
        return INTEGER
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
    if ilo is not None and ihi is not None and ilo > ihi:
        return NEVER
    return parse_regex(int_range_regex(ilo, ihi))


def number_ir(schema: dict, where: str):
    """A JSON number within the schema's bounds (integer-valued bounds only)."""
    lo, lo_x, hi, hi_x = bounds(schema)
    if lo is None and hi is None:
        return NUMBER
    for b in (lo, hi):
        if b is not None and b != math.floor(b):
            raise ValueError(f"{where}: non-integer bound {b} on a number is not supported")
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    return parse_regex(number_range_regex(lo, lo_x, hi, hi_x))


def check_numbers(schema: dict, where: str) -> None:
    """Raise ValueError unless bounds are finite numbers and counts non-negative integers."""
    for key in BOUNDS:
        value = schema.get(key)
        if value is None or (isinstance(value, bool) and key.startswith("exclusive")):
            continue  # draft 4 writes exclusiveMinimum/exclusiveMaximum as booleans
        if not _is_finite(value):
            raise ValueError(f"{where}: {key} must be a finite number, got {value!r}")
        if abs(value) >= 10**MAX_BOUND_DIGITS:
            raise ValueError(
                f"{where}: {key} has more than {MAX_BOUND_DIGITS} digits (MAX_BOUND_DIGITS)"
            )
    for key in COUNTS:
        value = schema.get(key)
        if value is not None and not (_is_finite(value) and value >= 0 and value == int(value)):
            raise ValueError(f"{where}: {key} must be a non-negative integer, got {value!r}")


def _is_finite(value) -> bool:
    """A JSON number other than Infinity/NaN (which Python's json accepts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)
