"""The typed messages between the server (or a caller of `Engine.generate`) and the engine.

    text | input_ids, one or a batch ─► GenerateInput.build ─► [GenerateItem, ...]
    sampling params (dict or list)        validated once       one per (prompt, sample): n=1,
    logprob options, rid, stream                                seed+i, its rid and its name

`FinishReason` is how a request ended (SGLang's dict is its wire form) and `EngineStats` a
snapshot of the engine's load and counters for metrics and `/get_server_info`.
"""

from __future__ import annotations

import enum
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from radixflow.runtime.model_loader import with_defaults
from radixflow.runtime.request import LogprobRequest
from radixflow.runtime.sampling_params import SamplingParams


class InputError(ValueError):
    """A request field is invalid; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


# -- finish reasons -----------------------------------------------------------------------------
class AbortCause(enum.Enum):
    """Why an aborted request stopped, with the HTTP status and error type it answers with."""

    REQUEST = (400, "request_failed")  # the request's own fault: grammar budget, KV too small
    CANCELLED = (503, "request_aborted")  # a client abort or the engine shutting down
    ENGINE = (500, "engine_error")  # the engine failed

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def err_type(self) -> str:
        return self.value[1]


@dataclass(frozen=True)
class FinishReason:
    """How a request finished; `to_dict()` is SGLang's `meta_info["finish_reason"]`."""

    kind: Literal["stop", "length", "abort"]
    matched: int | str | None = None  # stop: the token id, stop string or stop regex matched
    length: int | None = None  # length: the limit reached
    message: str | None = None  # abort: what happened
    cause: AbortCause = AbortCause.REQUEST  # abort: whose fault

    @classmethod
    def stop(cls, matched: int | str | None) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def limit(cls, length: int) -> FinishReason:
        return cls("length", length=length)

    @classmethod
    def abort(cls, message: str, cause: AbortCause = AbortCause.REQUEST) -> FinishReason:
        return cls("abort", message=message, cause=cause)

    @property
    def engine_failed(self) -> bool:
        return self.kind == "abort" and self.cause is AbortCause.ENGINE

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.kind == "length":
            return {"type": "length", "length": self.length}
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.cause.status,
            "err_type": self.cause.err_type,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FinishReason:
        """Read SGLang's dict back (an abort without `err_type` is the request's own fault)."""
        kind = d["type"]
        if kind == "stop":
            return cls.stop(d.get("matched"))
        if kind == "length":
            return cls.limit(d["length"])
        if kind != "abort":
            raise ValueError(f"unknown finish_reason type {kind!r}")
        causes = {c.err_type: c for c in AbortCause}
        cause = causes.get(d.get("err_type") or "", AbortCause.REQUEST)
        return cls.abort(d.get("message") or "the request was aborted", cause)


