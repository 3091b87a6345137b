"""JSON numbers as regex: unbounded integers and numbers, exact decimal ranges, multiples.

Bounds and `multipleOf` mean the decimals they are written as (a float bound 0.1 is 1/10, read
through its shortest repr), not the nearest binary double. Bounded numbers and multiples are
written without exponent, so that the range is decided on the digits, exactly; only a sign
bound (a side of the range that is all numbers >= 0, > 0, <= 0 or < 0) keeps exponents:
- an integer range is a flat alternation of size quadratic in the digits of its bounds at most
  (`uint_range_regex`; bounds of up to `MAX_BOUND_DIGITS` digits, nesting one group deep);
- a number range splits at the bounds' integer parts: a number whose integer part equals a
  bound's compares its fraction with the bound's digit by digit (`_fraction_regex`, at most
  `MAX_FRACTION_DIGITS` digits after the point), one strictly between takes any fraction;
- `multipleOf` q = p / 10**s: a number's digits with the point moved `places` to the right
  (`places` covers q's and the bounds' fraction digits) form an integer X that must be a
  multiple of k = p * 10**(places - s), every digit past `places` being 0 (integers: k =
  p / gcd(p, 10**s), places 0). X is read digit by digit, tracking its remainder mod k and its
  order against the scaled bounds (`_Multiples`: a DAG of IR nodes, shared by the NFA builder,
  at most `MAX_MULTIPLE_NODES` of them and `MAX_MULTIPLE_DIGITS` deep). On a side without a
  bound, leading digits are read with their remainder mod the factor of k prime to 10, a
  cycle turned into IR by state elimination, so that factor may be at most `MAX_CYCLE`;
  otherwise both bounds are needed, and a ValueError says so.
This module keeps the number keywords together (about 550 lines) because the three
constructions share their digit and decimal helpers and `bounds`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal

from .regex_ir import EMPTY, Alt, Chars, Repeat, Seq, literal
from .regex_parse import parse_regex
from .regex_terms import NEVER

MAX_BOUND_DIGITS = 309  # digits of the largest finite double
MAX_FRACTION_DIGITS = 40  # digits after the point of a number's bound or multipleOf
MAX_MULTIPLE_DIGITS = 40  # digits of a multipleOf's scaled bounds and divisor
MAX_MULTIPLE_NODES = 20_000  # IR nodes of one multipleOf construction
# Largest factor prime to 10 of a multipleOf divisor on a side without bound: the eliminated
# cycle's regex grows fast (mod 7: masks up to ~12 ms; mod 9: ~0.4 s; mod 13: > 128 MiB).
MAX_CYCLE = 3
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
INTEGER = parse_regex(r"-?(0|[1-9][0-9]*)")
NUMBER = parse_regex(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _decimal(value) -> Decimal | None:
    """The decimal a JSON number was written as (a float through its shortest repr)."""
    if value is None:
        return None
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _split(d: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of d >= 0, exactly."""
    whole, _, frac = format(d, "f").lstrip("-").partition(".")
    return int(whole), frac.rstrip("0")


