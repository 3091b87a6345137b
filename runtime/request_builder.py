"""Requests from a caller's arguments, built on the caller's thread before the engine sees them.

generate(prompt | input_ids, ...) ─► GenerateInput (tokenized, validated once)
                                  ─► Req per item (detokenizer, per-request sampler)
                                  ─► its grammar compiling on the grammar pool
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, cast

from radixflow.runtime.constrained import GrammarService
from radixflow.runtime.detokenizer import IncrementalDetokenizer
from radixflow.runtime.io_struct import GenerateInput, GenerateItem, InputLimits
from radixflow.runtime.request import LogprobRequest, Req
from radixflow.runtime.request_sampler import RequestSampler
from radixflow.runtime.text import check_encodable


class RequestBuilder:
    """Turns `generate`'s arguments into a `GenerateInput`, and its items into `Req`s."""

    def __init__(
        self,
        tokenizer: Any,
        limits: InputLimits,
        eos_token_ids: set[int],
        grammars: GrammarService,
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.eos_token_ids = eos_token_ids
        self.grammars = grammars

    def input(
        self,
        prompt: str | list[str] | None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None,
        input_ids: list[int] | list[list[int]] | None,
        return_logprob: bool,
        logprob_start_len: int | None,
        top_logprobs_num: int | None,
        stream: bool,
        rid: str | None,
        token_ids_logprob: list[int] | None,
    ) -> GenerateInput:
        """The validated input of `Engine.generate`'s arguments (the prompt tokenized)."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        if prompt is not None:
            batched = isinstance(prompt, list)
            prompts = prompt if batched else [prompt]
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids_list = [self._encode(p) for p in prompts if isinstance(p, str)]
        else:
            assert input_ids is not None
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            ids_list = cast(list[list[int]], input_ids if batched else [input_ids])
        logprob = self.limits.logprob(
            return_logprob, logprob_start_len, top_logprobs_num, token_ids_logprob
        )
        return GenerateInput.build(
            ids_list,
            sampling_params,
            self.limits,
            batched=batched,
            rid=rid,
            logprobs=[logprob] * len(ids_list),
            stream=stream,
            prompt_field="prompt" if prompt is not None else "input_ids",
        )

    def reqs(self, inp: GenerateInput) -> list[Req]:
        return [self.req(item, inp.stream) for item in inp.items]

    def req(self, item: GenerateItem, stream: bool) -> Req:
        """A new request for one input item, with its detokenizer and sampler state."""
        params, ids = item.params, item.input_ids
        detok = IncrementalDetokenizer(
            self.tokenizer,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            stop_strings=params.stop_strings,
            no_stop_trim=params.no_stop_trim,
            stop_regexes=params.stop_regex_patterns,
        )
        sampler = RequestSampler(params, prompt_ids=ids, eos_token_ids=self.eos_token_ids)
        logprob = item.logprob or LogprobRequest()
        return Req(item.rid, list(ids), params, sampler, detok, logprob, stream)

    def compile_grammars(self, reqs: list[Req]) -> list[tuple[Req, Future]]:
        """Start compiling the grammars of constrained requests on the grammar pool."""
        return [(r, self.grammars.submit(r.params)) for r in reqs if r.params.grammar is not None]

    def _encode(self, text: str) -> list[int]:
        check_encodable(text, "prompt")
        return self.tokenizer.encode(text)
