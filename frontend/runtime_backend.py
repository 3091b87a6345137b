"""`Runtime`: the in-process backend, an `Engine` in this process shared by every state."""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from typing import Any

from radixflow.frontend.backend import (
    Backend,
    Prompt,
    RequestError,
    as_token_logprobs,
    checked,
    common_prefix_len,
    completion_result,
    request_options,
    with_token_text,
    without_context,
)
from radixflow.frontend.chat_template import ChatTemplate, chat_template_from_tokenizer
from radixflow.frontend.choices import ChoicesDecision, ChoicesSamplingMethod
from radixflow.frontend.ir import GenArgs
from radixflow.runtime.engine import Engine, PinnedPrefix

_PREFILL_ONLY = {"max_new_tokens": 0}


class Runtime(Backend):
    """`rf.Runtime()` loads the default model; `rf.Runtime(path, dtype=..., ...)` takes any
    Engine option; `rf.Runtime(engine=e)` wraps an engine you already have."""

    def __init__(
        self,
        model_path: str | None = None,
        *,
        engine: Engine | None = None,
        chat_template: ChatTemplate | None = None,
        **engine_config: Any,
    ) -> None:
        if engine is not None and (model_path is not None or engine_config):
            raise ValueError("give either engine= or model_path/engine options, not both")
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else Engine(model_path, **engine_config)
        if self._owns_engine:  # stop the engine thread before the interpreter tears down
            atexit.register(self.shutdown)
        self.tokenizer = self.engine.tokenizer
        self.chat_template = chat_template or chat_template_from_tokenizer(self.tokenizer)

    @property
    def cache_enabled(self) -> bool:
        return not self.engine.config.disable_radix_cache

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def generate(self, prompt: Prompt, args: GenArgs) -> tuple[str | list[str], dict[str, Any]]:
        out = self.engine.generate(prompt.text, args.sampling_params(), **request_options(args))
        text, meta = completion_result(out if isinstance(out, list) else [out])
        if args.return_text_in_logprobs and "n" not in meta:
            with_token_text(meta, self._decode)
        return text, meta

    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        if args.n not in (None, 1):
            raise RequestError("streaming takes n=1; use fork(n) for several samples")
        sent = 0
        for item in self.engine.generate(
            prompt.text, args.sampling_params(), stream=True, **request_options(args)
        ):
            text = item["text"]
            done = item["meta_info"]["finish_reason"] is not None
            if done:
                checked(item)
            if len(text) > sent or done:
                yield text[sent:], item["meta_info"] if done else None
                sent = len(text)

    def select(
        self, prompt: Prompt, choices: list[str], temperature: float, method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        encode = self.tokenizer.encode
        prefix = encode(prompt.text) if prompt.text else []
        full = [encode(prompt.text + c) for c in choices]
        # Score every choice over the same span: from the first token any choice changes (a
        # choice can merge with the prefix's last token), so the rest is the shared prefix.
        start = min(common_prefix_len(prefix, ids) for ids in full)
        if any(len(ids) <= start for ids in full):
            raise RequestError("a select choice adds no tokens to the prompt")
        if prefix and self.cache_enabled:
            checked(self.engine.generate(input_ids=prefix, sampling_params=_PREFILL_ONLY))
        outs = self.engine.generate(
            input_ids=full,
            sampling_params=_PREFILL_ONLY,
            return_logprob=True,
            logprob_start_len=start,
        )
        scored = [
            as_token_logprobs(
                with_token_text(checked(o)["meta_info"], self._decode)["input_token_logprobs"]
            )
            for o in outs
        ]
        unconditional = None
        if method.requires_unconditional_logprobs:
            alone = [ids[start:] for ids in full]
            outs = self.engine.generate(
                input_ids=alone,
                sampling_params=_PREFILL_ONLY,
                return_logprob=True,
                logprob_start_len=0,
            )
            unconditional = [
                without_context(ids, checked(o)["meta_info"]["input_token_logprobs"])
                for ids, o in zip(alone, outs, strict=True)
            ]
        return method(
            choices=choices, input_token_logprobs=scored, unconditional_token_logprobs=unconditional
        )

    def pin_prefix(self, text: str) -> PinnedPrefix | None:
        if not text or not self.cache_enabled:
            return None
        try:
            return self.engine.pin_prefix(text)
        except (ValueError, RuntimeError) as exc:
            raise RequestError(str(exc)) from exc

    def unpin_prefix(self, handle: PinnedPrefix | None) -> None:
        if handle is not None:
            self.engine.unpin_prefix(handle)

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return {
            "model_path": str(self.engine.model_dir),
            "disable_radix_cache": self.engine.config.disable_radix_cache,
            **self.engine.stats,
        }

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
