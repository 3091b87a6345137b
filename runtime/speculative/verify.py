"""Verification of proposed tokens against the target model's distributions.

A request that proposed d1..dk fed [last, d1..dk] and gets k+1 target distributions p_0..p_k
(p_i predicts the token after d_i). Proposals here are deterministic (q is one-hot at d_i), so
lossless speculative sampling reduces to: accept d_{i+1} with probability p_i(d_{i+1}); at the
first rejection draw from p_i with d_{i+1} removed, renormalised (= normalize(max(p - q, 0)));
when all k are accepted draw a bonus token from p_k. Every emitted token is then distributed
exactly as plain sampling from the target would give. Greedy rows (p one-hot at the argmax)
reduce to accepting the longest prefix equal to the argmaxes, plus the argmax after it.
"""

from __future__ import annotations

import torch


def verify_greedy(drafts: list[int], targets: list[int]) -> list[int]:
    """Tokens emitted for one greedy request: the matching prefix of `drafts`, then the target.

    targets[i] is the target's argmax after feeding drafts[:i] (len(targets) == len(drafts) + 1).
    """
    j = 0
    while j < len(drafts) and drafts[j] == targets[j]:
        j += 1
    return drafts[:j] + [targets[j]]


def first_rejection(draft_probs: list[float], uniforms: list[float]) -> int:
    """Index of the first draft rejected (u >= p(d)), or the number of drafts when none is."""
    for j, (p, u) in enumerate(zip(draft_probs, uniforms, strict=False)):
        if u >= p:
            return j
    return len(draft_probs)


def sample_rows(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row of non-negative `weights` [B, V] with uniforms u [B] in [0, 1).

    The CDF is accumulated in float64; a zero-weight token is never returned.
    """
    cdf = weights.double().cumsum(dim=-1)
    x = u.to(cdf.device, torch.float64).unsqueeze(1) * cdf[:, -1:]
    last = weights.shape[1] - 1 - (weights.flip(-1) > 0).int().argmax(-1, keepdim=True)
    return torch.minimum(torch.searchsorted(cdf, x, right=True), last).squeeze(1)


def verify_sampled(
    probs: torch.Tensor, drafts: list[list[int]], uniforms: list[list[float]]
) -> list[list[int]]:
    """Lossless rejection sampling for a batch of requests with one-hot (deterministic) proposals.

    probs: [sum(k_i + 1), V] target distributions, request i owning k_i + 1 consecutive rows.
    drafts[i]: its k_i proposed tokens; uniforms[i]: k_i + 1 independent uniforms in [0, 1).
    Returns the tokens each request emits: accepted drafts, then one token from the target.
    """
    starts, flat_rows, flat_ids = [], [], []
    row = 0
    for d in drafts:
        starts.append(row)
        flat_rows.extend(range(row, row + len(d)))
        flat_ids.extend(d)
        row += len(d) + 1
    if row != probs.shape[0]:
        raise ValueError(f"probs has {probs.shape[0]} rows, the drafts need {row}")
    dev = probs.device
    p_draft = probs[torch.tensor(flat_rows, device=dev), torch.tensor(flat_ids, device=dev)]
    p_draft = p_draft.tolist()
    accepted, final_rows, removed, last_u = [], [], [], []
    offset = 0
    for start, d, u in zip(starts, drafts, uniforms, strict=True):
        j = first_rejection(p_draft[offset : offset + len(d)], u[: len(d)])
        offset += len(d)
        accepted.append(d[:j])
        final_rows.append(start + j)
        removed.append(d[j] if j < len(d) else -1)
        last_u.append(u[len(d)])
    weights = probs[torch.tensor(final_rows, device=dev)].clone()
    rejected = [i for i, t in enumerate(removed) if t >= 0]
    if rejected:
        idx = torch.tensor(rejected, device=dev)
        ids = torch.tensor([removed[i] for i in rejected], device=dev)
        weights[idx, ids] = 0.0
        # A rejected draft of probability ~1 leaves (by float rounding only) an empty residual;
        # the exact residual is then the draft itself.
        empty = weights[idx].sum(-1) == 0
        weights[idx[empty], ids[empty]] = 1.0
    tokens = sample_rows(weights, torch.tensor(last_u, dtype=torch.float64)).tolist()
    return [a + [t] for a, t in zip(accepted, tokens, strict=True)]
