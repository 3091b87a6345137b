"""How `select` picks a choice from the logprobs of each choice's tokens (SGLang's three methods).

Each method gets, per choice, the scored tokens as (logprob | None, token_id, text | None):
the choice's tokens after the shared prefix, given that prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TokenLogprobs = list[tuple[float | None, int, str | None]]


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def normalized_logprob(tokens: TokenLogprobs) -> float:
    """Mean logprob of the tokens that have one (a sequence's first token has none)."""
    values = [lp for lp, _, _ in tokens if lp is not None]
    if not values:
        raise ValueError("a choice has no scored tokens (is it empty?)")
    return sum(values) / len(values)


class ChoicesSamplingMethod:
    """Base: subclasses pick the best choice from per-token logprobs."""

    requires_unconditional_logprobs = False

    def __call__(
        self,
        *,
        choices: list[str],
        input_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        raise NotImplementedError


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(self, *, choices, input_token_logprobs, unconditional_token_logprobs=None):
        scores = [normalized_logprob(t) for t in input_token_logprobs]
        best = max(range(len(choices)), key=scores.__getitem__)
        return ChoicesDecision(choices[best], _meta(scores, input_token_logprobs))


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices whose logprob at that position is the highest.

    A choice shorter than the longest is padded with its own mean logprob; ties after the last
    position go to the earliest choice.
    """

    def __call__(self, *, choices, input_token_logprobs, unconditional_token_logprobs=None):
        rows = []
        for tokens in input_token_logprobs:
            values = [lp if lp is not None else 0.0 for lp, _, _ in tokens]
            rows.append(values)
        width = max(len(r) for r in rows)
        padded = [r + [sum(r) / len(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(choices)))
        for j in range(width):
            top = max(padded[i][j] for i in remaining)
            remaining = [i for i in remaining if padded[i][j] == top]
            if len(remaining) == 1:
                break
        scores = [normalized_logprob(t) for t in input_token_logprobs]
        return ChoicesDecision(choices[remaining[0]], _meta(scores, input_token_logprobs))


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Highest mean of (logprob given the prompt - logprob of the choice on its own)."""

    requires_unconditional_logprobs = True

    def __call__(self, *, choices, input_token_logprobs, unconditional_token_logprobs=None):
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        diffs = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional token counts differ")
            d = [(c or 0.0) - (u or 0.0) for (c, _, _), (u, _, _) in zip(cond, uncond, strict=True)]
            diffs.append(sum(d) / len(d))
        best = max(range(len(choices)), key=diffs.__getitem__)
        meta = _meta([normalized_logprob(t) for t in input_token_logprobs], input_token_logprobs)
        meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        meta["normalized_unconditional_prompt_logprobs"] = diffs
        return ChoicesDecision(choices[best], meta)


def _meta(scores: list[float], tokens: list[TokenLogprobs]) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": scores,
        "input_token_logprobs": tokens,
        "output_token_logprobs": [[] for _ in tokens],
    }


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
