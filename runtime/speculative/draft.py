"""Draft-model proposer: a smaller model sharing the target's vocabulary guesses k tokens.

The draft runs through a ModelRunner of its own (its own KVPool, req_to_token rows and
attention backend). Each step, for the requests being speculated:

    catch up       one batched extend of the tokens the draft has not seen yet (usually 1-2:
                   what the target emitted after the accepted drafts) -> argmax = d1
    decode         k-1 batched single-token steps feeding d1..d(k-1) -> d2..dk
    after verify   the draft's KV is cut back to the accepted prefix (its pages freed)

A request's draft KV (the draft pool has one token per page):

    slot.ids    tokens whose K/V is in the draft pool, positions 0 .. len(ids)-1
    slot.pages  their pages, in req_to_token[slot.row, :len(ids)] as well

Before catching up, slot.ids is compared with the request's tokens, so whatever rewrote them
(stop truncation, jump-forward re-tokenization, drafts the scheduler dropped) only costs a
longer catch-up. Proposals are greedy: a deterministic proposal is verified exactly by the
one-hot rule of verify.py, for greedy and sampled requests alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.model_loader import load_checkpoint
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.request import Req
from radixflow.runtime.speculative.proposer import Proposer

DRAFT_KV_FRACTION = 0.5  # of the GPU memory free after the target, for the draft's KV pool


@dataclass
class DraftSlot:
    """One request's KV in the draft pool."""

    req: Req
    row: int
    ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)


