"""`Runtime`: the in-process backend, an `Engine` in this process shared by every state."""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from radixflow.frontend.backend import (
    Backend,
    Prompt,
    RequestError,
    StreamSlicer,
    as_token_logprobs,
    checked,
    common_prefix_len,
    completion_result,
    request_options,
    with_token_text,
    without_context,
)
from radixflow.frontend.chat_template import ChatTemplate, chat_template_from_tokenizer
from radixflow.frontend.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    call_method,
)
from radixflow.frontend.ir import GenArgs
from radixflow.runtime.chat_templates import check_template_kwargs

if TYPE_CHECKING:  # the engine (torch, transformers) loads when a Runtime is built
    from radixflow.runtime.engine import Engine, PinnedPrefix

_PREFILL_ONLY = {"max_new_tokens": 0}


class Runtime(Backend):
    """`rf.Runtime()` loads the default model; `rf.Runtime(path, dtype=..., ...)` takes any
    Engine option, in our names or SGLang's ServerArgs names; `rf.Runtime(engine=e)` wraps an
    engine you already have.

    As SGLang's `Runtime`, which starts a server: `log_level` sets radixflow's log level, and
    `launch_timeout` is accepted (the engine here loads before the constructor returns).
    `runtime.endpoint` is the runtime itself, so SGLang code reaching for
    `backend.endpoint.get_model_name()` works.

    `chat_template_kwargs` go to the chat template when the roles are rendered, as the chat
    route's `chat_template_kwargs` do (`{"enable_thinking": False}` on Qwen3-style templates).
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        engine: Engine | None = None,
        chat_template: ChatTemplate | str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        log_level: str | None = None,
        launch_timeout: float = 300.0,
        **engine_config: Any,
    ) -> None:
        if engine is not None and (model_path is not None or engine_config):
            raise ValueError("give either engine= or model_path/engine options, not both")
        if not isinstance(launch_timeout, int | float) or launch_timeout <= 0:
            raise ValueError(f"launch_timeout must be a positive number, got {launch_timeout!r}")
        if log_level is not None:
            level = logging.getLevelName(str(log_level).upper())
            if not isinstance(level, int):
                raise ValueError(f"log_level must be a logging level name, got {log_level!r}")
            logging.getLogger("radixflow").setLevel(level)
        if isinstance(chat_template, str):  # a built-in name or a jinja file: the engine's too
            if engine is not None:
                raise ValueError("chat_template by name or file needs the engine's options")
            engine_config["chat_template"], chat_template = chat_template, None
        template_kwargs = check_template_kwargs(chat_template_kwargs)  # before loading
        if chat_template is not None and template_kwargs:
            raise ValueError(
                "chat_template_kwargs apply to a template by name or file, not to a ChatTemplate"
            )
        self._owns_engine = engine is None
        if engine is None:
            from radixflow.runtime.engine import Engine

            engine = Engine(model_path, **engine_config)
        self.engine = engine
        if self._owns_engine:  # stop the engine thread before the interpreter tears down
            atexit.register(self.shutdown)
        self.tokenizer = self.engine.tokenizer
        self.chat_template = chat_template or chat_template_from_tokenizer(
            self.tokenizer, chat_template_kwargs=template_kwargs
        )

    @property
    def endpoint(self) -> Runtime:
        return self

    def get_model_name(self) -> str:
        return str(self.engine.model_dir)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def cache_enabled(self) -> bool:
        return not self.engine.config.disable_radix_cache

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def generate(
        self,
        prompt: Prompt | str | list[str],
        args: GenArgs | dict[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """The interpreter's call (a Prompt and GenArgs), or SGLang's `Runtime.generate(prompt,
        sampling_params, return_logprob=..., ...)`, which returns the response as JSON text."""
        if not isinstance(prompt, Prompt):
            return json.dumps(self.engine.generate(prompt, args, **options))
        if not isinstance(args, GenArgs):
            raise TypeError("Runtime.generate(Prompt, ...) takes GenArgs")
        out = self.engine.generate(prompt.text, args.sampling_params(), **request_options(args))
        text, meta = completion_result(out if isinstance(out, list) else [out])
        if args.return_text_in_logprobs and "n" not in meta:
            with_token_text(meta, self._decode)
        return text, meta

    async def async_generate(
        self, prompt: str, sampling_params: dict[str, Any] | None = None
    ) -> AsyncIterator[str]:
        """SGLang's `Runtime.async_generate`: the new text of `prompt`'s completion as it comes."""
        slicer = StreamSlicer()
        async for item in await self.engine.async_generate(prompt, sampling_params, stream=True):
            delta, _ = slicer.step(item["text"], checked(item)["meta_info"])
            if delta:
                yield delta

    add_request = async_generate

    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        if args.n not in (None, 1):
            raise RequestError("streaming takes n=1; use fork(n) for several samples")
        slicer = StreamSlicer()
        for item in self.engine.generate(
            prompt.text, args.sampling_params(), stream=True, **request_options(args)
        ):
            if item["meta_info"]["finish_reason"] is not None:
                checked(item)
            delta, meta = slicer.step(item["text"], item["meta_info"])
            if args.return_text_in_logprobs:
                with_token_text(meta, self._decode)
            yield delta, meta

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
        return call_method(method, choices, scored, unconditional)

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
