"""Between OpenAI's shapes and the engine's: request -> sampling params, result -> choices.

Shared by the chat, completions and responses routes: the served model check, the sampling
params of a request (`response_format` and tool plans become JSON Schemas), `usage` with
radix-cache hits, finish reasons (an aborted run becomes an error, never a `finish_reason`
outside OpenAI's enum), and tokens named as OpenAI shows them in logprobs.
"""

from __future__ import annotations

import json
from typing import Any

from radixflow.runtime.io_struct import AbortCause, FinishReason, GenerateInput
from radixflow.runtime.server.engine_client import ServerContext
from radixflow.runtime.server.errors import APIError, OpenAIError, error_body
from radixflow.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
)
from radixflow.runtime.server.openai_tools import ToolPlan
from radixflow.runtime.server.wire import sse

# engine field name -> OpenAI field name, for errors
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def check_model(ctx: ServerContext, model: str) -> str:
    """The requested model name when this server serves it; a 404 `model_not_found` if not."""
    if model not in ctx.model_names:
        raise OpenAIError(
            f"the model {model!r} does not exist; this server serves "
            + ", ".join(repr(n) for n in ctx.model_names),
            404,
            code="model_not_found",
            param="model",
            type="not_found_error",
        )
    return model


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, max_new: int | None
) -> dict[str, Any]:
    """The engine's sampling-params dict for an OpenAI request."""
    p: dict[str, Any] = {
        "min_new_tokens": body.min_tokens,
        "n": body.n,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "presence_penalty": body.presence_penalty or 0.0,
        "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens,
        "spaces_between_special_tokens": body.spaces_between_special_tokens,
        "no_stop_trim": body.no_stop_trim,
    }
    if max_new is not None:
        p["max_new_tokens"] = max_new
    optional = (
        "stop", "stop_token_ids", "seed", "temperature", "top_p", "top_k", "min_p",
        "repetition_penalty", "logit_bias", "regex", "ebnf", "json_schema",
    )  # fmt: skip
    for name in optional:
        value = getattr(body, name)
        if value is not None:
            p[name] = value
    if p.get("top_p") == 0:  # OpenAI allows 0; the engine's top_p must be positive
        del p["top_p"]
        p["top_k"] = 1
    if body.response_format is not None:
        schema = response_schema(body.response_format)
        if schema is not None:
            p["json_schema"] = schema
    return p


def response_schema(fmt: ResponseFormat) -> str | None:
    """The JSON Schema text a `response_format` constrains the output to (None: free text)."""
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(
            "response_format of type json_schema needs json_schema.schema",
            param="response_format.json_schema",
        )
    return json.dumps(fmt.json_schema.schema_)


def usage(batch: GenerateInput, results: list[dict]) -> dict[str, Any]:
    """Prompt tokens count once per prompt (not per sample); completion tokens per sample."""
    prompt, cached = {}, {}
    for sub, r in zip(batch.items, results, strict=True):
        meta = r["meta_info"]
        prompt[sub.prompt_index] = meta["prompt_tokens"]
        cached[sub.prompt_index] = max(
            cached.get(sub.prompt_index, 0), meta.get("cached_tokens", 0)
        )
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    return {
        "prompt_tokens": sum(prompt.values()),
        "completion_tokens": completion,
        "total_tokens": sum(prompt.values()) + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached.values())},
    }


def finish(meta: dict) -> str | None:
    """OpenAI's finish reason (`stop` or `length`); an aborted run raises its error."""
    reason = meta["finish_reason"]
    if reason is None:
        return None
    if aborted(meta):
        raise abort_error(meta)
    return reason["type"]


def aborted(meta: dict) -> bool:
    reason = meta["finish_reason"]
    return reason is not None and reason["type"] == "abort"


def abort_error(meta: dict) -> OpenAIError:
    """The error an aborted engine run answers with: the request's own fault (a grammar
    budget, a prompt too large for the KV pool) is a 400, the server's a 5xx."""
    reason = FinishReason.from_dict(meta["finish_reason"])
    message = reason.message or "the request was aborted"
    kind = "invalid_request_error" if reason.cause is AbortCause.REQUEST else "server_error"
    return OpenAIError(message, reason.cause.status, code=reason.cause.err_type, type=kind)


def error_event(meta: dict) -> str:
    """The server-sent event that ends a stream whose engine run aborted."""
    return sse(error_body(abort_error(meta)))


def plan_schema(plan: ToolPlan) -> str:
    """The JSON Schema text a tool plan constrains the reply to."""
    return json.dumps(plan.schema())


def token_bytes(ctx: ServerContext, token_id: int) -> bytes:
    """The token's own bytes: a piece of a multi-byte character is that piece, not U+FFFD."""
    raw = ctx.engine.grammars.compiler.index.token_bytes
    data = raw[token_id] if 0 <= token_id < len(raw) else None
    return data if data is not None else ctx.client.token_text(token_id).encode()


def token_name(ctx: ServerContext, token_id: int) -> str:
    """A token as OpenAI shows it: its text, or `bytes:\\xNN...` when its bytes are only part
    of a UTF-8 character."""
    data = token_bytes(ctx, token_id)
    try:
        data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    return ctx.client.token_text(token_id)
