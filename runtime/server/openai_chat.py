"""OpenAI's /v1/chat/completions: chat template, tool calls, reasoning, logprobs, streams.

Responses, stream chunks and errors have the shapes of OpenAI's OpenAPI description; the
`openai` client reads them unchanged. `usage.prompt_tokens_details.cached_tokens` reports
radix-cache hits. A request whose engine run aborts (a grammar budget, shutdown) gets an error
response (an error event when streaming). /v1/responses runs through `prepare_chat` and
`chat_message` too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from jinja2 import TemplateError

from radixflow.runtime.chat_templates import render_chat
from radixflow.runtime.io_struct import GenerateInput
from radixflow.runtime.server.engine_client import EngineStream, LogprobArgs, ServerContext
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_convert import (
    OPENAI_NAMES,
    aborted,
    check_model,
    error_event,
    finish,
    plan_schema,
    sampling_params,
    token_bytes,
    token_name,
    usage,
)
from radixflow.runtime.server.openai_protocol import ChatCompletionRequest
from radixflow.runtime.server.openai_tools import ChatReply, ToolPlan, history_message
from radixflow.runtime.server.wire import SSEResponse, sse

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    ctx: ServerContext = request.app.state.ctx
    model = check_model(ctx, body.model)
    if body.top_logprobs and not body.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    plan, reply, batch = await prepare_chat(ctx, body)
    logprob = LogprobArgs(
        return_logprob=bool(body.logprobs), top_logprobs_num=body.top_logprobs or 0
    )
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        chunks = await ctx.client.stream(batch, logprob)
        stream = _chat_stream(ctx, body, model, plan, batch, chunks, rid, created, reply)
        return SSEResponse(stream, chunks)
    results = await ctx.client.generate(batch, logprob, request)
    choices = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        message, reason = chat_message(body, plan, r["text"], finish(meta), reply)
        lp = _chat_logprobs(ctx, meta) if body.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(batch, results),
    }


async def prepare_chat(
    ctx: ServerContext, body: ChatCompletionRequest
) -> tuple[ToolPlan | None, ChatReply | None, GenerateInput]:
    """A chat request's tool plan, reply reader and engine batch (also for /v1/responses)."""
    plan = ToolPlan.from_request(
        body.tools, body.tool_choice, body.parallel_tool_calls is not False
    )
    reply = ChatReply.for_request(
        ctx.engine.config,
        plan,
        body.separate_reasoning,
        body.stream_reasoning,
        body.chat_template_kwargs,
    )
    if reply is not None and reply.tool_parser is not None:
        plan = None  # tool_choice auto: the model's own format, read back by the parser
    if plan is not None and (body.response_format or body.regex or body.ebnf or body.json_schema):
        raise APIError("tools cannot be combined with another output constraint", param="tools")
    ids = await chat_prompt(ctx, body, plan, reply)
    max_new = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    if max_new is None:
        max_new = ctx.engine.context_length - len(ids)
    params = sampling_params(body, max_new)
    if reply is not None:
        params.update(reply.sampling_overrides())
    if plan is not None:
        params["json_schema"] = plan_schema(plan)
    batch = ctx.client.build([ids], params, body.rid, OPENAI_NAMES, "messages", batched=False)
    return plan, reply, batch


async def chat_prompt(
    ctx: ServerContext,
    body: ChatCompletionRequest,
    plan: ToolPlan | None,
    reply: ChatReply | None = None,
) -> list[int]:
    native = reply is not None and reply.tool_parser is not None  # tools go to the template
    messages = [history_message(m, native) for m in body.messages]
    if plan is not None:
        note = plan.instructions()
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        else:
            messages.insert(0, {"role": "system", "content": note})
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []] if native else None
    try:
        text = render_chat(
            ctx.engine.tokenizer,
            messages,
            add_generation_prompt=not body.continue_final_message,
            tools=tools,
            template_kwargs=body.chat_template_kwargs,
        )
        if body.continue_final_message:
            text = _open_final_message(text, messages[-1]["content"])
    except ValueError as exc:  # a reserved chat_template_kwargs key, or no template at all
        param = "chat_template_kwargs" if "chat_template_kwargs" in str(exc) else "messages"
        raise APIError(f"{param}: {exc}", param=param) from None
    except TemplateError as exc:
        raise APIError(
            f"messages: the chat template rejected them: {exc}", param="messages"
        ) from None
    ids = await ctx.client.tokenize(text, "messages", add_special_tokens=False)
    return ctx.client.check_ids(ids, "messages")


