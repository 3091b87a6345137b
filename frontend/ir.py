"""The expressions a program appends to its state (`s += ...`) and the sampling knobs of `gen`.

Expressions are plain data; the interpreter (interpreter.py) gives them meaning. `a + b` of
expressions (or of an expression and a string) is an `ExprList` that runs them in order.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

# SGLang's regexes for typed `gen(dtype=...)`; the string form avoids `.` inside quotes.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_REGEX = {
    int: REGEX_INT,
    "int": REGEX_INT,
    float: REGEX_FLOAT,
    "float": REGEX_FLOAT,
    bool: REGEX_BOOL,
    "bool": REGEX_BOOL,
    str: REGEX_STR,
    "str": REGEX_STR,
    "string": REGEX_STR,
}


@dataclass
class GenArgs:
    """Sampling knobs of one `gen`, or a program's defaults for them; None means "not set"."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: Any = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    lark: str | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None:
            if self.dtype not in _DTYPE_REGEX:
                raise ValueError(
                    f"gen dtype must be one of int, float, bool, str, got {self.dtype!r}"
                )
            if self.constraint_fields():
                raise ValueError(
                    "gen takes either dtype or a regex/json_schema/ebnf/lark, not both"
                )
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"gen regex {self.regex!r} is not a valid regex: {exc}") from exc
        if len(self.constraint_fields()) > 1:
            raise ValueError(
                f"gen takes at most one constraint, got {', '.join(self.constraint_fields())}"
            )

    def constraint_fields(self) -> list[str]:
        return [k for k in ("regex", "json_schema", "ebnf", "lark") if getattr(self, k) is not None]

    def merged_over(self, defaults: GenArgs) -> GenArgs:
        """These args with every unset field taken from `defaults`."""
        values = {}
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            values[f.name] = getattr(defaults, f.name) if mine is None else mine
        return GenArgs(**values)

    def sampling_params(self) -> dict[str, Any]:
        """The engine's sampling_params dict (SGLang names), set fields only; dtype -> regex."""
        names = (
            "max_new_tokens",
            "min_new_tokens",
            "n",
            "stop",
            "stop_token_ids",
            "stop_regex",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "ignore_eos",
            "regex",
            "json_schema",
            "ebnf",
            "lark",
        )
        params = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        if self.dtype is not None:
            params["regex"] = _DTYPE_REGEX[self.dtype]
            if _DTYPE_REGEX[self.dtype] in (REGEX_INT, REGEX_FLOAT):
                # as SGLang: a number ends at the first space or newline, which the regex's
                # trailing [ \n]* would otherwise repeat until max_new_tokens
                stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
                params["stop"] = [*stop, *(s for s in (" ", "\n") if s not in stop)]
        return params


class Expr:
    """Something a program appends to its state."""

    def __add__(self, other: object) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: object) -> ExprList:
        return ExprList([to_expr(other), self])


@dataclass(eq=False)
class ExprList(Expr):
    exprs: list[Expr]

    def __post_init__(self) -> None:
        flat: list[Expr] = []
        for e in self.exprs:
            flat.extend(e.exprs if isinstance(e, ExprList) else [e])
        self.exprs = flat


@dataclass(eq=False)
class Text(Expr):
    value: str


@dataclass(eq=False)
class Gen(Expr):
    name: str | None
    args: GenArgs = field(default_factory=GenArgs)


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float
    method: Any  # a ChoicesSamplingMethod


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class Image(Expr):
    """An image in the prompt (`image(path)`); radixflow's models are text-only."""

    path: str


@dataclass(eq=False)
class Video(Expr):
    """A video in the prompt (`video(path, num_frames)`); radixflow's models are text-only."""

    path: str
    num_frames: int


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After `expr` ran: move the `<think>` part of each of its gens into `<name>_reasoning_content`."""

    model_type: str
    expr: Expr


@dataclass(eq=False)
class ConcatAndAppend(Expr):
    """Append the text each of `states` added since it forked (join mode concate_and_append)."""

    states: list[Any]


def to_expr(value: object) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(
        f"a program can append strings and radixflow expressions, not {type(value).__name__}"
    )