# -- engine statistics --------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load and of its counters since start."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_pages_total: int
    kv_pages_free: int
    page_size: int
    grammar_cache_bytes: int
    counters: dict[str, int] = field(default_factory=dict)  # Engine.stats at snapshot time

    @property
    def kv_pages_used(self) -> int:
        return self.kv_pages_total - self.kv_pages_free

    @property
    def kv_tokens_used(self) -> int:
        return self.kv_pages_used * self.page_size

    @property
    def token_usage(self) -> float:
        """Fraction of the KV pool in use."""
        return self.kv_pages_used / max(self.kv_pages_total, 1)

    @property
    def cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over finished requests."""
        return self.counters.get("cached_tokens", 0) / max(1, self.counters.get("prompt_tokens", 0))

    @property
    def pinned_tokens(self) -> int:
        return self.counters.get("pinned_tokens", 0)

    @property
    def spec_accept_length(self) -> float:
        """Tokens emitted per speculative verify step (accepted drafts + 1)."""
        steps = max(self.counters.get("spec_verify_steps", 0), 1)
        return 1 + self.counters.get("spec_accepted_tokens", 0) / steps

    @property
    def spec_accept_rate(self) -> float:
        drafts = max(self.counters.get("spec_draft_tokens", 0), 1)
        return self.counters.get("spec_accepted_tokens", 0) / drafts


# -- requests -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputLimits:
    """What an engine accepts: its vocabulary, context and the model's sampling defaults."""

    vocab_size: int
    model_context_length: int
    context_length: int  # the model's, capped by the KV pool
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def check_prompt(self, ids: object) -> None:
        """Raise ValueError unless `ids` is a prompt the engine can run: non-empty, in the
        vocabulary, and short enough to leave room for a generated token."""
        if not isinstance(ids, list) or not ids:
            raise ValueError("prompt is empty")
        if not all(is_token_id(t, self.vocab_size) for t in ids):
            raise ValueError(f"input_ids must be integers in [0, {self.vocab_size})")
        if len(ids) < self.context_length:
            return
        if self.context_length < self.model_context_length:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) and one generated token do not fit the KV pool, "
                f"which holds {self.context_length} tokens (raise max_total_tokens)"
            )
        raise ValueError(
            f"the prompt ({len(ids)} tokens) is longer than the model's context length "
            f"({self.context_length} tokens)"
        )

    def sampling_params(self, raw: Any) -> SamplingParams:
        """Parse and validate one prompt's sampling params over the model's defaults."""
        params = SamplingParams.from_dict(with_defaults(self.sampling_defaults, raw))
        params.validate(self.vocab_size, self.model_context_length)
        return params

    def logprob(
        self,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> LogprobRequest:
        """Validated logprob options (None: SGLang's defaults, no input logprobs)."""
        if top_logprobs_num is not None and top_logprobs_num < 0:
            raise InputError(
                f"top_logprobs_num must be >= 0, got {top_logprobs_num}", "top_logprobs_num"
            )
        if token_ids_logprob is not None and not all(
            is_token_id(t, self.vocab_size) for t in token_ids_logprob
        ):
            raise InputError(
                f"token_ids_logprob must be integers in [0, {self.vocab_size})",
                "token_ids_logprob",
            )
        return LogprobRequest(
            return_logprob=bool(return_logprob),
            logprob_start_len=-1 if logprob_start_len is None else int(logprob_start_len),
            top_logprobs_num=int(top_logprobs_num or 0),
            token_ids=None if token_ids_logprob is None else list(token_ids_logprob),
        )


@dataclass
class GenerateItem:
    """One engine request: a validated prompt, n=1 params, logprob options, its engine rid and
    the name responses show for it (the rid itself, unless the server hides engine rids)."""

    input_ids: list[int]
    params: SamplingParams
    prompt_index: int
    rid: str
    name: str
    logprob: LogprobRequest | None = None  # None: the caller's default for the whole input


@dataclass
class GenerateInput:
    """One generate call, normalised: its items in (prompt, sample) order, whether the caller
    gave a batch, whether it streams, and the item names each client rid stands for."""

    items: list[GenerateItem]
    batched: bool
    stream: bool = False
    groups: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        prompts: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None,
        limits: InputLimits,
        *,
        batched: bool,
        rid: str | list[str] | None = None,
        logprobs: list[LogprobRequest | None] | None = None,
        stream: bool = False,
        prompt_field: str = "input_ids",
        private_rids: bool = False,
        max_items: int | None = None,
    ) -> GenerateInput:
        """Validate every prompt and its params, expand `n` and name each item.

        With `private_rids` (the server) engine rids are random and a client rid only names
        items (`R`, or `R-0`, `R-1`, ... for several); otherwise the rid is the engine rid
        (`R`, `R-i` per prompt, `R-i-j` per sample). Errors are `InputError`s naming the field,
        or ValueErrors of `SamplingParams` naming theirs.
        """
        if batched and not prompts:
            raise InputError("the batch is empty", prompt_field)
        for ids in prompts:
            try:
                limits.check_prompt(ids)
            except ValueError as exc:
                raise InputError(f"{prompt_field}: {exc}", prompt_field) from None
        raw_params: Sequence[dict[str, Any] | None]
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise InputError(
                    f"sampling_params has {len(sampling_params)} entries for {len(prompts)} "
                    "prompts",
                    "sampling_params",
                )
            raw_params = sampling_params
        else:
            raw_params = [sampling_params] * len(prompts)
        samples = [limits.sampling_params(p).expand() for p in raw_params]
        total = sum(len(s) for s in samples)
        if max_items is not None and total > max_items:
            raise InputError(
                f"this request asks for {total} generations (prompts x n); this server runs "
                f"at most {max_items} per call (--max-requests-per-call)",
                "n",
            )
        if stream and not private_rids and total != 1:
            raise InputError("stream=True takes a single prompt with n=1", "stream")
        if logprobs is not None and len(logprobs) != len(prompts):
            raise InputError(
                f"logprob options for {len(logprobs)} of {len(prompts)} prompts", "return_logprob"
            )
        items = [
            GenerateItem(list(ids), sp, i, "", "", None if logprobs is None else logprobs[i])
            for i, (ids, copies) in enumerate(zip(prompts, samples, strict=True))
            for sp in copies
        ]
        sizes = [len(s) for s in samples]
        if private_rids:
            groups = _client_groups(rid, sizes)
            names = [name for g in groups.values() for name in g]
            for item, name in zip(items, names, strict=True):
                item.name, item.rid = name, secrets.token_hex(16)
        else:
            groups = {}
            names = _engine_rids(rid, sizes)
            for item, name in zip(items, names, strict=True):
                item.name = item.rid = name
        return cls(items, batched, stream, groups)


def _engine_rids(rid: str | list[str] | None, sizes: list[int]) -> list[str]:
    """`rid` for one item; `rid-i` per prompt, `-j` per sample; random when not given."""
    if rid is not None and not isinstance(rid, str):
        raise InputError("rid must be a string", "rid")
    names = []
    for i, k in enumerate(sizes):
        base = rid if rid is not None and len(sizes) == 1 else None
        base = base or (f"{rid}-{i}" if rid is not None else uuid.uuid4().hex)
        names.extend([base] if k == 1 else [f"{base}-{j}" for j in range(k)])
    return names


def _client_groups(rid: str | list[str] | None, sizes: list[int]) -> dict[str, list[str]]:
    """Client rid -> item names: `R` for a lone item, `R-0`, `R-1`, ... for several."""
    if isinstance(rid, list):
        if len(rid) != len(sizes) or not all(isinstance(r, str) and r for r in rid):
            raise InputError("rid must hold one non-empty string per prompt", "rid")
        if len(set(rid)) != len(rid):
            raise InputError("rid values must be distinct", "rid")
        return {
            r: [r] if k == 1 else [f"{r}-{j}" for j in range(k)]
            for r, k in zip(rid, sizes, strict=True)
        }
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise InputError("rid must be a non-empty string", "rid")
    key = rid or uuid.uuid4().hex
    total = sum(sizes)
    return {key: [key] if total == 1 else [f"{key}-{i}" for i in range(total)]}


def is_token_id(t: object, vocab_size: int) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