def _scaled(d: Decimal, places: int) -> int:
    """d * 10**places, exactly, for d >= 0 with at most `places` fraction digits."""
    whole, frac = _split(d)
    return whole * 10**places + int(frac.ljust(places, "0") or "0")


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
_MAGNITUDE = r"(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_POSITIVE = r"([1-9][0-9]*(\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)([eE][+-]?[0-9]+)?"
# A fraction's digits from some position on, as (may be empty, regex of the non-empty ones).
_Digits = tuple[bool, str | None]


def _optional(empty: bool, text: str | None) -> str | None:
    if text is None:
        return "" if empty else None
    return f"({text})?" if empty else f"({text})"


def _fraction_regex(low: str | None, low_x: bool, high: str | None, high_x: bool) -> str | None:
    """Regex for a fraction text ('' or '.' and digits) whose value f = 0.digits has
    f >= 0.low (f > 0.low if low_x; low None: no bound) and f <= 0.high (f < 0.high if
    high_x; high None: no bound); None when there is none. Strings of O(digits**2) characters.
    """
    k = max(len(low or ""), len(high or ""))
    lo_d, hi_d = (low or "").ljust(k, "0"), (high or "").ljust(k, "0")
    free: _Digits = (True, "[0-9]+")
    nodes: dict[tuple[bool, bool], _Digits] = {  # past position k; key: low, high still tight
        (False, False): free,
        (True, False): (False, "[0-9]*[1-9][0-9]*") if low_x else free,
        (False, True): (False, None) if high_x else (True, "0+"),
        (True, True): (False, None) if low_x or high_x else (True, "0+"),
    }
    for t in range(k - 1, -1, -1):
        zeros_lo, zeros_hi = not lo_d[t:].strip("0"), not hi_d[t:].strip("0")
        step: dict[tuple[bool, bool], _Digits] = {(False, False): free}
        for le, he in ((True, False), (False, True), (True, True)):
            a, b = int(lo_d[t]) if le else 0, int(hi_d[t]) if he else 9
            alts = []
            for first, last, nxt in _digit_splits(a, b, le, he):
                rest = _optional(*nodes[nxt])
                if rest is not None:
                    alts.append(_digit_class(first, last) + rest)
            empty = (not le or (zeros_lo and not low_x)) and (not he or not zeros_hi or not high_x)
            step[(le, he)] = (empty, "|".join(alts) or None)
        nodes = step
    empty, text = nodes[(low is not None, high is not None)]
    return _optional(empty, None if text is None else rf"\.({text})")


def _digit_splits(a: int, b: int, le: bool, he: bool) -> list[tuple[int, int, tuple[bool, bool]]]:
    """Digits a..b grouped by which bounds stay tight after them: (first, last, (low, high))."""
    if a > b:
        return []
    if le and he and a == b:
        return [(a, a, (True, True))]
    out = [(a, a, (True, False))] if le else []
    mid_lo, mid_hi = a + le, b - he
    if mid_lo <= mid_hi:
        out.append((mid_lo, mid_hi, (False, False)))
    return out + ([(b, b, (False, True))] if he else [])


def _magnitude_regex(lo: Decimal, lo_x: bool, hi: Decimal | None, hi_x: bool) -> list[str]:
    """Regexes for decimal magnitudes m (no sign, no exponent) with 0 <= lo <(=) m <(=) hi."""
    if hi is not None and (hi < lo or (hi == lo and (lo_x or hi_x))):
        return []
    if hi is None and lo == 0:  # every magnitude (> 0: a non-zero mantissa), any exponent
        return [_POSITIVE if lo_x else _MAGNITUDE]
    whole_lo, frac_lo = _split(lo)
    low = frac_lo if frac_lo or lo_x else None
    whole_hi, frac_hi = _split(hi) if hi is not None else (None, "")
    if whole_hi == whole_lo:
        f = _fraction_regex(low, lo_x, frac_hi, hi_x)
        return [] if f is None else [str(whole_lo) + f]
    out = []
    f = _fraction_regex(low, lo_x, None, False)
    if f is not None:
        out.append(str(whole_lo) + f)
    if whole_hi is None or whole_hi - 1 >= whole_lo + 1:
        top = None if whole_hi is None else whole_hi - 1
        out.append(uint_range_regex(whole_lo + 1, top) + _FRAC_ANY)
    f = None if whole_hi is None else _fraction_regex(None, False, frac_hi, hi_x)
    if f is not None:
        out.append(str(whole_hi) + f)
    return out


def number_range_regex(lo, lo_x: bool, hi, hi_x: bool) -> str:
    """Decimal numbers (no exponent) in the range; bounds are ints, Decimals or None."""
    lo, hi = _decimal(lo), _decimal(hi)
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_x):
        m_lo, m_x = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_x)
        parts += _magnitude_regex(m_lo, m_x, hi, hi_x)
    if lo is None or lo < 0 or (lo == 0 and not lo_x):
        m_lo, m_x = (Decimal(0), False) if hi is None or hi > 0 else (hi.copy_negate(), hi_x)
        top = None if lo is None else lo.copy_negate()
        parts += ["-" + p for p in _magnitude_regex(m_lo, m_x, top, lo_x)]
    return "(" + "|".join(parts) + ")" if parts else "(?!)"


def _ten_split(k: int) -> tuple[int, int]:
    """(a, m) with k = t * m, t dividing 10**a (a least) and m prime to 10."""
    twos = fives = 0
    while k % 2 == 0:
        k, twos = k // 2, twos + 1
    while k % 5 == 0:
        k, fives = k // 5, fives + 1
    return max(twos, fives), k