def _open_final_message(text: str, final: str) -> str:
    """The prompt cut right after the final message's text, so the model continues that
    message (what transformers' `continue_final_message` does)."""
    if not final or final not in text:
        raise ValueError("continue_final_message needs a final message with text")
    return text[: text.rindex(final) + len(final)]


def chat_message(
    body: ChatCompletionRequest,
    plan: ToolPlan | None,
    text: str,
    reason: str | None,
    reply: ChatReply | None = None,
) -> tuple[dict[str, Any], str | None]:
    """The assistant message and finish reason; a tool call cut short by max_tokens is
    `length` with no content (never the partial JSON). `reply` reads the model's own
    reasoning and tool-call formats."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if plan is None:
        if reply is None:
            return message, reason
        fields, reason = reply.message(text, reason)
        return {**message, **fields}, reason
    calls, content = plan.parse(text)
    if calls is None:
        cut_call = reason == "length" and content == text  # not a (cut) plain answer
        return {**message, "content": None if cut_call else content}, reason
    if body.legacy_functions:
        return {**message, "content": None, "function_call": calls[0]["function"]}, (
            "function_call"
        )
    return {**message, "content": None, "tool_calls": calls}, "tool_calls"


async def _chat_stream(
    ctx: ServerContext,
    body: ChatCompletionRequest,
    model: str,
    plan: ToolPlan | None,
    batch: GenerateInput,
    chunks: EngineStream,
    rid: str,
    created: int,
    reply: ChatReply | None = None,
) -> AsyncIterator[str]:
    n = len(batch.items)
    readers = [reply.stream() if reply is not None else None for _ in range(n)]
    sent_chars, sent_tokens = [0] * n, [0] * n
    results: list[dict | None] = [None] * n
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    extra = {"usage": None} if include_usage else {}

    def chunk(i: int, delta: dict, reason: str | None = None, lp: Any = None) -> str:
        choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}
        return sse({**base, "choices": [choice], **extra})

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for i, item in chunks:
        meta = item["meta_info"]
        if aborted(meta):
            yield error_event(meta)
            break
        reason = finish(meta)
        lp = None
        if body.logprobs:
            lp = _chat_logprobs(ctx, meta, start=sent_tokens[i])
            sent_tokens[i] = len(meta.get("output_token_logprobs", []))
        if plan is not None:  # tool calls are sent whole, once the JSON is complete
            if reason is None:
                continue
            message, reason = chat_message(body, plan, item["text"], reason)
            delta = {k: v for k, v in message.items() if k not in ("role", "refusal")}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(delta["tool_calls"])]
            if delta.get("content") is None:
                delta.pop("content", None)
            if delta or lp:
                yield chunk(i, delta, None, lp)
        elif (reader := readers[i]) is not None:  # reasoning / the model's own tool calls
            delta, reason = reader.feed(item["text"], reason)
            if delta or (lp and lp["content"]):
                yield chunk(i, delta, None, lp)
        else:
            text = item["text"][sent_chars[i] :]
            sent_chars[i] = max(sent_chars[i], len(item["text"]))
            if text or (lp and lp["content"]):
                yield chunk(i, {"content": text}, None, lp)
        if reason is not None:
            results[i] = item
            yield chunk(i, {}, reason)
    if include_usage and all(r is not None for r in results):
        yield sse({**base, "choices": [], "usage": usage(batch, results)})
    yield "data: [DONE]\n\n"


def _chat_logprobs(ctx: ServerContext, meta: dict, start: int = 0) -> dict[str, Any]:
    entries = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:] or [[] for _ in entries]

    def item(lp: float, t: int) -> dict[str, Any]:
        return {"token": token_name(ctx, t), "logprob": lp, "bytes": list(token_bytes(ctx, t))}

    content = [
        {**item(lp, t), "top_logprobs": [item(tlp, tt) for tlp, tt, _ in row]}
        for (lp, t, _), row in zip(entries, tops, strict=False)
    ]
    return {"content": content, "refusal": None}
