"""POST /v1/responses: OpenAI's Responses API over the chat-completions machinery.

A request becomes a chat request (instructions -> system message, input items -> messages,
function_call / function_call_output items -> assistant tool calls and tool messages,
`text.format` -> response_format, function tools -> tools), runs like one, and its result is
written as a `Response` object (responses_output.py holds its shape and stream events).

Stateless: nothing is stored, so `previous_response_id`, `conversation`, `prompt` and
`background` are refused by name (HTTP 400); `store` is accepted and keeps nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from radixflow.runtime.io_struct import GenerateInput
from radixflow.runtime.server.engine_client import EngineStream, LogprobArgs, ServerContext
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_chat import chat_message, prepare_chat
from radixflow.runtime.server.openai_convert import abort_error, aborted, check_model, finish, usage
from radixflow.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    allow_only,
)
from radixflow.runtime.server.openai_tools import ChatReply, ToolPlan
from radixflow.runtime.server.responses_output import (
    Events,
    ResponseShell,
    message_item,
    output_items,
    text_item_tail,
    text_part,
    whole_item,
)
from radixflow.runtime.server.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesAllowedTools,
    ResponsesRequest,
)
from radixflow.runtime.server.wire import SSEResponse

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
    shell = ResponseShell(body, model, not ctx.engine.config.disable_radix_cache)
    if body.stream:
        chunks = await ctx.client.stream(batch, LogprobArgs())
        return SSEResponse(_stream(shell, chat, plan, reply, batch, chunks), chunks)
    results = await ctx.client.generate(batch, LogprobArgs(), request)
    r = results[0]
    message, reason = chat_message(chat, plan, r["text"], finish(r["meta_info"]), reply)
    return shell.whole(output_items(message, reason), reason, usage(batch, results))


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
        name=fmt.name or "output",
        description=fmt.description,
        schema=fmt.schema_,
        strict=fmt.strict,
    )
    return ResponseFormat(type="json_schema", json_schema=spec)


async def _stream(
    shell: ResponseShell,
    chat: ChatCompletionRequest,
    plan: ToolPlan | None,
    reply: ChatReply | None,
    batch: GenerateInput,
    chunks: EngineStream,
) -> AsyncIterator[str]:
    event = Events()
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
                item=message_item(item_id, None, "in_progress"),
            )
            yield event(
                "response.content_part.added",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part=text_part(""),
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
        output = output_items(message, reason)
        if live:
            output[0]["id"] = item_id
            for ev in text_item_tail(event, output[0], started=sent > 0):
                yield ev
        else:
            for index, out in enumerate(output):
                for ev in whole_item(event, index, out):
                    yield ev
        final = shell.whole(output, reason, usage(batch, [item]))
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield event(kind, response=final)
        return