def _digit_chars(digits: list[int]) -> Chars:
    ranges: list[tuple[int, int]] = []
    for d in digits:
        if ranges and ranges[-1][1] == 47 + d:
            ranges[-1] = (ranges[-1][0], 48 + d)
        else:
            ranges.append((48 + d, 48 + d))
    return Chars(tuple(ranges))


def _alt(items: list):
    return NEVER if not items else items[0] if len(items) == 1 else Alt(tuple(items))


@dataclass
class _Multiples:
    """JSON numbers that are multiples of `k` / 10**`places`, as a DAG of IR nodes.

    A node reads the `w` digits of X still to come; `c` is the remainder mod k of what was
    read (times its place value), `low`/`high` the bounds' remaining digits while X's prefix
    equals theirs (None once it is above low / below high).
    """

    k: int
    places: int
    integer_only: bool
    label: str  # where and what, for errors
    memo: dict = field(default_factory=dict)

    def signed(self, lo: Decimal | None, lo_x: bool, hi: Decimal | None, hi_x: bool):
        """The multiples in the range (None = unbounded), both signs."""
        if len(str(self.k)) > MAX_MULTIPLE_DIGITS:
            self._refuse(
                f"a divisor of more than {MAX_MULTIPLE_DIGITS} digits (MAX_MULTIPLE_DIGITS)"
            )
        parts = []
        if hi is None or hi > 0 or (hi == 0 and not hi_x):
            m_lo, m_x = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_x)
            parts += self._range(m_lo, m_x, hi, hi_x, 0)
        if lo is None or lo < 0 or (lo == 0 and not lo_x):
            m_lo, m_x = (Decimal(0), False) if hi is None or hi > 0 else (hi.copy_negate(), hi_x)
            top = None if lo is None else lo.copy_negate()
            least = 1 if self.integer_only else 0  # JSON allows -0, but not for integers here
            parts += [Seq((literal("-"), p)) for p in self._range(m_lo, m_x, top, lo_x, least)]
        return _alt(parts)

    def _refuse(self, why: str) -> None:
        raise ValueError(f"{self.label}: not supported: {why}")

    def _range(self, lo: Decimal, lo_x: bool, hi: Decimal | None, hi_x: bool, least: int) -> list:
        """IR alternatives for magnitudes in the range (unsigned)."""
        x_lo = max(_scaled(lo, self.places) + lo_x, least)
        x_hi = None if hi is None else _scaled(hi, self.places) - hi_x
        if len(str(x_lo if x_hi is None else x_hi)) > MAX_MULTIPLE_DIGITS:
            self._refuse(f"bounds of more than {MAX_MULTIPLE_DIGITS} digits (MAX_MULTIPLE_DIGITS)")
        if x_hi is not None and x_hi < x_lo:
            return []
        unit = 10**self.places
        last = len(str((x_lo if x_hi is None else x_hi) // unit))  # integer digits
        out = []
        for n in range(1, last + 1):
            width = n + self.places
            smallest, largest = (0 if n == 1 else 10 ** (width - 1)), 10**width - 1
            lo_n, hi_n = max(x_lo, smallest), largest if x_hi is None else min(x_hi, largest)
            if lo_n <= hi_n:
                low = str(lo_n).zfill(width) if lo_n > smallest else None
                high = str(hi_n).zfill(width) if hi_n < largest else None
                out.append(self._digits(width, 0, low, high, 1 if n > 1 else 0))
        if x_hi is None:
            out += self._unbounded(last + 1)
        return [node for node in out if node is not NEVER]

    def _unbounded(self, n1: int) -> list:
        """Magnitudes with at least n1 integer digits, none of them bounded.

        X's digits at place g and above (a free leading block V) change X mod k only through
        V mod m, the part of k prime to 10: V is read with that remainder (a cycle of m
        states, turned into IR by state elimination), X's last g digits as bounded ones are.
        """
        a, m = _ten_split(self.k)
        if m > MAX_CYCLE:
            self._refuse(
                f"a side without minimum/maximum when the divisor's factor prime to 10 ({m}) "
                f"exceeds {MAX_CYCLE} (MAX_CYCLE); give both bounds"
            )
        g = max(a, self.places)
        if g > MAX_MULTIPLE_DIGITS:
            self._refuse(f"a divisor dividing no power of ten up to 10**{MAX_MULTIPLE_DIGITS}")
        n2 = max(n1, g - self.places + 1)
        out = [self._digits(n + self.places, 0, None, None, 1) for n in range(n1, n2)]
        heads = self._cycle(m, g)  # V's digits past the mandatory ones, by V mod m so far
        for _ in range(n2 + self.places - g - 1):  # V's mandatory digits after the first
            heads = [_alt(self._cycle_step(v, m, heads, 0)) for v in range(m)]
        out.append(_alt(self._cycle_step(0, m, heads, 1)))
        return out

    def _cycle_step(self, v: int, m: int, nxt: list, lead: int) -> list:
        """One digit of V read from remainder v, continued by nxt[the new remainder]."""
        groups: dict[int, list[int]] = {}
        for d in range(lead, 10):
            groups.setdefault((10 * v + d) % m, []).append(d)
        return [Seq((_digit_chars(ds), nxt[u])) for u, ds in groups.items()]

    def _cycle(self, m: int, g: int) -> list:
        """Per remainder v of V so far: any further digits of V, then X's last g digits."""
        eqs = []  # Z_v = sum over u of coeffs[u] Z_u, plus consts; Arden's rule solves them
        for v in range(m):
            groups: dict[int, list[int]] = {}
            for d in range(10):
                groups.setdefault((10 * v + d) % m, []).append(d)
            coeffs = {u: _digit_chars(ds) for u, ds in groups.items()}
            eqs.append((coeffs, [self._digits(g, v * 10**g % self.k, None, None, 0)]))
        for s in range(m):
            coeffs, consts = eqs[s]
            loop = coeffs.pop(s, None)
            if loop is not None:
                star = Repeat(loop, 0, None)
                coeffs = {u: Seq((star, c)) for u, c in coeffs.items()}
                consts = [Seq((star, _alt(consts)))]
                eqs[s] = (coeffs, consts)
            rest = _alt(consts)
            for i, (ci, ki) in enumerate(eqs):
                head = ci.pop(s, None) if i != s else None
                if head is None:
                    continue
                for u, c in coeffs.items():
                    ci[u] = Seq((head, c)) if u not in ci else Alt((ci[u], Seq((head, c))))
                ki.append(Seq((head, rest)))
        return [_alt(consts) for _, consts in eqs]

    def _node(self, key: tuple, build):
        got = self.memo.get(key)
        if got is None:
            if len(self.memo) >= MAX_MULTIPLE_NODES:
                self._refuse(f"more than {MAX_MULTIPLE_NODES} IR nodes (MAX_MULTIPLE_NODES)")
            got = self.memo[key] = build()
        return got

    def _digits(self, w: int, c: int, low: str | None, high: str | None, lead: int):
        """X's integer digits still to read (w > places), then the point and fraction."""
        if w == self.places:
            return self._node(("p", c, low, high), lambda: self._point(c, low, high))

        def child(c2: int, low2: str | None, high2: str | None):
            return self._digits(w - 1, c2, low2, high2, 0)

        key = ("i", w, c, low, high, lead)
        return self._node(key, lambda: _alt(self._step(w, c, low, high, lead, child)))

    def _point(self, c: int, low: str | None, high: str | None):
        out = [EMPTY] if self._done(c, low) else []
        if not self.integer_only:
            frac = self._fraction(self.places, c, low, high, True)
            if frac is not NEVER:
                out.append(Seq((literal("."), frac)))
        return _alt(out)

    def _fraction(self, w: int, c: int, low: str | None, high: str | None, first: bool):
        """Fraction digits still to read (the text may stop where the rest of X is zeros)."""

        def build():
            if w == 0:
                zeros = Repeat(Chars(((48, 48),)), 1 if first else 0, None)
                return zeros if self._done(c, low) else NEVER
            out = [EMPTY] if not first and self._done(c, low) else []

            def child(c2: int, low2: str | None, high2: str | None):
                return self._fraction(w - 1, c2, low2, high2, False)

            return _alt(out + self._step(w, c, low, high, 0, child))

        return self._node(("f", w, c, low, high, first), build)

    def _done(self, c: int, low: str | None) -> bool:
        """Whether X may end here, its remaining digits being zeros."""
        return c == 0 and (low is None or not low.strip("0"))

    def _step(self, w: int, c: int, low: str | None, high: str | None, lead: int, child) -> list:
        """One digit of X, grouped by the node it leads to."""
        a, b = max(int(low[0]) if low else 0, lead), int(high[0]) if high else 9
        weight, room = pow(10, w - 1, self.k), 10 ** (w - 1)
        groups: dict[tuple, list[int]] = {}
        for d in range(a, b + 1):
            c2 = (c + d * weight) % self.k
            if -c2 % self.k >= room:  # the w - 1 digits left cannot add what is missing
                continue
            low2 = low[1:] if low and d == int(low[0]) else None
            high2 = high[1:] if high and d == int(high[0]) else None
            groups.setdefault((c2, low2, high2), []).append(d)
        out = []
        for (c2, low2, high2), digits in groups.items():
            nxt = child(c2, low2, high2)
            if nxt is not NEVER:
                out.append(Seq((_digit_chars(digits), nxt)))
        return out


def bounds(schema: dict) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """(low, low exclusive, high, high exclusive) from the four bound keywords (drafts 4 on)."""
    lo, hi = _decimal(schema.get("minimum")), _decimal(schema.get("maximum"))
    lo_x = hi_x = False
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_lo, bool):  # draft 4
        lo_x = ex_lo and lo is not None
    elif ex_lo is not None and (lo is None or _decimal(ex_lo) >= lo):
        lo, lo_x = _decimal(ex_lo), True
    if isinstance(ex_hi, bool):
        hi_x = ex_hi and hi is not None
    elif ex_hi is not None and (hi is None or _decimal(ex_hi) <= hi):
        hi, hi_x = _decimal(ex_hi), True
    return lo, lo_x, hi, hi_x


def _multiple_of(schema: dict) -> tuple[int, int] | None:
    """multipleOf as (p, s) with multipleOf = p / 10**s, or None."""
    q = _decimal(schema.get("multipleOf"))
    if q is None:
        return None
    whole, frac = _split(q)
    return whole * 10 ** len(frac) + int(frac or "0"), len(frac)


def integer_ir(schema: dict, where: str):
    """A JSON integer within the schema's bounds, a multiple of its multipleOf."""
    lo, lo_x, hi, hi_x = bounds(schema)
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
    if ilo is not None and ihi is not None and ilo > ihi:
        return NEVER
    step = _multiple_of(schema)
    k = 1 if step is None else step[0] // math.gcd(step[0], 10 ** step[1])
    if k > 1:
        label = f"{where}: multipleOf {schema['multipleOf']!r}"
        low, high = _decimal(ilo), _decimal(ihi)
        return _Multiples(k, 0, True, label).signed(low, False, high, False)
    if ilo is None and ihi is None:
        return INTEGER
    return parse_regex(int_range_regex(ilo, ihi))


def number_ir(schema: dict, where: str):
    """A JSON number within the schema's bounds, a multiple of its multipleOf."""
    lo, lo_x, hi, hi_x = bounds(schema)
    step = _multiple_of(schema)
    digits = {
        key: len(_split(value)[1])
        for key, value in (("minimum/exclusiveMinimum", lo), ("maximum/exclusiveMaximum", hi))
        if value is not None
    }
    if step is not None:
        digits["multipleOf"] = step[1]
    for key, n in digits.items():
        if n > MAX_FRACTION_DIGITS:
            raise ValueError(
                f"{where}: {key} has more than {MAX_FRACTION_DIGITS} digits after the point "
                "(MAX_FRACTION_DIGITS)"
            )
    places = max(digits.values(), default=0)
    if step is not None:
        label = f"{where}: multipleOf {schema['multipleOf']!r}"
        k = step[0] * 10 ** (places - step[1])
        return _Multiples(k, places, False, label).signed(lo, lo_x, hi, hi_x)
    if lo is None and hi is None:
        return NUMBER
    return parse_regex(number_range_regex(lo, lo_x, hi, hi_x))


def check_numbers(schema: dict, where: str) -> None:
    """Raise ValueError unless bounds are finite numbers, multipleOf a positive one and counts
    non-negative integers."""
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
    step = schema.get("multipleOf")
    if step is not None and not (_is_finite(step) and step > 0):
        raise ValueError(f"{where}: multipleOf must be a positive finite number, got {step!r}")
    for key in COUNTS:
        value = schema.get(key)
        if value is not None and not (_is_finite(value) and value >= 0 and value == int(value)):
            raise ValueError(f"{where}: {key} must be a non-negative integer, got {value!r}")


def _is_finite(value) -> bool:
    """A JSON number other than Infinity/NaN (which Python's json accepts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)
