"""The one interface every backend (Runtime, RuntimeEndpoint, OpenAI) gives the interpreter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixflow.frontend.chat_template import ChatTemplate
from radixflow.frontend.choices import ChoicesDecision, ChoicesSamplingMethod, TokenLogprobs
from radixflow.frontend.ir import GenArgs


class RequestError(RuntimeError):
    """A backend request failed (aborted, rejected, or asked for what the backend cannot do)."""


@dataclass
class Prompt:
    """What a gen/select continues: the state's text, plus its messages for chat-only APIs."""

    text: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    role: str | None = None  # the role open at this point, if any
    role_text: str = ""  # what that role holds so far


class Backend(ABC):
    """Runs the model calls of a program. One backend serves many states concurrently."""

    chat_template: ChatTemplate

    @abstractmethod
    def generate(self, prompt: Prompt, args: GenArgs) -> tuple[str | list[str], dict[str, Any]]:
        """The completion (a list when args.n > 1) and its meta info."""

    @abstractmethod
    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        """Text increments; the last item carries the meta info, the others None."""

    @abstractmethod
    def select(
        self, prompt: Prompt, choices: list[str], temperature: float, method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        """Score every choice as a continuation of the prompt and let `method` decide."""

    @abstractmethod
    def pin_prefix(self, text: str) -> Any:
        """Compute and cache the KV of `text` so later requests sharing it skip it. Returns a
        handle that keeps it cached until `unpin_prefix`, or None where the backend can only
        hint (the cache may then evict it)."""

    def unpin_prefix(self, handle: Any) -> None:
        """Release what `pin_prefix` returned (None, from a backend that only hints, needs
        nothing); backends that pin override this."""
        if handle is not None:
            raise TypeError(f"{type(self).__name__} pins nothing, yet got the pin {handle!r}")

    def cache_prefix(self, prefix: str) -> None:
        """SGLang's `cache_prefix`: compute `prefix` once so later requests can reuse it (a
        hint: the cache may evict it later)."""
        self.unpin_prefix(self.pin_prefix(prefix))

    @abstractmethod
    def flush_cache(self) -> None:
        """Drop every cached prefix."""

    @abstractmethod
    def get_server_info(self) -> dict[str, Any]:
        """What the backend serves, and its counters."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release what the backend holds."""


def request_options(args: GenArgs) -> dict[str, Any]:
    """The request-level (not sampling) options of a gen, in SGLang's names."""
    options: dict[str, Any] = {}
    if args.return_logprob:
        options["return_logprob"] = True
        if args.logprob_start_len is not None:
            options["logprob_start_len"] = args.logprob_start_len
        if args.top_logprobs_num:
            options["top_logprobs_num"] = args.top_logprobs_num
    return options


def checked(out: dict[str, Any]) -> dict[str, Any]:
    """`out` if its request finished normally; a RequestError saying why it did not."""
    reason = out["meta_info"].get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise RequestError(f"request aborted: {reason.get('message', 'no reason given')}")
    return out


def completion_result(outs: list[dict[str, Any]]) -> tuple[str | list[str], dict[str, Any]]:
    """SGLang's gen result: one text and its meta, or (n > 1) a list of texts and of metas."""
    outs = [checked(o) for o in outs]
    if len(outs) == 1:
        return outs[0]["text"], outs[0]["meta_info"]
    return [o["text"] for o in outs], {"n": [o["meta_info"] for o in outs]}


def with_token_text(meta: dict[str, Any], decode: Callable[[int], str]) -> dict[str, Any]:
    """Fill the text slot of every (logprob, token_id, text) tuple in a meta info."""
    for key in ("input_token_logprobs", "output_token_logprobs"):
        if key in meta:
            meta[key] = [(lp, t, decode(t)) for lp, t, *_ in meta[key]]
    for key in ("input_top_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = [
                None if row is None else [(lp, t, decode(t)) for lp, t, *_ in row]
                for row in meta[key]
            ]
    return meta


# meta_info lists with one entry per output token: a stream chunk carries only its own
PER_TOKEN_META = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


@dataclass
class StreamSlicer:
    """Turns a stream of cumulative outputs into (new text, meta info of this chunk): the
    per-output-token lists keep only the new tokens' entries, as SGLang's streams send them.
    Lists a server already sent incrementally (shorter than `output_token_logprobs_length`)
    pass through. `incremental`: each chunk's text is already only its new text (a server run
    with --incremental-streaming-output)."""

    incremental: bool = False
    text_sent: int = 0
    tokens_sent: int = 0

    def step(self, text: str, meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.incremental:  # text and per-token lists are this chunk's own already
            self.text_sent += len(text)
            return text, dict(meta)
        delta = text[self.text_sent :]
        self.text_sent = max(self.text_sent, len(text))
        meta = dict(meta)
        total = meta.get("output_token_logprobs_length")
        if total is not None:
            for key in PER_TOKEN_META:
                if key in meta and len(meta[key]) == total:
                    meta[key] = meta[key][self.tokens_sent :]
            self.tokens_sent = total
        return delta, meta


def as_token_logprobs(entries: list[Any]) -> TokenLogprobs:
    """Normalise (logprob, id, text?) entries (tuples or JSON lists) to tuples."""
    return [(e[0], int(e[1]), e[2] if len(e) > 2 else None) for e in entries]


def without_context(ids: list[int], entries: list[Any]) -> TokenLogprobs:
    """Logprobs of `ids` scored on their own: the first token has none (nothing before it);
    the rest are the last len(ids) - 1 entries the server returned."""
    rest = as_token_logprobs(entries)[len(entries) - (len(ids) - 1) :] if len(ids) > 1 else []
    return [(None, ids[0], None), *rest]


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
