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
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Video,
    to_expr,
)
from radixflow.frontend.program import resolve_backend
from radixflow.runtime.reasoning_parser import REASONING_PARSERS


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
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
            stop_regex=stop_regex,
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


# SGLang's positional order for gen_int / gen_string after `name`
_TYPED_GEN_ORDER = (
    "max_tokens",
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
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


def _typed_gen(dtype: type, name: str | None, args: tuple, kwargs: dict[str, Any]) -> Expr:
    if len(args) > len(_TYPED_GEN_ORDER):
        raise ValueError(f"too many positional arguments: {len(args)}")
    positional = dict(zip(_TYPED_GEN_ORDER, args, strict=False))
    clash = sorted(positional.keys() & kwargs.keys())
    if clash:
        raise ValueError(f"argument(s) given twice: {', '.join(clash)}")
    return gen(name, dtype=dtype, **positional, **kwargs)


def gen_int(name: str | None = None, *args: Any, **kwargs: Any) -> Expr:
    """`gen` constrained to an integer (SGLang's argument order)."""
    return _typed_gen(int, name, args, kwargs)


def gen_string(name: str | None = None, *args: Any, **kwargs: Any) -> Expr:
    """`gen` constrained to a double-quoted string (SGLang's argument order)."""
    return _typed_gen(str, name, args, kwargs)


def image(expr: str) -> Image:
    """An image in the prompt. Running it fails clearly: radixflow serves text-only models."""
    if not isinstance(expr, str):
        raise ValueError(f"image takes a path or URL string, got {type(expr).__name__}")
    return Image(expr)


def video(path: str, num_frames: int) -> Video:
    """A video in the prompt. Running it fails clearly: radixflow serves text-only models."""
    if not isinstance(path, str):
        raise ValueError(f"video takes a path string, got {type(path).__name__}")
    return Video(path, num_frames)


def separate_reasoning(expr: object | None = None, model_type: str | None = None) -> ExprList:
    """Run `expr`, then move the `<think>...</think>` part of each gen it holds from `name`
    into `name_reasoning_content` (and out of the text), as SGLang's does."""
    if model_type not in REASONING_PARSERS:
        raise ValueError(
            f"model_type must be one of {sorted(REASONING_PARSERS)}, got {model_type!r}"
        )
    if expr is None:
        raise ValueError("separate_reasoning needs an expression, e.g. gen('answer')")
    inner = to_expr(expr)
    return ExprList([inner, SeparateReasoning(model_type, inner)])


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
