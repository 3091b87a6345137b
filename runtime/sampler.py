"""Batched sampling for one decode step.

    per request (lives on the Req)      RequestSampler: params, seeded generator, penalty counts
    once per step                       SamplingBatch.build(samplers) -> [B] tensors + flags
    logits [B, V] float32               Sampler.sample(logits, batch) -> next ids (+ logprobs)
    after the step, per request         sampler.observe(token_id)

Stages, each one tensor operation over the whole batch (flags skip the unused ones):
logit_bias -> repetition penalty -> frequency/presence penalties -> min_new_tokens EOS blocking
(= the "adjusted" logits; greedy rows take their argmax) -> temperature -> softmax -> top-k ->
top-p -> min-p -> sampling. Each filter sees the renormalised output of the one before (as HF's
warpers chain). All three filters keep a prefix of the tokens sorted by probability, so their
combination is one threshold per row: keep tokens with p >= threshold (ties at the threshold are
all kept).

Sampling draws one uniform u per row and inverts the row's CDF in vocabulary order (blockwise, in
float64, so tokens of tiny probability keep their weight). The row's result depends only on its
own logits, params and u, and a seeded request draws u from its own generator: it gets the same
tokens whatever its batch neighbours are. Unseeded rows share the engine's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixflow.runtime.request_sampler import RequestSampler

# Top-p looks for its nucleus among this many most likely tokens, then 16 times as many, before
# sorting a whole row.
TOP_P_CANDIDATES = 256
# Inverse-CDF sampling first picks a block of this many tokens, then a token inside it.
SAMPLE_BLOCK = 256


@dataclass
class _Entries:
    """Sparse per-(row, token) values: entry j is about logits[rows[j], ids[j]]; pairs distinct."""

    rows: torch.Tensor  # [N] int64
    ids: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32


class _EntryCollector:
    """Gathers per-request CPU parts of one kind of _Entries while a batch is built."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.ids: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def add(self, row: int, ids: torch.Tensor, values: torch.Tensor | float) -> None:
        if len(ids):
            self.rows.append(row)
            self.ids.append(ids)
            self.values.append(
                torch.full(ids.shape, values) if isinstance(values, float) else values
            )

    def to(self, device: torch.device) -> _Entries | None:
        if not self.rows:
            return None
        lengths = torch.tensor([len(t) for t in self.ids])
        return _Entries(
            rows=torch.repeat_interleave(torch.tensor(self.rows), lengths).to(device),
            ids=torch.cat(self.ids).to(device),
            values=torch.cat(self.values).to(device),
        )


@dataclass
class SamplingBatch:
    """What one step needs, stacked once for the batch. Greedy rows carry neutral filters."""

    samplers: list[RequestSampler]
    vocab_size: int
    device: torch.device
    greedy: torch.Tensor  # [B] bool
    any_greedy: bool
    all_greedy: bool
    temperatures: torch.Tensor | None  # [B, 1] float32 (1 for greedy rows); None when all 1
    top_ks: torch.Tensor  # [B, 1] int64, vocab_size when off
    top_ps: torch.Tensor  # [B, 1] float32
    min_ps: torch.Tensor  # [B, 1] float32
    max_top_k: int  # largest active top_k; 0 when no row filters by top-k
    any_top_p: bool
    any_min_p: bool
    bias: _Entries | None  # added to the logits
    repetition: _Entries | None  # values: the penalty; logits divided (> 0) or multiplied by it
    frequency: _Entries | None  # values: frequency * count + presence, subtracted
    blocked: _Entries | None  # set to -inf (values unused)
    seeded_rows: list[int]  # sampled rows that draw from their own generator
    unseeded_rows: list[int]  # sampled rows that draw from the engine's generator

    @property
    def batch_size(self) -> int:
        return len(self.samplers)

    @property
    def adjusts_logits(self) -> bool:
        parts = (self.bias, self.repetition, self.frequency, self.blocked)
        return any(x is not None for x in parts)

    @classmethod
    def build(
        cls, samplers: list[RequestSampler], vocab_size: int, device: torch.device | str
    ) -> SamplingBatch:
        device = torch.device(device)
        V = vocab_size
        temps, ks, ps, min_ps, greedy = [], [], [], [], []
        seeded: list[int] = []
        unseeded: list[int] = []
        bias, repetition, frequency, blocked = (_EntryCollector() for _ in range(4))
        for i, s in enumerate(samplers):
            p = s.params
            greedy.append(s.greedy)
            if s.greedy:
                temps.append(1.0)
                ks.append(V)
                ps.append(1.0)
                min_ps.append(0.0)
            else:
                temps.append(p.temperature)
                ks.append(V if p.top_k == -1 else min(p.top_k, V))
                ps.append(p.top_p)
                min_ps.append(p.min_p)
                (unseeded if s.generator is None else seeded).append(i)
            if s.bias_ids is not None and s.bias_values is not None:
                bias.add(i, s.bias_ids, s.bias_values)
            if s.seen_tokens is not None:
                repetition.add(i, s.seen_tokens.ids, p.repetition_penalty)
            if s.output_tokens is not None:
                out = s.output_tokens
                frequency.add(i, out.ids, out.counts * p.frequency_penalty + p.presence_penalty)
            if s.blocked_ids is not None and s.blocks_eos:
                blocked.add(i, s.blocked_ids, 0.0)

        def col(values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device).unsqueeze(1)

        active_ks = [k for k in ks if k < V]
        return cls(
            samplers=samplers,
            vocab_size=V,
            device=device,
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            any_greedy=any(greedy),
            all_greedy=all(greedy),
            temperatures=None if all(t == 1.0 for t in temps) else col(temps),
            top_ks=col(ks, torch.long),
            top_ps=col(ps),
            min_ps=col(min_ps),
            max_top_k=max(active_ks, default=0),
            any_top_p=any(p < 1 for p in ps),
            any_min_p=any(m > 0 for m in min_ps),
            bias=bias.to(device),
            repetition=repetition.to(device),
            frequency=frequency.to(device),
            blocked=blocked.to(device),
            seeded_rows=seeded,
            unseeded_rows=unseeded,
        )


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # [B] int64
    # Log-probabilities under log_softmax of the raw model logits, i.e. before logit_bias,
    # penalties, temperature and filtering: what the model believes, comparable across requests.
    logprobs: torch.Tensor | None  # [B] of the chosen tokens
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # (values [B, K], ids [B, K]), sorted
    all_logprobs: torch.Tensor | None = None  # [B, V], with return_all_logprobs


