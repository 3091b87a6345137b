"""`OpenAI`: a backend over any OpenAI-compatible /v1 server, through the `openai` package.

Chat models take whole messages: a `gen` must open an assistant message, unless the program
runs with `num_api_spec_tokens` (then one request writes each assistant message and its gens
are read out of it: frontend/chat_speculation.py). Completion models continue the text. What the /v1 API has no field for (regex, EBNF, top_k, ...) raises a
RequestError naming it; `select` works on completion models (prompt logprobs via echo).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from radixflow.frontend.backend import Backend, Prompt, RequestError
from radixflow.frontend.chat_template import PLAIN_TEMPLATE, ChatTemplate
from radixflow.frontend.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    TokenLogprobs,
    call_method,
)
from radixflow.frontend.ir import GenArgs

# (field, value that means "off"): set to anything else, the /v1 API cannot honour it
_UNSUPPORTED = (
    ("min_new_tokens", 0),
    ("top_k", -1),
    ("min_p", 0.0),
    ("ignore_eos", False),
    ("stop_token_ids", None),
    ("regex", None),
    ("ebnf", None),
    ("lark", None),
    ("dtype", None),
)


# OpenAI's completion-only models (what SGLang treats as not chat models by default)
INSTRUCT_MODEL_NAMES = ("gpt-3.5-turbo-instruct",)


@dataclass
class TokenUsage:
    """Tokens the backend's requests used so far (SGLang's `backend.token_usage`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0


def _import_openai() -> ModuleType:
    """The `openai` package (an optional extra); without it, an ImportError saying how to add it."""
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            'the OpenAI backend needs the openai package: pip install "radixflow[openai]"'
        ) from exc
    return openai