def _draft_pool_tokens(target: ModelRunner, hf_config) -> int:
    """As many tokens as the target's pool; on a GPU at most what DRAFT_KV_FRACTION of the
    memory left after the target buys (the rest is for the draft's weights)."""
    tokens = target.pool.capacity_pages * target.pool.page_size
    if target.device.type != "cuda":
        return tokens
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    per_token = 2 * hf_config.num_hidden_layers * kv_heads * head_dim * target.dtype.itemsize
    free, _ = torch.cuda.mem_get_info(target.device)
    return min(tokens, int(free * DRAFT_KV_FRACTION) // per_token)


class DraftProposer(Proposer):
    """Greedy drafts from a second model run by its own ModelRunner."""

    max_pause_steps = 64

    def __init__(self, runner: ModelRunner) -> None:
        if runner.pool.page_size != 1:
            raise ValueError(f"the draft KV pool needs page_size 1, got {runner.pool.page_size}")
        self.runner = runner
        self.pool = runner.pool
        self._slots: dict[int, DraftSlot] = {}  # id(req) -> its draft KV

    @classmethod
    def load(cls, config: EngineConfig, target: ModelRunner, tokenizer) -> DraftProposer:
        """Build the draft named by config.speculative_draft_model next to the `target` runner."""
        path = config.speculative_draft_model
        if path is None:
            raise ValueError('speculative_algorithm="draft" needs speculative_draft_model')
        checkpoint = load_checkpoint(path)
        vocab = checkpoint.config.vocab_size
        if vocab != target.vocab_size or checkpoint.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"speculative_draft_model {str(path)!r} does not share the target's vocabulary "
                f"(draft vocab_size {vocab}, target {target.vocab_size}, or different tokens)"
            )
        draft_max = getattr(checkpoint.config, "max_position_embeddings", None) or 4096
        draft_config = dataclasses.replace(
            config,
            model_path=str(path),
            page_size=1,
            max_total_tokens=_draft_pool_tokens(target, checkpoint.config),
            context_length=min(target.context_length, draft_max),
            speculative_algorithm="none",
            speculative_draft_model=None,
        )
        return cls(ModelRunner(draft_config, checkpoint))

    # -- Proposer ---------------------------------------------------------------------------
    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        self._drop_retracted()
        drafts: list[list[int]] = [[] for _ in reqs]
        live: list[int] = []  # indices into reqs whose draft runs this step
        counts: list[int] = []
        for i, (req, k) in enumerate(zip(reqs, ks, strict=True)):
            if req.fill_len + k - 1 > self.runner.context_length:
                continue
            slot = self._sync(req)
            if slot is None:
                continue
            unseen = req.fill_ids(len(slot.ids), req.fill_len)
            if self._grow(slot, unseen):
                live.append(i)
                counts.append(len(unseen))
        while live:
            slots = [self._slots[id(reqs[i])] for i in live]
            for i, token in zip(live, self._forward(slots, counts), strict=True):
                drafts[i].append(token)
            live = [
                i
                for i in live
                if len(drafts[i]) < ks[i] and self._grow(self._slots[id(reqs[i])], drafts[i][-1:])
            ]
            counts = [1] * len(live)
        return drafts

    def accepted(self, req: Req, num_accepted: int) -> None:
        slot = self._slots.get(id(req))
        if slot is not None:  # drafts d1..d(k-1) have KV; the accepted ones stay
            self._truncate(slot, min(len(slot.ids), req.fill_len + num_accepted))

    def release(self, req: Req) -> None:
        slot = self._slots.pop(id(req), None)
        if slot is not None:
            self.pool.free_pages(slot.pages)
            self.pool.free_row(slot.row)

    # -- draft KV ---------------------------------------------------------------------------
    def _drop_retracted(self) -> None:
        """Free the draft KV of requests the scheduler retracted (they hold no row now)."""
        for slot in list(self._slots.values()):
            if slot.req.kv.row is None:
                self.release(slot.req)

    def _sync(self, req: Req) -> DraftSlot | None:
        """The request's slot holding only KV of its current tokens (never the last one)."""
        slot = self._slots.get(id(req))
        if slot is None:
            row = self.pool.alloc_row()
            if row is None:
                return None
            slot = self._slots[id(req)] = DraftSlot(req, row)
        tokens = req.fill_ids(0, req.fill_len)
        keep = len(slot.ids)
        if tokens[:keep] != slot.ids:
            pairs = enumerate(zip(tokens, slot.ids, strict=False))
            keep = next((j for j, (a, b) in pairs if a != b), min(keep, len(tokens)))
        # The last token is always fed, so the first draft comes from its logits.
        self._truncate(slot, min(keep, req.fill_len - 1))
        return slot

    def _truncate(self, slot: DraftSlot, keep: int) -> None:
        self.pool.free_pages(slot.pages[keep:])
        del slot.pages[keep:]
        del slot.ids[keep:]

    def _grow(self, slot: DraftSlot, tokens: list[int]) -> bool:
        """Give `tokens` KV pages at the end of the slot; False (nothing taken) if none free."""
        pages = self.pool.alloc_pages(len(tokens))
        if pages is None:
            return False
        slot.ids.extend(tokens)
        slot.pages.extend(pages)
        return True

    def _forward(self, slots: list[DraftSlot], counts: list[int]) -> list[int]:
        """Feed the last counts[i] tokens of each slot; the draft's argmax after each slot."""
        table = self.pool.req_to_token
        ids: list[int] = []
        positions: list[int] = []
        pages: list[int] = []
        prefix: list[int] = []
        for slot, n in zip(slots, counts, strict=True):
            end = len(slot.ids)
            start = end - n
            ids.extend(slot.ids[start:])
            pages.extend(slot.pages[start:])
            positions.extend(range(start, end))
            table[slot.row, start:end] = torch.tensor(slot.pages[start:], dtype=torch.int32)
            prefix.append(start)
        batch = ForwardBatch.build(
            ids,
            torch.tensor(positions, dtype=torch.int64),
            torch.tensor(pages, dtype=torch.int64),
            table,
            [s.row for s in slots],
            prefix,
            counts,
            torch.tensor(counts, dtype=torch.int64).cumsum(0) - 1,
            self.runner.device,
        )
        return self.runner.forward(batch).argmax(dim=-1).tolist()
