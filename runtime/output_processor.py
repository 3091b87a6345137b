"""The tail of an engine step: from the forward's logits to finished and streaming requests.

    LogitRows.plan(step)          before the forward: which token rows need logits
    process(step, rows, logits)   input logprobs ─► sample (grammar-masked) or verify drafts
                                  ─► append token by token with stop checks ─► jump forward
                                  ─► StepOutcome(finished, streamed, stats)

The processor changes only the requests of the step (their output ids, logprobs, grammar
cursor, sampler state); it never touches the scheduler, sinks or counters: the engine retires
what `process` returns as finished, streams what it returns as streamed and adds the stats.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from radixflow.grammars import GrammarBudgetExceeded
from radixflow.runtime.constrained import GrammarService, budget_abort
from radixflow.runtime.detokenizer import StopRegexTimeout
from radixflow.runtime.io_struct import FinishReason
from radixflow.runtime.jump_forward import jump_forward
from radixflow.runtime.logprobs import logprob_meta, record_input_logprobs, record_output_logprobs
from radixflow.runtime.request import Req
from radixflow.runtime.sampler import Sampler, SamplingBatch
from radixflow.runtime.scheduler import ScheduledStep
from radixflow.runtime.speculative import Speculator

Reason = FinishReason | dict[str, Any]  # a dict: SGLang's form, as budget_abort gives it


@dataclass
class LogitRows:
    """Which token rows of a step need logits: one per request that samples (k+1 in a row for
    one verifying k drafts), plus prompt rows."""

    indices: torch.Tensor
    sample_reqs: list[int]  # indices into step.reqs
    sample_rows: list[int]  # rows of the logits tensor to sample from
    input_rows: list[tuple[int, list[int]]]  # (req index, prompt positions predicting pos+1)
    input_rows_flat: torch.Tensor

    @classmethod
    def plan(cls, step: ScheduledStep) -> LogitRows:
        """The rows of `step`, read before its KV is committed (each request's kv.length is
        where its fed tokens start)."""
        indices: list[int] = []
        sample_reqs: list[int] = []
        sample_rows: list[int] = []
        input_rows: list[tuple[int, list[int]]] = []
        input_flat: list[int] = []
        start = 0
        for i, (req, n) in enumerate(zip(step.reqs, step.extend_lens, strict=True)):
            if req.wants_input_logprobs:
                first = max(
                    min(req.logprob.logprob_start_len, len(req.prompt_ids) - 1) - 1, req.kv.length
                )
                last = min(req.kv.length + n, len(req.prompt_ids) - 1)
                positions = list(range(first, last))
                start_at_zero = req.logprob.logprob_start_len == 0 and not req.input_logprobs
                if positions or start_at_zero:
                    input_rows.append((i, positions))
                    for pos in positions:
                        input_flat.append(len(indices))
                        indices.append(start + pos - req.kv.length)
            drafts = len(req.draft_ids)
            if req.kv.length + n == req.fill_len + drafts:  # sample, or verify k drafts: k+1 rows
                sample_reqs.append(i)
                sample_rows.append(len(indices))
                indices.extend(range(start + n - 1 - drafts, start + n))
            start += n
        return cls(
            torch.tensor(indices, dtype=torch.int64),
            sample_reqs,
            sample_rows,
            input_rows,
            torch.tensor(input_flat, dtype=torch.int64),
        )


@dataclass
class StepOutcome:
    """What a step's logits did: the requests that finished, with why (in step order), the
    unfinished streaming requests with new output, and increments of `Engine.stats` counters."""

    finished: list[tuple[Req, FinishReason]] = field(default_factory=list)
    streamed: list[Req] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def add(self, req: Req, reason: Reason | None) -> None:
        """File a request whose step is done: finished when it has a reason, else streamed
        (when it streams)."""
        if reason is not None:
            if isinstance(reason, dict):
                reason = FinishReason.from_dict(reason)
            self.finished.append((req, reason))
        elif req.stream:
            self.streamed.append(req)


class OutputProcessor:
    """Samples (or verifies drafts), appends, checks stops and records logprobs for a step."""

    def __init__(
        self,
        *,
        sampler: Sampler,
        grammars: GrammarService,
        speculator: Speculator | None,
        tokenizer: Any,
        eos_token_ids: set[int],
        vocab_size: int,
        context_length: int,
        jump_forward: bool,
    ) -> None:
        self.sampler = sampler
        self.grammars = grammars
        self.speculator = speculator
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.jump_forward = jump_forward

    def process(self, step: ScheduledStep, rows: LogitRows, logits: torch.Tensor) -> StepOutcome:
        """Turn the logits of `rows` into new tokens; the step's KV must be committed already."""
        outcome = StepOutcome()
        if rows.input_rows:
            self._input_logprobs(step, rows, logits)
        plain: list[tuple[Req, int]] = []
        verifying: list[tuple[Req, int]] = []
        for i, row in zip(rows.sample_reqs, rows.sample_rows, strict=True):
            req = step.reqs[i]
            if req.params.max_new_tokens == 0:  # prefill only: its prompt is cached and scored
                outcome.add(req, FinishReason.limit(0))
            elif req.grammar is None and req.grammar_compiling is not None:
                req.deferred_logits = _rows_of(logits, [row])[0]  # see `sample_deferred`
            else:
                (verifying if req.draft_ids else plain).append((req, row))
        now = time.monotonic()
        if plain:
            self._sample(logits, plain, now, outcome)
        if verifying:
            self._verify(logits, verifying, now, outcome)
        return outcome

    def sample_deferred(self, reqs: list[Req]) -> StepOutcome:
        """Sample the first token of requests whose prefill ended before their grammar compiled,
        from the logits kept then (`Req.deferred_logits`), now masked by the grammar."""
        outcome = StepOutcome()
        kept = []
        for req in reqs:
            assert req.deferred_logits is not None  # `Engine._install_grammars` picks only these
            kept.append(req.deferred_logits)
            req.deferred_logits = None
        logits = torch.stack(kept)
        self._sample(logits, [(req, i) for i, req in enumerate(reqs)], time.monotonic(), outcome)
        return outcome

    def output(self, req: Req) -> dict[str, Any]:
        """The request's result dict now: what a stream yields, or the final answer."""
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason,
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.first_token_time is not None:
            meta["ttft"] = req.first_token_time - req.created
        if req.pin_id is not None:
            meta["pinned_tokens"] = req.pinned_tokens
        if self.speculator is not None:
            meta["spec_accept_length"] = req.sampled_tokens / max(1, req.sample_steps)
        if req.logprob.return_logprob:
            meta.update(logprob_meta(req))
        detok = req.detokenizer
        text = detok.text if req.finished else detok.stream_text
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    # -- sampling and verification --------------------------------------------------------------
    def _sample(
        self, logits: torch.Tensor, sampled: list[tuple[Req, int]], now: float, out: StepOutcome
    ) -> None:
        """Sample one token for each request from its logits row."""
        reqs = [req for req, _ in sampled]
        sample_logits = _sample_logits(logits, [row for _, row in sampled], reqs)
        failed = self.grammars.mask_logits(sample_logits, reqs)  # rows whose grammar gave out
        want_lp = any(r.logprob.return_logprob for r in reqs)
        top_k = max(r.logprob.top_logprobs_num for r in reqs) if want_lp else 0
        sample = self.sampler.sample(
            sample_logits,
            SamplingBatch.build([r.sampler for r in reqs], self.vocab_size, logits.device),
            return_logprob=want_lp,
            top_logprobs_num=top_k,
            return_all_logprobs=want_lp and any(r.logprob.token_ids for r in reqs),
        )
        tokens = sample.next_token_ids.tolist()
        for i, (req, token) in enumerate(zip(reqs, tokens, strict=True)):
            refused = budget_abort(failed[i]) if i in failed else self._append(req, token, now)
            if refused is not None:
                self._after_sampling(req, 0, refused, out)
                continue
            if req.logprob.return_logprob:
                record_output_logprobs(req, sample, i)
            self._after_sampling(req, 1, self._finish_reason(req, token), out)

    def _verify(
        self, logits: torch.Tensor, verifying: list[tuple[Req, int]], now: float, out: StepOutcome
    ) -> None:
        """Check each request's drafts (rows row..row+k) and append what the target accepts."""
        rows = [r for req, row in verifying for r in range(row, row + len(req.draft_ids) + 1)]
        reqs = [req for req, _ in verifying]
        assert self.speculator is not None  # only speculation gives requests drafts
        emitted = self.speculator.verify(_rows_of(logits, rows), reqs)
        for req, tokens in zip(reqs, emitted, strict=True):
            out.stats["spec_verify_steps"] += 1
            out.stats["spec_draft_tokens"] += len(req.draft_ids)
            out.stats["spec_accepted_tokens"] += len(tokens) - 1
            req.draft_ids = []
            reason = None
            appended = 0
            for token in tokens:  # stop checks token by token: truncate at the first finish
                reason = self._append(req, token, now)
                if reason is not None:
                    break
                appended += 1
                reason = self._finish_reason(req, token)
                if reason is not None:
                    break
            self._after_sampling(req, appended, reason, out)

    def _append(self, req: Req, token: int, now: float) -> Reason | None:
        """Add a sampled token; an abort reason if the request's grammar refuses it."""
        try:
            refused = req.grammar is not None and not req.grammar.accept(token)
        except GrammarBudgetExceeded as exc:
            return budget_abort(exc)
        if refused:
            # Only a row with no allowed token at all (e.g. min_new_tokens blocking the EOS
            # the grammar requires) gets here; fail this request alone.
            return FinishReason.abort(f"no token satisfies the grammar (sampled {token})")
        req.output_ids.append(token)
        req.sampler.observe(token)
        if req.first_token_time is None:
            req.first_token_time = now
        return None

    def _after_sampling(
        self, req: Req, appended: int, reason: Reason | None, out: StepOutcome
    ) -> None:
        """Drop the KV of rejected drafts, jump forward, then file the request as finished or
        streamed."""
        # Only the newest token lacks KV; a verify step wrote KV for drafts that were rejected,
        # rolling back leaves their pages to be rewritten (they never reach the radix tree).
        req.kv.rollback(req.fill_len - 1)
        if self.speculator is not None:
            req.sample_steps += 1
            req.sampled_tokens += appended
        if reason is None and req.grammar is not None and self.jump_forward:
            try:
                out.stats["jump_forward_tokens"] += jump_forward(req, self.tokenizer)
            except GrammarBudgetExceeded as exc:
                reason = budget_abort(exc)
            else:
                reason = self._done_reason(req)
        out.add(req, reason)

    # -- finish checks ------------------------------------------------------------------------
    def _finish_reason(self, req: Req, token: int) -> Reason | None:
        p = req.params
        if (not p.ignore_eos and token in self.eos_token_ids) or (
            p.stop_token_ids and token in p.stop_token_ids
        ):
            return FinishReason.stop(token)
        if req.stream or p.stop_strings or p.stop_regex_patterns:
            try:
                matched = req.detokenizer.update(req.output_ids)
            except StopRegexTimeout as exc:
                return FinishReason.abort(str(exc))
            if matched is not None:
                return FinishReason.stop(matched)
        return self._done_reason(req)

    def _done_reason(self, req: Req) -> Reason | None:
        """Finish reason once the grammar is complete or the output or context is full."""
        p = req.params
        try:
            if req.grammar is not None and req.grammar.is_terminated():
                return FinishReason.stop(None)
        except GrammarBudgetExceeded as exc:
            return budget_abort(exc)
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason.limit(p.max_new_tokens)
        if req.fill_len >= self.context_length:
            return FinishReason.limit(len(req.output_ids))
        return None

    def _input_logprobs(self, step: ScheduledStep, rows: LogitRows, logits: torch.Tensor) -> None:
        """Logprob of each prompt token given the tokens before it (for `select` scoring)."""
        logp = torch.log_softmax(_rows_of(logits, rows.input_rows_flat), dim=-1)
        offset = 0
        for req_i, positions in rows.input_rows:
            record_input_logprobs(
                step.reqs[req_i], positions, logp[offset : offset + len(positions)]
            )
            offset += len(positions)


def _sample_logits(logits: torch.Tensor, rows: list[int], reqs: list[Req]) -> torch.Tensor:
    """The rows to sample from. The forward's own tensor when they are all of its rows and no
    grammar masks them (the sampler never writes its input), the usual batch-1 decode step;
    else a copy: masking writes in place, which the forward's inference tensor refuses."""
    if rows == list(range(logits.shape[0])) and all(r.grammar is None for r in reqs):
        return logits
    return _rows_of(logits, rows)


def _rows_of(logits: torch.Tensor, rows: list[int] | torch.Tensor) -> torch.Tensor:
    """A copy of `rows` of `logits` (a normal tensor, which masking may change in place), by
    index_select: `logits[index]` (advanced indexing) took 5x as long for a 49k-token row."""
    index = torch.as_tensor(rows, dtype=torch.int64)
    return logits.index_select(0, index.to(logits.device))
