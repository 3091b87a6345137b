"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Responses and stream chunks have OpenAI's shapes; the `openai` client reads them unchanged.
`usage.prompt_tokens_details.cached_tokens` reports radix-cache hits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from jinja2 import TemplateError

from radixflow.runtime.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
)
from radixflow.runtime.openai_tools import ToolPlan, history_message
from radixflow.runtime.serving import (
    APIError,
    Batch,
    EngineStream,
    LogprobArgs,
    ServerContext,
    SSEResponse,
    sse,
)

router = APIRouter()

# engine field name -> OpenAI field name, for errors
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    ctx: ServerContext = request.app.state.ctx
    return {
        "object": "list",
        "data": [
            {
                "id": ctx.served_model_name,
                "object": "model",
                "created": ctx.started,
                "owned_by": "radixflow",
                "root": ctx.model_path,
                "max_model_len": ctx.engine.context_length,
            }
        ],
    }


@router.post("/v1/embeddings")
async def embeddings() -> None:
    raise APIError("embeddings are not supported: this server serves generation models only")


# -- completions ----------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    ctx: ServerContext = request.app.state.ctx
    if body.best_of is not None and body.best_of != body.n:
        raise APIError("best_of other than n is not supported", param="best_of")
    if body.echo and body.stream:
        raise APIError("echo is not supported with stream", param="echo")
    prompts = await _completion_prompts(ctx, body.prompt)
    params = _sampling(body, body.max_tokens)
    batch = ctx.client.build(prompts, [params] * len(prompts), body.rid, _OPENAI_NAMES)
    logprob = LogprobArgs(
        return_logprob=body.logprobs is not None,
        top_logprobs_num=body.logprobs or 0,
        logprob_start_len=0 if body.echo and body.logprobs is not None else None,
    )
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        chunks = await ctx.client.stream(batch, logprob)
        return SSEResponse(_completion_stream(ctx, body, batch, chunks, rid, created), chunks)
    results = await ctx.client.generate(batch, logprob, request)
    choices = []
    for i, (sub, r) in enumerate(zip(batch.subs, results, strict=True)):
        text, meta = r["text"], r["meta_info"]
        lp = None
        if body.logprobs is not None:
            lp = _completion_logprobs(ctx, meta, body.echo, sub.input_ids)
        if body.echo:
            text = ctx.client.detokenize(sub.input_ids) + text
        choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": _finish(meta)})
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": ctx.served_model_name,
        "choices": choices,
        "usage": _usage(batch, results),
    }


async def _completion_prompts(ctx: ServerContext, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise APIError("prompt must not be empty", param="prompt")
    return [
        ctx.client.check_ids(
            p if isinstance(p, list) else await ctx.client.tokenize(p, "prompt"), "prompt"
        )
        for p in prompt
    ]


async def _completion_stream(
    ctx: ServerContext,
    body: CompletionRequest,
    batch: Batch,
    chunks: EngineStream,
    rid: str,
    created: int,
) -> AsyncIterator[str]:
    sent_chars = [0] * len(batch.subs)
    sent_tokens = [0] * len(batch.subs)
    results: list[dict | None] = [None] * len(batch.subs)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": ctx.served_model_name,
    }
    async for i, item in chunks:
        meta = item["meta_info"]
        if _engine_failed(meta):
            yield sse({"error": _engine_error(meta).body()["error"]})
            break
        delta = item["text"][sent_chars[i] :]
        sent_chars[i] = max(sent_chars[i], len(item["text"]))
        finish = _finish(meta)
        lp = None
        if body.logprobs is not None:
            lp = _completion_logprobs(ctx, meta, False, [], start=sent_tokens[i])
            sent_tokens[i] = len(meta.get("output_token_logprobs", []))
        if not delta and finish is None and not (lp and lp["tokens"]):
            continue
        choice = {"index": i, "text": delta, "logprobs": lp, "finish_reason": finish}
        yield sse({**base, "choices": [choice], **({"usage": None} if include_usage else {})})
        if finish is not None:
            results[i] = item
    if include_usage and all(r is not None for r in results):
        yield sse({**base, "choices": [], "usage": _usage(batch, results)})
    yield "data: [DONE]\n\n"


def _completion_logprobs(
    ctx: ServerContext, meta: dict, echo: bool, prompt_ids: list[int], start: int = 0
) -> dict[str, Any]:
    entries = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:]
    if echo:
        prompt_lps = meta.get("input_token_logprobs", [])
        entries = [(lp, t, None) for (lp, t, _) in prompt_lps] + entries
        tops = list(meta.get("input_top_logprobs", [None] * len(prompt_lps))) + tops
    tokens = [ctx.client.token_text(t) for _, t, _ in entries]
    offsets, pos = [], 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    top = None
    if tops:
        top = [
            None if row is None else {ctx.client.token_text(t): lp for lp, t, _ in row}
            for row in tops
        ]
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _, _ in entries],
        "top_logprobs": top,
        "text_offset": offsets,
    }