class Sampler:
    """Turns a batch's logits into next tokens; unseeded rows share this sampler's generator."""

    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def sample(
        self,
        logits: torch.Tensor,
        batch: SamplingBatch,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        return_all_logprobs: bool = False,
    ) -> SampleOutput:
        """Next token of every row of `logits` [B, V]; logprobs when asked (see SampleOutput)."""
        logits = _check_logits(logits, batch)
        adjusted = self.adjust_logits(logits, batch)
        if batch.all_greedy:
            next_ids = adjusted.argmax(dim=-1)
        else:
            probs = self._filtered_probs(adjusted, batch)
            u = self._uniforms(batch).to(probs.device, non_blocking=True)
            next_ids = _inverse_cdf(probs, u)
            if batch.any_greedy:
                next_ids = torch.where(batch.greedy, adjusted.argmax(dim=-1), next_ids)
        logprobs = top = all_logprobs = None
        if return_logprob or top_logprobs_num > 0 or return_all_logprobs:
            all_logprobs = torch.log_softmax(logits, dim=-1)
            if return_logprob:
                logprobs = all_logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1)
            if top_logprobs_num > 0:
                values, ids = all_logprobs.topk(min(top_logprobs_num, batch.vocab_size), dim=-1)
                top = (values, ids)
        return SampleOutput(
            next_token_ids=next_ids,
            logprobs=logprobs,
            top_logprobs=top,
            all_logprobs=all_logprobs if return_all_logprobs else None,
        )

    def probs(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The distribution `sample` draws from, [B, V]: one-hot at the argmax for greedy rows."""
        adjusted = self.adjust_logits(_check_logits(logits, batch), batch)
        probs = self._filtered_probs(adjusted, batch)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        if batch.any_greedy:
            one_hot = torch.zeros_like(probs).scatter_(1, adjusted.argmax(-1, keepdim=True), 1.0)
            probs = torch.where(batch.greedy.unsqueeze(1), one_hot, probs)
        return probs

    def adjust_logits(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Logits after logit_bias, penalties and EOS blocking; the input is never modified."""
        if not batch.adjusts_logits:
            return logits
        out = logits.clone()
        if batch.bias is not None:
            b = batch.bias
            out.index_put_((b.rows, b.ids), b.values, accumulate=True)
        if batch.repetition is not None:
            r = batch.repetition
            seen = out[r.rows, r.ids]
            out[r.rows, r.ids] = torch.where(seen < 0, seen * r.values, seen / r.values)
        if batch.frequency is not None:
            f = batch.frequency
            out.index_put_((f.rows, f.ids), -f.values, accumulate=True)
        if batch.blocked is not None:
            out[batch.blocked.rows, batch.blocked.ids] = float("-inf")
        return out

    def _filtered_probs(self, adjusted: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """softmax(adjusted / T) with the filtered-out tokens zeroed (not renormalised)."""
        scaled = adjusted if batch.temperatures is None else adjusted / batch.temperatures
        probs = torch.softmax(scaled, dim=-1)
        threshold = _keep_threshold(probs, batch)
        if threshold is not None:
            probs.masked_fill_(probs < threshold, 0.0)  # probs is ours: softmax made it
        return probs

    def _uniforms(self, batch: SamplingBatch) -> torch.Tensor:
        """One uniform per row in [0, 1), float64 on the CPU; greedy rows get 0 (unused)."""
        u = torch.zeros(batch.batch_size, dtype=torch.float64)
        if batch.unseeded_rows:
            n = len(batch.unseeded_rows)
            u[batch.unseeded_rows] = torch.rand(n, dtype=torch.float64, generator=self.generator)
        for i in batch.seeded_rows:
            u[i] = torch.rand(1, dtype=torch.float64, generator=batch.samplers[i].generator)[0]
        return u


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token of each row where u [B] (in [0, 1)) falls in the CDF of `weights` [B, V] (>= 0).

    Two levels: the CDF of block masses, then the CDF inside the chosen block, both accumulated in
    float64. This reads the row once, and tokens of tiny probability keep their weight (a float32
    cumsum over the whole vocabulary rounds them away); only block edges move, by the float32
    rounding of a block's mass. A zero-weight token is never returned.
    """
    B, V = weights.shape
    full = V // SAMPLE_BLOCK * SAMPLE_BLOCK
    masses = weights[:, :full].reshape(B, -1, SAMPLE_BLOCK).sum(-1)
    if full < V:
        masses = torch.cat([masses, weights[:, full:].sum(-1, keepdim=True)], dim=1)
    masses = masses.double()
    block_cdf = masses.cumsum(dim=-1)
    x = u.unsqueeze(1) * block_cdf[:, -1:]
    last_block = masses.shape[1] - 1 - (masses.flip(-1) > 0).int().argmax(-1, keepdim=True)
    block = torch.minimum(torch.searchsorted(block_cdf, x, right=True), last_block)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    cols = block * SAMPLE_BLOCK + torch.arange(SAMPLE_BLOCK, device=weights.device)
    inside = weights.gather(1, cols.clamp(max=V - 1)).masked_fill(cols >= V, 0.0)
    last_col = SAMPLE_BLOCK - 1 - (inside.flip(-1) > 0).int().argmax(-1, keepdim=True)
    col = torch.searchsorted(inside.double().cumsum(dim=-1), x - before, right=True)
    return (block * SAMPLE_BLOCK + torch.minimum(col, last_col)).squeeze(1)


def _check_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    expected = (batch.batch_size, batch.vocab_size)
    if tuple(logits.shape) != expected:
        raise ValueError(f"logits have shape {tuple(logits.shape)}, the batch needs {expected}")
    return logits.float()


def _keep_threshold(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor | None:
    """Per-row [B, 1] probability below which top-k, top-p and min-p drop a token; None if none.

    Works on the TOP_P_CANDIDATES most likely tokens (a partial sort); a top-p row whose nucleus
    does not fit there is redone on 16 times as many, and at last on its fully sorted row. Every
    width that holds the nucleus gives the same threshold, so a row's result never depends on
    its neighbours.
    """
    if not (batch.max_top_k or batch.any_top_p or batch.any_min_p):
        return None
    V = batch.vocab_size
    width = min(V, max(batch.max_top_k, TOP_P_CANDIDATES if batch.any_top_p else 1))
    ranked = probs.topk(width, dim=-1).values
    threshold = torch.zeros_like(ranked[:, :1])
    if batch.max_top_k:
        threshold_k = ranked.gather(1, batch.top_ks.clamp(max=width) - 1)
        threshold = torch.where(batch.top_ks < V, threshold_k, threshold)
    if batch.any_top_p:
        threshold_p, resolved = _top_p_threshold(ranked, batch.top_ks, batch.top_ps, V)
        redo = ((batch.top_ps < 1) & ~resolved).squeeze(1).nonzero().squeeze(1)
        wider = 16 * width
        while redo.numel():
            ks, ps = batch.top_ks[redo], batch.top_ps[redo]
            if wider < V:
                ranked_redo = probs[redo].topk(wider, dim=-1).values
            else:
                ranked_redo = probs[redo].sort(dim=-1, descending=True).values
            threshold_p[redo], resolved = _top_p_threshold(ranked_redo, ks, ps, V)
            redo = redo[~resolved.squeeze(1)]
            wider *= 16
        threshold = torch.maximum(threshold, torch.where(batch.top_ps < 1, threshold_p, 0.0))
    if batch.any_min_p:
        threshold = torch.maximum(threshold, batch.min_ps * ranked[:, :1])
    return threshold


def _top_p_threshold(
    ranked: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p over the renormalised top-k distribution, from the W largest probabilities of each
    row (`ranked` [R, W], descending): keep the tokens with less than top_p of the top-k mass
    before them. Returns the threshold [R, 1] and whether W columns sufficed to know it [R, 1].
    """
    W = ranked.shape[1]
    in_top_k = torch.arange(W, device=ranked.device) < top_ks
    ranked_k = ranked.masked_fill(~in_top_k, 0.0)
    cum = ranked_k.cumsum(dim=-1)
    k_on = top_ks < vocab_size
    mass = torch.where(k_on, cum.gather(1, top_ks.clamp(max=W) - 1), 1.0)
    kept = ((cum - ranked_k < top_ps * mass) & in_top_k).sum(dim=-1, keepdim=True)
    resolved = (top_ks <= W) | (~k_on & (kept < W))
    return ranked.gather(1, kept - 1), resolved
