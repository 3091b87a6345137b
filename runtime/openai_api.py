"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Responses, stream chunks and errors have the shapes of OpenAI's OpenAPI description; the
`openai` client reads them unchanged. `usage.prompt_tokens_details.cached_tokens` reports
radix-cache hits. A request whose engine run aborts (a grammar budget, shutdown) gets an error
response (an error event when streaming), never a `finish_reason` outside OpenAI's enum.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from jinja2 import TemplateError

from radixflow.runtime.chat_templates import render_chat
from radixflow.runtime.io_struct import AbortCause, FinishReason, GenerateInput
from radixflow.runtime.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
)
from radixflow.runtime.openai_tools import ChatReply, ToolPlan, history_message
from radixflow.runtime.serving import (
    APIError,
    EngineStream,
    LogprobArgs,
    ServerContext,
    SSEResponse,
    sse,
)

router = APIRouter()

# engine field name -> OpenAI field name, for errors
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


class OpenAIError(APIError):
    """An APIError with OpenAI's string `code` (`model_not_found`, ...)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, **kw: Any):
        super().__init__(message, status, **kw)
        self.code = code


def error_body(err: APIError) -> dict[str, Any]:
    """OpenAI's error object: `code` is a string or null (the native routes use the status)."""
    code = getattr(err, "code", None)
    return {"error": {**err.body()["error"], "code": code}}


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


def _model_card(ctx: ServerContext, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": ctx.started,
        "owned_by": "radixflow",
        "root": ctx.model_path,
        "max_model_len": ctx.engine.context_length,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    ctx: ServerContext = request.app.state.ctx
    return {"object": "list", "data": [_model_card(ctx, n) for n in ctx.model_names]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    ctx: ServerContext = request.app.state.ctx
    return _model_card(ctx, check_model(ctx, model_id))


@router.post("/v1/embeddings")
async def embeddings() -> None:
    raise APIError("embeddings are not supported: this server serves generation models only")


# -- completions ----------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    ctx: ServerContext = request.app.state.ctx
    model = check_model(ctx, body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise APIError("best_of other than n is not supported", param="best_of")
    if body.suffix:
        raise APIError("suffix (text insertion) is not supported", param="suffix")
    if body.echo and body.stream:
        raise APIError("echo is not supported with stream", param="echo")
    prompts = await _completion_prompts(ctx, body.prompt)
    params = sampling_params(body, body.max_tokens)
    batch = ctx.client.build(prompts, params, body.rid, OPENAI_NAMES, "prompt")
    logprob = LogprobArgs(
        return_logprob=body.logprobs is not None,
        top_logprobs_num=body.logprobs or 0,
        logprob_start_len=0 if body.echo and body.logprobs is not None else None,
    )
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        chunks = await ctx.client.stream(batch, logprob)
        stream = _completion_stream(ctx, body, model, batch, chunks, rid, created)
        return SSEResponse(stream, chunks)
    results = await ctx.client.generate(batch, logprob, request)
    choices = []
    for i, (sub, r) in enumerate(zip(batch.items, results, strict=True)):
        text, meta = r["text"], r["meta_info"]
        lp = None
        if body.logprobs is not None:
            lp = _completion_logprobs(ctx, meta, bool(body.echo), sub.input_ids)
        if body.echo:
            text = ctx.client.detokenize(sub.input_ids) + text
        choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finish(meta)})
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(batch, results),
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
    model: str,
    batch: GenerateInput,
    chunks: EngineStream,
    rid: str,
    created: int,
) -> AsyncIterator[str]:
    sent_chars = [0] * len(batch.items)
    sent_tokens = [0] * len(batch.items)
    results: list[dict | None] = [None] * len(batch.items)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base = {"id": rid, "object": "text_completion", "created": created, "model": model}
    async for i, item in chunks:
        meta = item["meta_info"]
        if aborted(meta):
            yield error_event(meta)
            break
        delta = item["text"][sent_chars[i] :]
        sent_chars[i] = max(sent_chars[i], len(item["text"]))
        reason = finish(meta)
        lp = None
        if body.logprobs is not None:
            lp = _completion_logprobs(ctx, meta, False, [], start=sent_tokens[i])
            sent_tokens[i] = len(meta.get("output_token_logprobs", []))
        if not delta and reason is None and not (lp and lp["tokens"]):
            continue
        choice = {"index": i, "text": delta, "logprobs": lp, "finish_reason": reason}
        yield sse({**base, "choices": [choice], **({"usage": None} if include_usage else {})})
        if reason is not None:
            results[i] = item
    if include_usage and all(r is not None for r in results):
        yield sse({**base, "choices": [], "usage": usage(batch, results)})
    yield "data: [DONE]\n\n"


def _completion_logprobs(
    ctx: ServerContext, meta: dict, echo: bool, prompt_ids: list[int], start: int = 0
) -> dict[str, Any]:
    """Completion logprobs from output entry `start` on (and the prompt's first, with echo);
    `text_offset` counts characters of the whole text, so stream chunks continue it."""
    entries = list(meta.get("output_token_logprobs", []))
    tops = list(meta.get("output_top_logprobs", []))
    if echo:
        prompt_lps = meta.get("input_token_logprobs", [])
        entries = [(lp, t, None) for (lp, t, _) in prompt_lps] + entries
        tops = list(meta.get("input_top_logprobs", [None] * len(prompt_lps))) + tops
    offsets = _text_offsets(ctx, [t for _, t, _ in entries])[start:]
    entries, tops = entries[start:], tops[start:]
    top = None
    if tops:
        top = [
            None if row is None else {token_name(ctx, t): lp for lp, t, _ in row} for row in tops
        ]
    return {
        "tokens": [token_name(ctx, t) for _, t, _ in entries],
        "token_logprobs": [lp for lp, _, _ in entries],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _text_offsets(ctx: ServerContext, token_ids: list[int]) -> list[int]:
    """Where each token starts in the decoded text, in characters: a token holding the tail
    of a multi-byte character starts where that character does."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, chars = [], 0
    for t in token_ids:
        offsets.append(chars)
        chars += len(decoder.decode(token_bytes(ctx, t)))
    return offsets


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


# -- chat completions -----------------------------------------------------------------------
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


# -- shared ---------------------------------------------------------------------------------
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
