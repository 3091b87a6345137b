"""A generation request as the scheduler sees it: its tokens, its KV and its results."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixflow.runtime.detokenizer import IncrementalDetokenizer
from radixflow.runtime.request_sampler import RequestSampler
from radixflow.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from radixflow.grammars.backends import Grammar, Matcher
    from radixflow.runtime.radix_cache import TreeNode
    from radixflow.runtime.speculative.speculator import SpecState


@dataclass
class LogprobRequest:
    """What logprobs a request wants back."""

    return_logprob: bool = False
    logprob_start_len: int = -1  # first prompt position with input logprobs; -1: none
    top_logprobs_num: int = 0
    token_ids: list[int] | None = None  # token ids whose logprobs every position reports


@dataclass
class KVState:
    """Where a request's KV lives while it runs; written by the CacheManager alone, except
    `rollback`.

    The first `length` fill tokens have K/V, at req_to_token[row, :length], in `pages` (page
    i of the request's tokens is pages[i]). The first `tree_len` of them (page aligned) are
    the radix tree's, locked through `last_node`; the rest, and any page past `length`, are
    the request's own.
    """

    row: int | None = None  # row of req_to_token; None while the request holds no KV
    pages: list[int] = field(default_factory=list)
    length: int = 0
    tree_len: int = 0
    last_node: TreeNode | None = None

    @property
    def held_row(self) -> int:
        """`row`, for a request that holds KV (it is scheduled)."""
        if self.row is None:
            raise RuntimeError("the request holds no req_to_token row")
        return self.row

    def rollback(self, length: int) -> None:
        """Forget the KV past `length` (rejected drafts, a re-tokenized tail); its own pages
        stay its own and are rewritten by the tokens fed next. The tree's part stays: its KV
        is valid and its pages are not the request's to rewrite or free."""
        self.length = max(self.tree_len, min(self.length, length))


@dataclass
class Req:
    """One sequence being generated.

    fill_ids = prompt + output so far. The first `kv.length` of them have K/V in the pool;
    the step that runs it feeds fill_ids[kv.length:], followed by `draft_ids` when
    speculative decoding proposed tokens for it to verify.
    """

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    sampler: RequestSampler
    detokenizer: IncrementalDetokenizer
    logprob: LogprobRequest = field(default_factory=LogprobRequest)
    stream: bool = False
    grammar: Matcher | None = None  # the cursor of a constrained request (any backend)
    # Set while its grammar compiles: the prompt prefills meanwhile, and when the prefill ends
    # first the logits of its first token wait in `deferred_logits` (a copy, [vocab]) to be
    # masked and sampled once the compile is done, without another forward.
    grammar_compiling: Future[Grammar | None] | None = None
    deferred_logits: torch.Tensor | None = None
    output_ids: list[int] = field(default_factory=list)
    kv: KVState = field(default_factory=KVState)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    finish_reason: dict[str, Any] | None = None
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_ids_logprobs: list[list[float]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[float] | None] = field(default_factory=list)
    created: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    retractions: int = 0
    draft_ids: list[int] = field(default_factory=list)  # proposed tokens this step verifies
    spec: SpecState | None = None  # set once the request has speculated
    sample_steps: int = 0  # steps that sampled for this request (speculation on)
    sampled_tokens: int = 0  # tokens those steps appended
    pin_id: str | None = None  # a pin_prefix request: lock its prompt in the tree when done
    pinned_tokens: int = 0

    @property
    def fill_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def fill_ids(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return (self.prompt_ids + self.output_ids + self.draft_ids)[start:end]

    @property
    def remaining(self) -> int:
        """Tokens to feed before the next token can be sampled (1 while decoding)."""
        return self.fill_len - self.kv.length

    @property
    def feedable(self) -> int:
        """Tokens the next step may feed: `remaining`, none while its next token's logits wait
        for its grammar (`deferred_logits`)."""
        return 0 if self.deferred_logits is not None else self.remaining

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def wants_input_logprobs(self) -> bool:
        return self.logprob.return_logprob and self.logprob.logprob_start_len >= 0
