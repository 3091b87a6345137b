"""Sampling state of one request, kept on the CPU between steps: its generator, penalty
counts and min_new_tokens EOS blocking (`runtime/sampler.py` batches it per step)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from radixflow.runtime.sampling_params import SamplingParams


class TokenCounts:
    """Distinct token ids with how often each occurred, in first-seen order.

    CPU buffers that grow by doubling; a step reads `ids`/`counts` as views, so penalties cost
    work in proportion to the distinct tokens of a request, not the vocabulary.
    """

    def __init__(self, token_ids: Sequence[int] | torch.Tensor = ()) -> None:
        ids, counts = torch.unique(torch.as_tensor(token_ids, dtype=torch.long), return_counts=True)
        self._slot = {t: i for i, t in enumerate(ids.tolist())}
        capacity = max(16, 2 * len(self._slot))
        self._ids = torch.zeros(capacity, dtype=torch.long)
        self._counts = torch.zeros(capacity, dtype=torch.float32)
        self._ids[: len(ids)] = ids
        self._counts[: len(ids)] = counts.float()

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def ids(self) -> torch.Tensor:
        return self._ids[: len(self._slot)]

    @property
    def counts(self) -> torch.Tensor:
        return self._counts[: len(self._slot)]

    def add(self, token_id: int) -> None:
        slot = self._slot.get(token_id)
        if slot is None:
            slot = self._slot[token_id] = len(self._slot)
            if slot == len(self._ids):
                self._ids = torch.cat([self._ids, torch.zeros_like(self._ids)])
                self._counts = torch.cat([self._counts, torch.zeros_like(self._counts)])
            self._ids[slot] = token_id
        self._counts[slot] += 1


class RequestSampler:
    """Sampling state of one request: params, its generator, penalty counts, tokens so far.

    Everything here lives on the CPU; SamplingBatch.build moves what a step needs to the device.
    """

    def __init__(
        self,
        params: SamplingParams,
        *,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.params = params
        self.num_generated = 0
        self.greedy = params.is_greedy
        # A CPU generator, so that a seed gives the same tokens on any device.
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        # Frequency/presence count generated tokens only (OpenAI); repetition looks at the
        # prompt and generated tokens (HF's RepetitionPenaltyLogitsProcessor).
        self.output_tokens: TokenCounts | None = None
        if params.frequency_penalty != 0 or params.presence_penalty != 0:
            self.output_tokens = TokenCounts()
        self.seen_tokens: TokenCounts | None = None
        if params.repetition_penalty != 1:
            self.seen_tokens = TokenCounts(prompt_ids)
        self.blocked_ids: torch.Tensor | None = None
        if params.min_new_tokens > 0:
            ids = sorted(set(eos_token_ids) | set(params.stop_token_ids or ()))
            if ids:
                self.blocked_ids = torch.tensor(ids, dtype=torch.long)
        self.bias_ids: torch.Tensor | None = None
        self.bias_values: torch.Tensor | None = None
        if params.logit_bias:
            self.bias_ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
            self.bias_values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)

    @property
    def blocks_eos(self) -> bool:
        """True while fewer than min_new_tokens tokens are generated (EOS/stop ids are banned)."""
        return self.blocked_ids is not None and self.num_generated < self.params.min_new_tokens

    def observe(self, token_id: int) -> None:
        """Record a token accepted into the output."""
        token_id = int(token_id)  # a 0-d tensor would hash by identity in TokenCounts
        self.num_generated += 1
        if self.output_tokens is not None:
            self.output_tokens.add(token_id)
        if self.seen_tokens is not None:
            self.seen_tokens.add(token_id)
