"""Speculative decoding around the engine step: propose before scheduling, verify after forward.

    propose(running)      decoding requests get req.draft_ids from the proposer (n-gram lookup
                          or a draft model), cut where the grammar stops accepting; the
                          scheduler feeds [last, d1..dk]
    forward               one extend over the paged prefix, logits for all k+1 positions
    verify(logits, reqs)  greedy match or lossless rejection sampling -> tokens to append
                          (the OutputProcessor appends them one by one with its stop checks, then
                          rolls req.kv back past the rejected drafts: never cached)

Requests whose logits the sampler adjusts per token (logit_bias, frequency/presence/repetition
penalties, EOS blocked by min_new_tokens) and requests that return logprobs decode plainly: the
adjustment would change between the k+1 positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixflow.grammars import GrammarBudgetExceeded
from radixflow.grammars.backends import Matcher
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.layers.token_bitmask import TokenBitmaskImpl, choose_token_bitmask
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.request import Req
from radixflow.runtime.sampler import Sampler, SamplingBatch
from radixflow.runtime.speculative.draft import DraftProposer
from radixflow.runtime.speculative.ngram import NgramProposer
from radixflow.runtime.speculative.proposer import Proposer
from radixflow.runtime.speculative.verify import verify_greedy, verify_sampled

ACCEPT_EMA = 0.5  # weight of the latest step in a request's running accepted-draft average
# A request whose drafts keep failing (running average below PAUSE_BELOW accepted per verify)
# decodes plainly for a while when its proposer is costly (a draft model's forwards gain
# nothing then). It then tries again with one draft; each failed retry doubles the pause
# (PAUSE_STEPS, 2x, ... up to the proposer's max_pause_steps), an accepted draft resets it.
PAUSE_BELOW = 0.3
PAUSE_STEPS = 8


@dataclass
class SpecState:
    """A request's speculation state: adaptive proposal length and verify masks."""

    k: int  # drafts to propose next time
    accepted_avg: float  # running average of drafts accepted per verify
    proposer_state: Any = None  # what the proposer keeps per request (an NgramIndex)
    paused: int = 0  # steps left without proposals
    pause_len: int = 0  # length of the latest pause; 0 once a draft was accepted since
    masks: torch.Tensor | None = None  # grammar bitmask of each verified position (with drafts)


def can_speculate(req: Req) -> bool:
    """False for requests whose sampling adjustment changes token by token, or that want logprobs."""
    s = req.sampler
    adjusted = s.bias_ids is not None or s.output_tokens is not None or s.seen_tokens is not None
    return not (adjusted or s.blocks_eos or req.logprob.return_logprob)