# -- chat completions -----------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    ctx: ServerContext = request.app.state.ctx
    if body.top_logprobs and not body.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    plan = ToolPlan.from_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    if plan is not None and (body.response_format or body.regex or body.ebnf or body.json_schema):
        raise APIError("tools cannot be combined with another output constraint", param="tools")
    ids = await _chat_prompt(ctx, body, plan)
    max_new = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    if max_new is None:
        max_new = ctx.engine.context_length - len(ids)
    params = _sampling(body, max_new)
    if plan is not None:
        params["json_schema"] = json.dumps(plan.schema())
    batch = ctx.client.build([ids], [params], body.rid, _OPENAI_NAMES)
    logprob = LogprobArgs(return_logprob=body.logprobs, top_logprobs_num=body.top_logprobs or 0)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        chunks = await ctx.client.stream(batch, logprob)
        return SSEResponse(_chat_stream(ctx, body, plan, batch, chunks, rid, created), chunks)
    results = await ctx.client.generate(batch, logprob, request)
    choices = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        message, finish = _chat_message(plan, r["text"], _finish(meta))
        lp = _chat_logprobs(ctx, meta) if body.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": ctx.served_model_name,
        "choices": choices,
        "usage": _usage(batch, results),
    }


async def _chat_prompt(
    ctx: ServerContext, body: ChatCompletionRequest, plan: ToolPlan | None
) -> list[int]:
    messages = [history_message(m) for m in body.messages]
    if plan is not None:
        note = plan.instructions()
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        else:
            messages.insert(0, {"role": "system", "content": note})
    try:
        text = ctx.engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    except TemplateError as exc:
        raise APIError(
            f"messages: the chat template rejected them: {exc}", param="messages"
        ) from None
    ids = await ctx.client.tokenize(text, "messages", add_special_tokens=False)
    return ctx.client.check_ids(ids, "messages")


def _chat_message(plan: ToolPlan | None, text: str, finish: str | None) -> tuple[dict, str | None]:
    if plan is None:
        return {"role": "assistant", "content": text}, finish
    calls, content = plan.parse(text)
    if calls is None:
        return {"role": "assistant", "content": content}, finish
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"


async def _chat_stream(
    ctx: ServerContext,
    body: ChatCompletionRequest,
    plan: ToolPlan | None,
    batch: Batch,
    chunks: EngineStream,
    rid: str,
    created: int,
) -> AsyncIterator[str]:
    n = len(batch.subs)
    sent_chars, sent_tokens = [0] * n, [0] * n
    results: list[dict | None] = [None] * n
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": ctx.served_model_name,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(i: int, delta: dict, finish: str | None = None, lp: Any = None) -> str:
        choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return sse({**base, "choices": [choice], **extra})

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for i, item in chunks:
        meta = item["meta_info"]
        if _engine_failed(meta):
            yield sse({"error": _engine_error(meta).body()["error"]})
            break
        finish = _finish(meta)
        lp = None
        if body.logprobs:
            lp = _chat_logprobs(ctx, meta, start=sent_tokens[i])
            sent_tokens[i] = len(meta.get("output_token_logprobs", []))
        if plan is not None:  # tool calls are sent whole, once the JSON is complete
            if finish is None:
                continue
            message, finish = _chat_message(plan, item["text"], finish)
            delta = {k: v for k, v in message.items() if k != "role"}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(delta["tool_calls"])]
            yield chunk(i, delta, None, lp)
        else:
            text = item["text"][sent_chars[i] :]
            sent_chars[i] = max(sent_chars[i], len(item["text"]))
            if text or (lp and lp["content"]):
                yield chunk(i, {"content": text}, None, lp)
        if finish is not None:
            results[i] = item
            yield chunk(i, {}, finish)
    if include_usage and all(r is not None for r in results):
        yield sse({**base, "choices": [], "usage": _usage(batch, results)})
    yield "data: [DONE]\n\n"


def _chat_logprobs(ctx: ServerContext, meta: dict, start: int = 0) -> dict[str, Any]:
    entries = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:] or [[] for _ in entries]

    def item(lp: float, t: int) -> dict[str, Any]:
        text = ctx.client.token_text(t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return {
        "content": [
            {**item(lp, t), "top_logprobs": [item(tlp, tt) for tlp, tt, _ in row]}
            for (lp, t, _), row in zip(entries, tops, strict=False)
        ]
    }


# -- shared ---------------------------------------------------------------------------------
def _sampling(
    body: CompletionRequest | ChatCompletionRequest, max_new: int | None
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "min_new_tokens": body.min_tokens,
        "n": body.n,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
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
    if body.response_format is not None:
        schema = _response_schema(body.response_format)
        if schema is not None:
            p["json_schema"] = schema
    return p


def _response_schema(fmt: ResponseFormat) -> str | None:
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


def _usage(batch: Batch, results: list[dict]) -> dict[str, Any]:
    """Prompt tokens count once per prompt (not per sample); completion tokens per sample."""
    prompt, cached = {}, {}
    for sub, r in zip(batch.subs, results, strict=True):
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


def _finish(meta: dict) -> str | None:
    reason = meta["finish_reason"]
    if reason is None:
        return None
    if _engine_failed(meta):
        raise _engine_error(meta)
    return _FINISH[reason["type"]]


def _engine_failed(meta: dict) -> bool:
    reason = meta["finish_reason"]
    return (
        reason is not None
        and reason["type"] == "abort"
        and "engine error" in reason.get("message", "")
    )


def _engine_error(meta: dict) -> APIError:
    return APIError(meta["finish_reason"]["message"], 500, type="server_error")
