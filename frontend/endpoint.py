"""`RuntimeEndpoint`: a backend over SGLang's native HTTP API (our server or an SGLang server).

POST /generate {text | input_ids, sampling_params, return_logprob, logprob_start_len,
top_logprobs_num, stream}; streaming answers are SSE lines `data: {...}` and `data: [DONE]`,
each chunk with the cumulative text, or only its new text when the server runs with
`--incremental-streaming-output` (its /get_server_info says so). GET /get_model_info names the
model, whose tokenizer renders the chat template: the server's own (`chat_template`, which
carries its `--chat-template` override) where it sends one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx

from radixflow.frontend.backend import (
    Backend,
    Prompt,
    RequestError,
    StreamSlicer,
    as_token_logprobs,
    checked,
    completion_result,
    request_options,
    without_context,
)
from radixflow.frontend.chat_template import (
    PLAIN_TEMPLATE,
    ChatTemplate,
    chat_template_from_tokenizer,
)
from radixflow.frontend.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    call_method,
)
from radixflow.frontend.ir import GenArgs
from radixflow.runtime.chat_templates import check_template_kwargs

logger = logging.getLogger(__name__)

_PREFILL_ONLY = {"max_new_tokens": 0}


class RuntimeEndpoint(Backend):
    """`RuntimeEndpoint("http://127.0.0.1:30000")`, SGLang's arguments: `api_key`, `verify`
    (a CA bundle path for https, or False), `chat_template_name` (a built-in template name or a
    jinja file, rendered with the served model's tokenizer). Without it the roles follow the
    server's effective template (its `--chat-template` override too), else the served model's
    own. `chat_template=` (a ChatTemplate) overrides all of these; `chat_template_kwargs` go to
    the template (`{"enable_thinking": False}`)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: str | bool | None = None,
        chat_template_name: str | None = None,
        *,
        chat_template: ChatTemplate | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        timeout: float | None = 600.0,
    ) -> None:
        template_kwargs = check_template_kwargs(chat_template_kwargs)
        if chat_template is not None and (template_kwargs or chat_template_name is not None):
            raise ValueError(
                "chat_template (a ChatTemplate) excludes chat_template_name and "
                "chat_template_kwargs"
            )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.verify = verify
        self.client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            verify=True if verify is None else verify,
        )
        self.model_info = self._get("/get_model_info")
        self.chat_template = chat_template or self._load_chat_template(
            chat_template_name, template_kwargs
        )
        self._incremental: bool | None = None  # the server's streaming mode, read when needed

    # -- HTTP ----------------------------------------------------------------------------------
    def _get(self, path: str) -> dict[str, Any]:
        return self._checked_response(self._call(lambda: self.client.get(path)))

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self._checked_response(self._call(lambda: self.client.post(path, json=body)))

    def _call(self, send) -> httpx.Response:
        try:
            return send()
        except httpx.HTTPError as exc:
            raise RequestError(f"cannot reach {self.base_url}: {exc}") from exc

    @staticmethod
    def _checked_response(resp: httpx.Response) -> Any:
        if resp.status_code != 200:
            raise RequestError(f"{resp.request.url} answered {resp.status_code}: {resp.text}")
        return resp.json() if resp.content else {}

    def _load_chat_template(
        self, name: str | None, template_kwargs: dict[str, Any]
    ) -> ChatTemplate:
        path = self.model_info.get("tokenizer_path") or self.model_info.get("model_path")
        needs = None  # what asks for the served tokenizer: then failing to load it is an error
        if name is not None:
            needs = f"chat_template_name {name!r}"
        elif template_kwargs:
            needs = "chat_template_kwargs"
        if not path:
            if needs is not None:
                raise ValueError(f"{needs}: the server names no tokenizer to render it")
            return PLAIN_TEMPLATE
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            if needs is not None:
                raise ValueError(
                    f"{needs} needs the served tokenizer {path}, which cannot be loaded here "
                    f"({exc}); pass chat_template= instead"
                ) from exc
            logger.warning(
                "cannot load tokenizer %s here (%s); using the plain template", path, exc
            )
            return PLAIN_TEMPLATE
        served = self.model_info.get("chat_template")
        if name is None and isinstance(served, str) and served:
            tokenizer.chat_template = served
        return chat_template_from_tokenizer(tokenizer, name, template_kwargs)

    def _incremental_stream(self) -> bool:
        """Whether the server streams only each chunk's new text (SGLang's
        --incremental-streaming-output), from its /get_server_info; False where it says not."""
        if self._incremental is None:
            try:
                info = self._get("/get_server_info")
            except RequestError as exc:
                logger.warning("cannot read the server's streaming mode (%s): cumulative", exc)
                info = {}
            self._incremental = bool(info.get("incremental_streaming_output", False))
        return self._incremental

    # -- Backend ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt, args: GenArgs) -> tuple[str | list[str], dict[str, Any]]:
        out = self._post("/generate", self._body(prompt.text, args))
        return completion_result(out if isinstance(out, list) else [out])

    def generate_stream(self, prompt: Prompt, args: GenArgs) -> Iterator[tuple[str, dict | None]]:
        if args.n not in (None, 1):
            raise RequestError("streaming takes n=1; use fork(n) for several samples")
        body = {**self._body(prompt.text, args), "stream": True}
        slicer = StreamSlicer(incremental=self._incremental_stream())
        last: dict[str, Any] | None = None
        with self._call(lambda: self.client.stream("POST", "/generate", json=body)) as resp:
            if resp.status_code != 200:
                raise RequestError(f"/generate answered {resp.status_code}: {resp.read().decode()}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                last = json.loads(data)
                if "error" in last:
                    raise RequestError(f"/generate failed while streaming: {last['error']}")
                if last["meta_info"].get("finish_reason") is not None:
                    checked(last)
                yield slicer.step(last["text"], last["meta_info"])
        if last is None:
            raise RequestError("/generate streamed no output")

    def _body(self, text: str, args: GenArgs) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text, "sampling_params": args.sampling_params()}
        body.update(request_options(args))
        if args.return_text_in_logprobs:
            body["return_text_in_logprobs"] = True
        return body

    def select(
        self, prompt: Prompt, choices: list[str], temperature: float, method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        # The prefix's token count (and its KV, cached for the choices to share).
        prefix_len = checked(
            self._post("/generate", {"text": prompt.text, "sampling_params": _PREFILL_ONLY})
        )["meta_info"]["prompt_tokens"]
        # Logprobs from the prefix's last token on; a choice that merges with that token
        # changes it, and then every choice is scored from there (as Runtime does).
        outs = self._post(
            "/generate",
            {
                "text": [prompt.text] + [prompt.text + c for c in choices],
                "sampling_params": _PREFILL_ONLY,
                "return_logprob": True,
                "logprob_start_len": prefix_len - 1,
            },
        )
        lists = [as_token_logprobs(checked(o)["meta_info"]["input_token_logprobs"]) for o in outs]
        last_token = lists[0][-1][1]
        merged = any(tokens[0][1] != last_token for tokens in lists[1:])
        scored = [tokens if merged else tokens[1:] for tokens in lists[1:]]
        if any(not tokens for tokens in scored):
            raise RequestError("a select choice adds no tokens to the prompt")
        unconditional = None
        if method.requires_unconditional_logprobs:
            alone = [[t for _, t, _ in tokens] for tokens in scored]
            outs = self._post(
                "/generate",
                {
                    "input_ids": alone,
                    "sampling_params": _PREFILL_ONLY,
                    "return_logprob": True,
                    "logprob_start_len": 0,
                },
            )
            unconditional = [
                without_context(ids, checked(o)["meta_info"]["input_token_logprobs"])
                for ids, o in zip(alone, outs, strict=True)
            ]
        return call_method(method, choices, scored, unconditional)

    def pin_prefix(self, text: str) -> None:
        """SGLang's HTTP API has no pins: the prefix is computed once and cached as a hint."""
        if text:
            checked(self._post("/generate", {"text": text, "sampling_params": _PREFILL_ONLY}))

    def flush_cache(self) -> None:
        self._call(lambda: self.client.post("/flush_cache"))

    def get_server_info(self) -> dict[str, Any]:
        return self._get("/get_server_info")

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path", ""))

    def get_model_info(self) -> dict[str, Any]:
        return dict(self.model_info)

    def shutdown(self) -> None:
        self.client.close()