class Speculator:
    """Speculation with any proposer and batched greedy / rejection-sampling verification."""

    def __init__(
        self,
        proposer: Proposer,
        *,
        num_tokens: int,
        max_batch: int,
        sampler: Sampler,
        vocab_size: int,
        context_length: int,
        token_bitmask: TokenBitmaskImpl,
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"speculative_num_tokens must be >= 1, got {num_tokens}")
        if max_batch < 1:
            raise ValueError(f"speculative_max_batch must be >= 1, got {max_batch}")
        self.proposer = proposer
        self.num_tokens = num_tokens
        self.max_batch = max_batch
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.mask_words = (vocab_size + 31) // 32
        self.token_bitmask = token_bitmask

    # -- before the step ------------------------------------------------------------------------
    def propose(self, running: list[Req]) -> None:
        """Set draft_ids on decoding requests (none when the batch is too large to gain)."""
        if len(running) > self.max_batch:
            return
        reqs, ks = [], []
        for req in running:
            if req.remaining != 1 or not req.output_ids or not can_speculate(req):
                continue
            if req.spec is None:
                req.spec = SpecState(k=self.num_tokens, accepted_avg=float(self.num_tokens))
            if req.spec.paused:
                req.spec.paused -= 1
                continue
            room = min(
                req.params.max_new_tokens - len(req.output_ids), self.context_length - req.fill_len
            )
            k = min(req.spec.k, room - 1)  # the verify step emits one token beyond the drafts
            if k > 0:
                reqs.append(req)
                ks.append(k)
        if not reqs:
            return
        for req, drafts in zip(reqs, self.proposer.propose(reqs, ks), strict=True):
            if drafts and req.grammar is not None:
                drafts = self._grammar_prefix(req, req.spec, drafts)
            req.draft_ids = drafts

    def release(self, req: Req) -> None:
        """The request finished or was aborted: the proposer drops its state for it."""
        self.proposer.release(req)

    def _grammar_prefix(self, req: Req, state: SpecState, drafts: list[int]) -> list[int]:
        """The drafts the grammar accepts in a row; records each position's mask for verify.

        No drafts when the grammar exceeds its budget: its matcher stays failed, so the
        request's plain decode step aborts it.
        """
        grammar = req.grammar
        start = grammar.num_accepted
        try:
            return self._accepted_drafts(grammar, state, drafts)
        except GrammarBudgetExceeded:
            grammar.rollback(grammar.num_accepted - start)
            return []

    def _accepted_drafts(self, grammar: Matcher, state: SpecState, drafts: list[int]) -> list[int]:
        kept = 0
        for token in drafts:
            if not grammar.accept(token):
                break
            kept += 1
        if kept == 0:
            return []
        masks = torch.empty((kept + 1, self.mask_words), dtype=torch.int32)
        for i in range(kept, -1, -1):  # walk back so the matcher ends where it started
            grammar.fill_mask(masks[i])
            if i:
                grammar.rollback(1)
        state.masks = masks
        return drafts[:kept]

    # -- after the forward ----------------------------------------------------------------------
    def verify(self, logits: torch.Tensor, reqs: list[Req]) -> list[list[int]]:
        """Tokens each request emits; `logits` holds len(draft_ids) + 1 rows per request."""
        counts = [len(r.draft_ids) + 1 for r in reqs]
        starts = [sum(counts[:i]) for i in range(len(reqs))]
        if logits.shape[0] != sum(counts):
            raise ValueError(f"verify got {logits.shape[0]} logit rows for {sum(counts)} positions")
        self._mask(logits, reqs, counts, starts)
        results: list[list[int] | None] = [None] * len(reqs)
        greedy = [i for i, r in enumerate(reqs) if r.sampler.greedy]
        if greedy:
            targets = logits.argmax(dim=-1).tolist()
            for i in greedy:
                results[i] = verify_greedy(
                    reqs[i].draft_ids, targets[starts[i] : starts[i] + counts[i]]
                )
        sampled = [i for i, r in enumerate(reqs) if not r.sampler.greedy]
        if sampled:
            rows = [row for i in sampled for row in range(starts[i], starts[i] + counts[i])]
            samplers = [reqs[i].sampler for i in sampled for _ in range(counts[i])]
            batch = SamplingBatch.build(samplers, self.vocab_size, logits.device)
            probs = self.sampler.probs(logits[torch.tensor(rows, device=logits.device)], batch)
            uniforms = [self._uniforms(reqs[i], counts[i]) for i in sampled]
            drafts = [reqs[i].draft_ids for i in sampled]
            for i, tokens in zip(sampled, verify_sampled(probs, drafts, uniforms), strict=True):
                results[i] = tokens
        for req, tokens in zip(reqs, results, strict=True):
            self.proposer.accepted(req, len(tokens) - 1)
            self._adapt(req, len(tokens) - 1)
        return results  # type: ignore[return-value]

    def _mask(
        self, logits: torch.Tensor, reqs: list[Req], counts: list[int], starts: list[int]
    ) -> None:
        constrained = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not constrained:
            return
        masks = torch.cat([reqs[i].spec.masks for i in constrained])
        rows = [row for i in constrained for row in range(starts[i], starts[i] + counts[i])]
        padded = torch.empty((logits.shape[0], self.mask_words), dtype=torch.int32)
        padded[rows] = masks
        self.token_bitmask.apply(
            logits, padded.to(logits.device), torch.tensor(rows, device=logits.device)
        )

    def _uniforms(self, req: Req, n: int) -> list[float]:
        generator = req.sampler.generator or self.sampler.generator
        return torch.rand(n, dtype=torch.float64, generator=generator).tolist()

    def _adapt(self, req: Req, accepted: int) -> None:
        """Next proposal length: one more than the recent average of accepted drafts."""
        state = req.spec
        state.accepted_avg = (1 - ACCEPT_EMA) * state.accepted_avg + ACCEPT_EMA * accepted
        state.k = max(1, min(self.num_tokens, round(state.accepted_avg) + 1))
        if accepted:
            state.pause_len = 0
        if state.accepted_avg < PAUSE_BELOW and self.proposer.max_pause_steps:
            longest = self.proposer.max_pause_steps
            state.pause_len = min(longest, 2 * state.pause_len or PAUSE_STEPS)
            state.paused = state.pause_len
        state.masks = None


def build_speculator(
    config: EngineConfig, target: ModelRunner, tokenizer, sampler: Sampler
) -> Speculator | None:
    """The speculator config.speculative_algorithm asks for (None for "none")."""
    if config.speculative_algorithm == "none":
        return None
    if config.speculative_algorithm == "ngram":
        proposer: Proposer = NgramProposer()
    else:
        proposer = DraftProposer.load(config, target, tokenizer)
    return Speculator(
        proposer,
        num_tokens=config.speculative_num_tokens,
        max_batch=config.speculative_max_batch,
        sampler=sampler,
        vocab_size=target.vocab_size,
        context_length=target.context_length,
        token_bitmask=choose_token_bitmask(target.device),
    )
