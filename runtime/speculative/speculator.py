"""Speculative decoding around the engine step: propose before scheduling, verify after forward.

    propose(running)      decoding requests get req.draft_ids (n-gram lookup, cut where the
                          grammar stops accepting); the scheduler feeds [last, d1..dk]
    forward               one extend over the paged prefix, logits for all k+1 positions
    verify(logits, reqs)  greedy match or lossless rejection sampling -> tokens to append
                          (the engine appends them one by one with its stop checks, then
                          lowers kv_len past the rejected drafts: their KV is never cached)

Requests whose logits the sampler adjusts per token (logit_bias, frequency/presence/repetition
penalties, EOS blocked by min_new_tokens) and requests that return logprobs decode plainly: the
adjustment would change between the k+1 positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixflow.kernels.bitmask import apply_token_bitmask, apply_token_bitmask_ref
from radixflow.runtime.request import Req
from radixflow.runtime.sampler import Sampler, SamplingBatch
from radixflow.runtime.speculative.ngram import NgramIndex
from radixflow.runtime.speculative.verify import verify_greedy, verify_sampled

ACCEPT_EMA = 0.5  # weight of the latest step in a request's running accepted-draft average


@dataclass
class SpecState:
    """A request's proposer state: its n-gram index and adaptive proposal length."""

    k: int  # drafts to propose next time
    accepted_avg: float  # running average of drafts accepted per verify
    index: NgramIndex = field(default_factory=NgramIndex)
    masks: torch.Tensor | None = None  # grammar bitmask of each verified position (with drafts)


def can_speculate(req: Req) -> bool:
    """False for requests whose sampling adjustment changes token by token, or that want logprobs."""
    s = req.sampler
    adjusted = s.bias_ids is not None or s.output_tokens is not None or s.seen_tokens is not None
    return not (adjusted or s.blocks_eos or req.logprob.return_logprob)


class Speculator:
    """N-gram prompt-lookup speculation with batched greedy / rejection-sampling verification."""

    def __init__(
        self,
        *,
        num_tokens: int,
        max_batch: int,
        sampler: Sampler,
        vocab_size: int,
        context_length: int,
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"speculative_num_tokens must be >= 1, got {num_tokens}")
        if max_batch < 1:
            raise ValueError(f"speculative_max_batch must be >= 1, got {max_batch}")
        self.num_tokens = num_tokens
        self.max_batch = max_batch
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.mask_words = (vocab_size + 31) // 32

    # -- before the step ------------------------------------------------------------------------
    def propose(self, running: list[Req]) -> None:
        """Set draft_ids on decoding requests (none when the batch is too large to gain)."""
        if len(running) > self.max_batch:
            return
        for req in running:
            if req.remaining != 1 or not req.output_ids or not can_speculate(req):
                continue
            if req.spec is None:
                req.spec = SpecState(k=self.num_tokens, accepted_avg=float(self.num_tokens))
            state = req.spec
            room = min(
                req.params.max_new_tokens - len(req.output_ids), self.context_length - req.fill_len
            )
            k = min(state.k, room - 1)  # the verify step emits one token beyond the drafts
            if k <= 0:
                continue
            state.index.sync(req.fill_ids(0, req.fill_len))
            drafts = state.index.propose(k)
            if drafts and req.grammar is not None:
                drafts = self._grammar_prefix(req, state, drafts)
            req.draft_ids = drafts

    def _grammar_prefix(self, req: Req, state: SpecState, drafts: list[int]) -> list[int]:
        """The drafts the grammar accepts in a row; records each position's mask for verify."""
        grammar = req.grammar
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
        apply = apply_token_bitmask if logits.is_cuda else apply_token_bitmask_ref
        padded = torch.empty((logits.shape[0], self.mask_words), dtype=torch.int32)
        padded[rows] = masks
        apply(logits, padded.to(logits.device), torch.tensor(rows, device=logits.device))

    def _uniforms(self, req: Req, n: int) -> list[float]:
        generator = req.sampler.generator or self.sampler.generator
        return torch.rand(n, dtype=torch.float64, generator=generator).tolist()

    def _adapt(self, req: Req, accepted: int) -> None:
        """Next proposal length: one more than the recent average of accepted drafts."""
        state = req.spec
        state.accepted_avg = (1 - ACCEPT_EMA) * state.accepted_avg + ACCEPT_EMA * accepted
        state.k = max(1, min(self.num_tokens, round(state.accepted_avg) + 1))
        state.masks = None
