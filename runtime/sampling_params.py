"""Per-request generation knobs, with SGLang's names and defaults, and their validation."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

import regex

# Below this temperature a request is decoded greedily (dividing by it would overflow).
GREEDY_TEMPERATURE = 1e-6
MAX_N = 128
# Smaller repetition penalties divide logits past float range: one token wins forever.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 2.0

_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
)
_STR_FIELDS = ("regex", "ebnf", "lark")
_GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "lark")
# SGLang sampling parameters this server does not implement: a request that sets one gets a
# 400 naming it (null, and the value that means "off", are accepted).
UNSUPPORTED = {
    "structural_tag": "structural tags are not supported; use json_schema, regex or ebnf",
    "custom_params": "custom logit processors are not supported",
    "watermark": "watermarking is not supported",
    "beam_width": "beam search is not supported",
    "stream_interval": "per-request stream intervals are not supported; every step streams",
}
_UNSUPPORTED_OFF = {"beam_width": (1,), "stream_interval": (1,)}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fail(name: str, requirement: str, value: object) -> ValueError:
    return ValueError(f"sampling parameter '{name}' {requirement}, got {value!r}")


@dataclass
class SamplingParams:
    """Everything a request says about how to generate; see SGLang's sampling parameters."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    lark: str | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] | None = None
    stop_regex: str | list[str] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a request's JSON object; unknown keys and wrong types raise ValueError.

        As in SGLang, null means the default and `sampling_seed` is another name for `seed`;
        `logit_bias` keys may be decimal strings (JSON objects only have string keys).
        """
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"sampling parameters must be a dict, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key, value in d.items():
            if key in UNSUPPORTED:
                if value is not None and value not in _UNSUPPORTED_OFF.get(key, ()):
                    raise ValueError(
                        f"sampling parameter {key!r} is not supported by this server: "
                        f"{UNSUPPORTED[key]}"
                    )
            elif key not in names and key != "sampling_seed":
                close = difflib.get_close_matches(str(key), [*names, "sampling_seed"], n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise ValueError(f"unknown sampling parameter {key!r}{hint}")
        kwargs = {k: v for k, v in d.items() if v is not None and k not in UNSUPPORTED}
        if "sampling_seed" in kwargs:
            seed = kwargs.pop("sampling_seed")
            if "seed" in kwargs and kwargs["seed"] != seed:
                raise ValueError("sampling parameters 'sampling_seed' and 'seed' disagree")
            kwargs["seed"] = seed
        bias = kwargs.get("logit_bias")
        if isinstance(bias, dict):
            kwargs["logit_bias"] = {_token_key(k): v for k, v in bias.items()}
        params = cls(**kwargs)
        params.check_types()
        return params

    def check_types(self) -> None:
        """Raise ValueError naming the first field whose value has the wrong type.

        Integers given for float fields become floats; a tuple of stop token ids becomes a list.
        """
        for name in _INT_FIELDS:
            if not _is_int(getattr(self, name)):
                raise _fail(name, "must be an integer", getattr(self, name))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_number(value):
                raise _fail(name, "must be a number", value)
            setattr(self, name, float(value))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, "must be a boolean", getattr(self, name))
        for name in _STR_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise _fail(name, "must be a string", value)
        if self.json_schema is not None and not isinstance(self.json_schema, str | dict):
            raise _fail("json_schema", "must be a JSON string or a dict", self.json_schema)
        if self.seed is not None and not _is_int(self.seed):
            raise _fail("seed", "must be an integer", self.seed)
        for name in ("stop", "stop_regex"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str | list):
                raise _fail(name, "must be a string or a list of strings", value)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list | tuple) or not all(
                _is_int(t) for t in self.stop_token_ids
            ):
                raise _fail("stop_token_ids", "must be a list of integers", self.stop_token_ids)
            self.stop_token_ids = list(self.stop_token_ids)
        if self.logit_bias is not None and not (
            isinstance(self.logit_bias, dict)
            and all(_is_int(k) and _is_number(v) for k, v in self.logit_bias.items())
        ):
            raise _fail("logit_bias", "must map integer token ids to numbers", self.logit_bias)

    def validate(self, vocab_size: int | None = None, context_length: int | None = None) -> None:
        """Raise ValueError naming the field whose value is out of range.

        With `vocab_size`, token ids (stop_token_ids, logit_bias keys) must lie in the vocabulary;
        with `context_length`, max_new_tokens may not exceed it (generation also stops where the
        prompt plus the output fill the context).
        """
        self.check_types()
        if self.max_new_tokens < 0:
            raise _fail("max_new_tokens", "must be >= 0", self.max_new_tokens)
        if context_length is not None and self.max_new_tokens > context_length:
            raise _fail(
                "max_new_tokens",
                f"must be at most the model's context length ({context_length} tokens)",
                self.max_new_tokens,
            )
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise _fail(
                "min_new_tokens",
                f"must be in [0, max_new_tokens={self.max_new_tokens}]",
                self.min_new_tokens,
            )
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise _fail("temperature", "must be a finite number >= 0", self.temperature)
        if not 0 < self.top_p <= 1:
            raise _fail("top_p", "must be in (0, 1]", self.top_p)
        if self.top_k == 0 or self.top_k < -1:
            raise _fail("top_k", "must be -1 (off) or >= 1", self.top_k)
        if not 0 <= self.min_p <= 1:
            raise _fail("min_p", "must be in [0, 1]", self.min_p)
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise _fail(name, "must be in [-2, 2]", getattr(self, name))
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise _fail(
                "repetition_penalty",
                f"must be in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}]",
                self.repetition_penalty,
            )
        if not 1 <= self.n <= MAX_N:
            raise _fail("n", f"must be in [1, {MAX_N}]", self.n)
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise _fail("seed", "must be in [0, 2**64)", self.seed)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not all(isinstance(s, str) and s for s in stops):
            raise _fail("stop", "must hold only non-empty strings", self.stop)
        for pattern in self.stop_regex_patterns:
            _check_stop_regex(pattern)
        for t in self.stop_token_ids or []:
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                raise _fail("stop_token_ids", _id_range(vocab_size), t)
        for t, bias in (self.logit_bias or {}).items():
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                raise _fail("logit_bias", f"keys {_id_range(vocab_size)}", t)
            if not -100 <= bias <= 100:
                raise _fail("logit_bias", "values must be in [-100, 100]", bias)
        given = [name for name in _GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(
                f"sampling parameters {', '.join(repr(g) for g in given)} are mutually "
                "exclusive: give at most one grammar"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_regex_patterns(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    @property
    def grammar(self) -> tuple[str, str | dict[str, Any]] | None:
        """The constraint as (kind, source), kind one of regex/json_schema/ebnf/lark; or None."""
        for name in _GRAMMAR_FIELDS:
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    @property
    def needs_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0
            or self.presence_penalty != 0
            or self.repetition_penalty != 1
        )

    def copy(self, **changes: Any) -> SamplingParams:
        """A copy with `changes` applied (lists and dicts are copied, not shared)."""
        return SamplingParams(**{**dataclasses.asdict(self), **changes})

    def expand(self) -> list[SamplingParams]:
        """The n single-sample copies the engine runs; copy i gets seed + i when a seed is set."""
        return [
            self.copy(n=1, seed=None if self.seed is None else (self.seed + i) % 2**64)
            for i in range(self.n)
        ]


def _check_stop_regex(pattern: object) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise _fail("stop_regex", "must hold only non-empty strings", pattern)
    try:
        compiled = regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise _fail("stop_regex", f"must be a valid regular expression ({exc})", pattern) from None
    if compiled.fullmatch("") is not None:
        # It would match before the first token: the output would always be empty.
        raise _fail("stop_regex", "must not match the empty string", pattern)


def _token_key(key: object) -> object:
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return key


def _id_range(vocab_size: int | None) -> str:
    return "must be >= 0" if vocab_size is None else f"must be in [0, {vocab_size})"
