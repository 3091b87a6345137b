"""How `select` picks a choice from the logprobs of each choice's tokens (SGLang's three methods).

A method is called as SGLang calls it, with keywords only: `choices`,
`normalized_prompt_logprobs` (mean logprob per choice), `input_token_logprobs` (per choice, the
scored tokens as (logprob | None, token_id, text | None): the choice's tokens after the shared
prefix), `output_token_logprobs` (empty lists: select generates nothing) and, for methods that
set `requires_unconditional_logprobs`, `unconditional_token_logprobs` (each choice scored on its
own; its first token has no logprob). A user-written method with that signature works too.
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
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        raise NotImplementedError


def call_method(
    method: ChoicesSamplingMethod,
    choices: list[str],
    input_token_logprobs: list[TokenLogprobs],
    unconditional_token_logprobs: list[TokenLogprobs] | None = None,
) -> ChoicesDecision:
    """Call `method` with SGLang's keywords, derived from the scored tokens of each choice."""
    return method(
        choices=choices,
        normalized_prompt_logprobs=[normalized_logprob(t) for t in input_token_logprobs],
        input_token_logprobs=input_token_logprobs,
        output_token_logprobs=[[] for _ in choices],
        unconditional_token_logprobs=unconditional_token_logprobs,
    )


def _meta(normalized, inputs, outputs) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": inputs,
        "output_token_logprobs": outputs,
    }


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first of equal maxima


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ):
        best = _argmax(normalized_prompt_logprobs)
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        return ChoicesDecision(choices[best], meta)


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices whose logprob at that position is the highest.

    A choice shorter than the longest is padded with its own mean logprob (a missing logprob
    counts as 0); ties after the last position go to the earliest choice. The padded matrix is
    in the meta info as `greedy_logprob_matrix`.
    """

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ):
        rows = [[lp or 0.0 for lp, *_ in tokens] for tokens in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [sum(r) / len(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(choices)))
        for j in range(width):
            top = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == top]
            if len(remaining) == 1:
                break
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["greedy_logprob_matrix"] = matrix
        return ChoicesDecision(choices[remaining[0]], meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Highest mean of (logprob given the prompt - logprob of the choice on its own)."""

    requires_unconditional_logprobs = True

    def __call__(
        self,
        *,
        choices,
        normalized_prompt_logprobs,
        input_token_logprobs,
        output_token_logprobs,
        unconditional_token_logprobs=None,
    ):
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        diffs = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional token counts differ")
            d = [(c or 0.0) - (u or 0.0) for (c, *_), (u, *_) in zip(cond, uncond, strict=True)]
            diffs.append(sum(d) / len(d))
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        meta["normalized_unconditional_prompt_logprobs"] = diffs
        return ChoicesDecision(choices[_argmax(diffs)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
