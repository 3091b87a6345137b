"""POST /v1/responses: OpenAI's Responses API over the chat-completions machinery.

A request becomes a chat request (instructions -> system message, input items -> messages,
function_call / function_call_output items -> assistant tool calls and tool messages,
`text.format` -> response_format, function tools -> tools), runs like one, and its result is
written as a `Response` object: a `message` item with `output_text`, or `function_call` items.

Stateless: nothing is stored, so `previous_response_id`, `conversation`, `prompt` and
`background` are refused by name (HTTP 400); `store` is accepted and keeps nothing.
Streaming sends the Responses event sequence:

    response.created, response.in_progress,
    per output item: output_item.added, [content_part.added, output_text.delta..., output_text.done,
                     content_part.done | function_call_arguments.delta, ...arguments.done],
                     output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from radixflow.runtime.io_struct import GenerateInput
from radixflow.runtime.openai_api import (
    abort_error,
    aborted,
    chat_message,
    check_model,
    finish,
    prepare_chat,
    usage,
)
from radixflow.runtime.openai_protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionDef,
    JsonSchemaFormat,
    MessageItem,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ResponsesAllowedTools,
    ResponsesRequest,
    Tool,
    ToolCall,
    allow_only,
)
from radixflow.runtime.openai_tools import ChatReply, ToolPlan
from radixflow.runtime.serving import (
    APIError,
    EngineStream,
    LogprobArgs,
    ServerContext,
    SSEResponse,
    json_text,
)

router = APIRouter()

_STATEFUL = ("previous_response_id", "conversation", "prompt", "background")


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request):
    ctx: ServerContext = request.app.state.ctx
    model = check_model(ctx, body.model)
    for name in _STATEFUL:
        if getattr(body, name):
            raise APIError(
                f"{name} is not supported: this server is stateless and stores no responses",
                param=name,
            )
    if body.top_logprobs:
        raise APIError("top_logprobs is not supported on /v1/responses", param="top_logprobs")
    chat = to_chat_request(body)
    plan, reply, batch = await prepare_chat(ctx, chat)
    shell = _ResponseShell(body, model, not ctx.engine.config.disable_radix_cache)
    if body.stream:
        chunks = await ctx.client.stream(batch, LogprobArgs())
        return SSEResponse(_stream(shell, chat, plan, reply, batch, chunks), chunks)
    results = await ctx.client.generate(batch, LogprobArgs(), request)
    r = results[0]
    message, reason = chat_message(chat, plan, r["text"], finish(r["meta_info"]), reply)
    return shell.whole(_output_items(message, reason), reason, usage(batch, results))


def to_chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat-completions request a Responses request stands for."""
    messages: list[ChatMessage] = []
    if body.instructions:
        messages.append(ChatMessage(role="system", content=body.instructions))
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else []
    for item in items or body.input:
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and last.tool_calls:
                last.tool_calls.append(call)  # parallel calls: one assistant message
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text())
            )
        # a ReasoningItem sent back is not shown to the model again
    if not messages:
        raise APIError("input must hold at least one message", param="input")
    tools = None
    if body.tools:
        tools = [
            Tool(
                type="function",
                function=FunctionDef(
                    name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
                ),
            )
            for t in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, ResponsesAllowedTools):
        names = [t.name for t in choice.tools]
        try:
            tools = allow_only(tools, names, "tool_choice.tools")
        except ValueError as exc:
            raise APIError(str(exc), param="tool_choice") from None
        choice = choice.mode
    elif choice is not None and not isinstance(choice, str):
        choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    one_call = body.max_tool_calls == 1
    return ChatCompletionRequest(
        model=body.model,
        messages=messages,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False and not one_call,
        response_format=_response_format(body),
    )


def _response_format(body: ResponsesRequest) -> ResponseFormat | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.schema_ is None:
        raise APIError("text.format of type json_schema needs schema", param="text.format.schema")
    spec = JsonSchemaFormat(
        name=fmt.name or "output", description=fmt.description, schema=fmt.schema_
    )
    return ResponseFormat(type="json_schema", json_schema=spec)


def _output_items(message: dict[str, Any], reason: str | None) -> list[dict[str, Any]]:
    """The Response's output items for a chat reply: its reasoning (with a reasoning parser),
    then its function calls or its message."""
    items = []
    if message.get("reasoning_content"):
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
                "status": "completed",
            }
        )
    return items + _answer_items(message, reason)