class OpenAI(Backend):
    """`OpenAI("gpt-4o-mini")`, or `OpenAI(model, base_url="http://host/v1", api_key=...)`.

    SGLang's argument order: `OpenAI(model_name, is_chat_model, chat_template)`; the client's
    own options (base_url, api_key, ...) are keywords. is_chat_model: True uses
    /v1/chat/completions, False /v1/completions; None (default) is True except for OpenAI's
    instruct models. `token_usage` adds up the usage every response reports.
    """

    def __init__(
        self,
        model_name: str,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        openai = _import_openai()
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            **client_kwargs,
        )
        self.model_name = model_name
        if is_chat_model is None:
            is_chat_model = model_name not in INSTRUCT_MODEL_NAMES
        self.is_chat_model = is_chat_model
        self.chat_template = chat_template or PLAIN_TEMPLATE
        self.token_usage = TokenUsage()
        self._usage_lock = threading.Lock()

    def _request(self, prompt: Prompt, args: GenArgs) -> dict[str, Any]:
        for name, off in _UNSUPPORTED:
            value = getattr(args, name)
            if value is not None and value != off:
                raise RequestError(f"the OpenAI backend cannot honour gen's {name}={value!r}")
        if args.json_schema is not None and not self.is_chat_model:
            raise RequestError("the OpenAI backend supports json_schema on chat models only")
        kwargs: dict[str, Any] = {"model": self.model_name}
        for ours, theirs in (
            ("max_new_tokens", "max_tokens"),
            ("stop", "stop"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("frequency_penalty", "frequency_penalty"),
            ("presence_penalty", "presence_penalty"),
            ("n", "n"),
        ):
            if getattr(args, ours) is not None:
                kwargs[theirs] = getattr(args, ours)
        if self.is_chat_model:
            if prompt.role != "assistant" or prompt.role_text:
                raise RequestError(
                    "an OpenAI chat model writes whole assistant messages: put gen at the "
                    "start of an assistant role, e.g. s += assistant(gen('answer')), or run "
                    "the program with @function(num_api_spec_tokens=...)"
                )
            kwargs["messages"] = prompt.messages
            if args.json_schema is not None:
                schema = args.json_schema
                schema = json.loads(schema) if isinstance(schema, str) else schema
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": schema},
                }
            if args.return_logprob:
                kwargs["logprobs"] = True
                if args.top_logprobs_num:
                    kwargs["top_logprobs"] = args.top_logprobs_num
        else:
            kwargs["prompt"] = prompt.text
            if args.return_logprob:
                kwargs["logprobs"] = args.top_logprobs_num or 0
        return kwargs

    def _call(self, create, **kwargs: Any) -> Any:
        import openai

        try:
            resp = create(**kwargs)
        except openai.OpenAIError as exc:
            raise RequestError(f"OpenAI request failed: {exc}") from exc
        self._count(getattr(resp, "usage", None))
        return resp

    def _count(self, usage: Any) -> None:
        if usage is None:
            return
        with self._usage_lock:
            self.token_usage.prompt_tokens += usage.prompt_tokens or 0
            self.token_usage.completion_tokens += usage.completion_tokens or 0

    def generate(self, prompt: Prompt, args: GenArgs) -> tuple[str | list[str], dict[str, Any]]:
        kwargs = self._request(prompt, args)
        api = self.client.chat.completions if self.is_chat_model else self.client.completions
        resp = self._call(api.create, **kwargs)
        texts = [(c.message.content or "") if self.is_chat_model else c.text for c in resp.choices]
        meta = {
            "id": resp.id,
            "prompt_tokens": resp.usage.prompt_tokens if resp.usage else None,
            "completion_tokens": resp.usage.completion_tokens if resp.usage else None,
            "finish_reason": {"type": resp.choices[0].finish_reason},
        }
        return (texts[0] if len(texts) == 1 else texts), meta

    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        if args.n not in (None, 1):
            raise RequestError("streaming takes n=1; use fork(n) for several samples")
        kwargs = self._request(prompt, args)
        api = self.client.chat.completions if self.is_chat_model else self.client.completions
        finish = None
        for chunk in self._call(api.create, stream=True, **kwargs):
            self._count(getattr(chunk, "usage", None))  # the last chunk, when the server sends it
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            delta = (c.delta.content or "") if self.is_chat_model else c.text
            finish = c.finish_reason or finish
            if delta:
                yield delta, None
        yield "", {"finish_reason": {"type": finish}}

    def select(
        self, prompt: Prompt, choices: list[str], temperature: float, method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        if self.is_chat_model:
            raise RequestError(
                "the OpenAI chat API cannot score choices, so select does not work on chat "
                "models; use Runtime or RuntimeEndpoint, or a completion model (is_chat_model=False)"
            )
        scored = self._echo_logprobs([prompt.text + c for c in choices], len(prompt.text))
        unconditional = None
        if method.requires_unconditional_logprobs:
            unconditional = self._echo_logprobs(choices, 0)
            if [len(t) for t in unconditional] != [len(t) for t in scored]:
                raise RequestError(
                    "choices tokenize differently on their own and after the prompt; "
                    "unconditional_likelihood_normalized cannot compare them here"
                )
        return call_method(method, choices, scored, unconditional)

    def _echo_logprobs(self, texts: list[str], start_char: int) -> list[TokenLogprobs]:
        """Prompt logprobs of the tokens of each text from character `start_char` on."""
        resp = self._call(
            self.client.completions.create,
            model=self.model_name,
            prompt=texts,
            max_tokens=1,
            echo=True,
            logprobs=0,
            temperature=0,
        )
        out: list[TokenLogprobs] = [[] for _ in texts]
        for c in resp.choices:
            lp = c.logprobs
            if lp is None or lp.text_offset is None:
                raise RequestError("the server does not return prompt logprobs (echo + logprobs)")
            end = len(texts[c.index])  # the echoed prompt ends here; the sampled token follows
            for token, logprob, offset in zip(
                lp.tokens, lp.token_logprobs, lp.text_offset, strict=True
            ):
                if start_char <= offset < end:
                    out[c.index].append((logprob, -1, token))
        return out

    def pin_prefix(self, text: str) -> None:
        """Nothing to do: an OpenAI-compatible server decides its prompt caching itself."""

    def flush_cache(self) -> None:
        raise RequestError("the OpenAI API has no way to flush a server's cache")

    def get_server_info(self) -> dict[str, Any]:
        return {"model": self.model_name, "base_url": str(self.client.base_url)}

    def shutdown(self) -> None:
        self.client.close()
