"""The DSL's public functions, with SGLang's names and arguments."""

from __future__ import annotations

from typing import Any

from radixflow.frontend.backend import Backend
from radixflow.frontend.choices import ChoicesSamplingMethod, token_length_normalized
from radixflow.frontend.ir import (
    Expr,
    ExprList,
    Gen,
    GenArgs,
    RoleBegin,
    RoleEnd,
    Select,
    to_expr,
)
from radixflow.frontend.program import resolve_backend


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    ebnf: str | None = None,
    lark: str | None = None,
) -> Expr:
    """Generate text into variable `name`. Unset knobs take the program's `run` defaults.

    With `choices`, this is `select`. `dtype` (int, float, bool, str) and `regex`,
    `json_schema`, `ebnf`, `lark` constrain the output.
    """
    if choices is not None:
        return select(
            name,
            choices,
            temperature=0.0 if temperature is None else temperature,
            choices_method=choices_method or token_length_normalized,
        )
    return Gen(
        name,
        GenArgs(
            max_new_tokens=max_tokens,
            min_new_tokens=min_tokens,
            n=n,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            dtype=dtype,
            regex=regex,
            json_schema=json_schema,
            ebnf=ebnf,
            lark=lark,
        ),
    )


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen` constrained to an integer."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen` constrained to a double-quoted string."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Expr:
    """Append the best of `choices` (scored by `choices_method`) and store it in `name`."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select needs a non-empty list of non-empty strings, got {choices!r}")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise ValueError(f"choices_method must be a ChoicesSamplingMethod, got {choices_method!r}")
    return Select(name, list(choices), temperature, choices_method)


def _role(role: str, expr: object | None) -> ExprList:
    inner = [] if expr is None else [to_expr(expr)]
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: object | None = None) -> ExprList:
    return _role("system", expr)


def user(expr: object | None = None) -> ExprList:
    return _role("user", expr)


def assistant(expr: object | None = None) -> ExprList:
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def flush_cache(backend: Backend | None = None) -> None:
    resolve_backend(backend).flush_cache()


def get_server_info(backend: Backend | None = None) -> dict[str, Any]:
    return resolve_backend(backend).get_server_info()