def _answer_items(message: dict[str, Any], reason: str | None) -> list[dict[str, Any]]:
    if message.get("tool_calls"):
        return [
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
                "status": "completed",
            }
            for c in message["tool_calls"]
        ]
    status = "incomplete" if reason == "length" else "completed"
    return [_message_item(f"msg_{uuid.uuid4().hex}", message["content"] or "", status)]


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _ResponseShell:
    """The fields of a Response that come from the request, and its id and time."""

    def __init__(self, body: ResponsesRequest, model: str, cache_writes: bool) -> None:
        self.body = body
        self.model = model
        self.cache_writes = cache_writes
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def build(
        self,
        status: str,
        output: list[dict[str, Any]],
        use: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        cache_writes: bool = True,
    ) -> dict[str, Any]:
        body = self.body
        choice = body.tool_choice
        fmt = body.text.format if body.text and body.text.format else None
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": bool(body.store),
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {
                "format": (
                    fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
                )
            },
            "tool_choice": (
                "auto"
                if choice is None
                else choice
                if isinstance(choice, str)
                else choice.model_dump()
            ),
            "tools": [t.model_dump() for t in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": "disabled",
        }
        if body.user is not None:
            out["user"] = body.user
        if use is not None:
            cached = use["prompt_tokens_details"]["cached_tokens"]
            out["usage"] = {
                "input_tokens": use["prompt_tokens"],
                "input_tokens_details": {
                    "cached_tokens": cached,
                    # the radix cache keeps every prompt token it did not already hold
                    "cache_write_tokens": use["prompt_tokens"] - cached if cache_writes else 0,
                },
                "output_tokens": use["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": use["total_tokens"],
            }
        return out

    def whole(
        self, output: list[dict[str, Any]], reason: str | None, use: dict[str, Any]
    ) -> dict[str, Any]:
        status = "incomplete" if reason == "length" else "completed"
        return self.build(status, output, use, cache_writes=self.cache_writes)


class _Events:
    """Numbered server-sent events of one Responses stream."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json_text(payload)}\n\n"


async def _stream(
    shell: _ResponseShell,
    chat: ChatCompletionRequest,
    plan: ToolPlan | None,
    reply: ChatReply | None,
    batch: GenerateInput,
    chunks: EngineStream,
) -> AsyncIterator[str]:
    event = _Events()
    # tool calls and replies in the model's own formats are sent whole, once complete
    live = plan is None and reply is None
    yield event("response.created", response=shell.build("in_progress", []))
    yield event("response.in_progress", response=shell.build("in_progress", []))
    item_id = f"msg_{uuid.uuid4().hex}"
    sent = 0
    async for _, item in chunks:
        meta = item["meta_info"]
        if aborted(meta):
            err = abort_error(meta)
            yield event("error", code=err.code, message=err.message, param=err.param)
            failed = {"code": "server_error", "message": err.message}
            yield event("response.failed", response=shell.build("failed", [], error=failed))
            return
        if live and sent == 0 and item["text"]:
            yield event(
                "response.output_item.added",
                output_index=0,
                item=_message_item(item_id, None, "in_progress"),
            )
            yield event(
                "response.content_part.added",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part=_text_part(""),
            )
        if live and len(item["text"]) > sent:
            yield event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=0,
                content_index=0,
                delta=item["text"][sent:],
                logprobs=[],
            )
            sent = len(item["text"])
        if meta["finish_reason"] is None:
            continue
        message, reason = chat_message(chat, plan, item["text"], finish(meta), reply)
        output = _output_items(message, reason)
        if live:
            output[0]["id"] = item_id
            for ev in _text_item_tail(event, output[0], started=sent > 0):
                yield ev
        else:
            for index, out in enumerate(output):
                for ev in _whole_item(event, index, out):
                    yield ev
        final = shell.whole(output, reason, usage(batch, [item]))
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield event(kind, response=final)
        return


def _text_item_tail(event: _Events, out: dict[str, Any], started: bool) -> list[str]:
    """The events that close a streamed message item (and open it, when no text came)."""
    text = out["content"][0]["text"]
    where = {"item_id": out["id"], "output_index": 0, "content_index": 0}
    events = []
    if not started:
        events.append(
            event(
                "response.output_item.added",
                output_index=0,
                item=_message_item(out["id"], None, "in_progress"),
            )
        )
        events.append(event("response.content_part.added", **where, part=_text_part("")))
    events.append(event("response.output_text.done", **where, text=text, logprobs=[]))
    events.append(event("response.content_part.done", **where, part=out["content"][0]))
    events.append(event("response.output_item.done", output_index=0, item=out))
    return events


def _whole_item(event: _Events, index: int, out: dict[str, Any]) -> list[str]:
    """The events of an output item sent once complete (function calls, reasoning, and
    answers read by a tool or reasoning parser)."""
    if out["type"] == "reasoning":
        return [
            event("response.output_item.added", output_index=index, item=out),
            event("response.output_item.done", output_index=index, item=out),
        ]
    if out["type"] == "message":
        added = {**out, "status": "in_progress", "content": []}
        events = [event("response.output_item.added", output_index=index, item=added)]
        where = {"item_id": out["id"], "output_index": index, "content_index": 0}
        part = out["content"][0]
        events.append(event("response.content_part.added", **where, part=_text_part("")))
        events.append(event("response.output_text.delta", **where, delta=part["text"], logprobs=[]))
        events.append(event("response.output_text.done", **where, text=part["text"], logprobs=[]))
        events.append(event("response.content_part.done", **where, part=part))
        events.append(event("response.output_item.done", output_index=index, item=out))
        return events
    added = {**out, "arguments": "", "status": "in_progress"}
    where = {"item_id": out["id"], "output_index": index}
    return [
        event("response.output_item.added", output_index=index, item=added),
        event("response.function_call_arguments.delta", **where, delta=out["arguments"]),
        event(
            "response.function_call_arguments.done",
            **where,
            name=out["name"],
            arguments=out["arguments"],
        ),
        event("response.output_item.done", output_index=index, item=out),
    ]
