"""The Response objects /v1/responses answers with, their output items and stream events.

A chat reply becomes output items: a `reasoning` item (with a reasoning parser), then its
`function_call` items or one `message` item with `output_text`. Streams number their events:

    response.created, response.in_progress,
    per output item: output_item.added, [content_part.added, output_text.delta..., output_text.done,
                     content_part.done | function_call_arguments.delta, ...arguments.done],
                     output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it)
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from radixflow.runtime.server.responses_protocol import ResponsesRequest
from radixflow.runtime.server.wire import json_text


def output_items(message: dict[str, Any], reason: str | None) -> list[dict[str, Any]]:
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
    return [message_item(f"msg_{uuid.uuid4().hex}", message["content"] or "", status)]


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant `message` output item; `text` None: no content part yet (streaming)."""
    content = [] if text is None else [text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def text_part(text: str) -> dict[str, Any]:
    """An `output_text` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseShell:
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


class Events:
    """Numbered server-sent events of one Responses stream."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json_text(payload)}\n\n"


def text_item_tail(event: Events, out: dict[str, Any], started: bool) -> list[str]:
    """The events that close a streamed message item (and open it, when no text came)."""
    text = out["content"][0]["text"]
    where = {"item_id": out["id"], "output_index": 0, "content_index": 0}
    events = []
    if not started:
        events.append(
            event(
                "response.output_item.added",
                output_index=0,
                item=message_item(out["id"], None, "in_progress"),
            )
        )
        events.append(event("response.content_part.added", **where, part=text_part("")))
    events.append(event("response.output_text.done", **where, text=text, logprobs=[]))
    events.append(event("response.content_part.done", **where, part=out["content"][0]))
    events.append(event("response.output_item.done", output_index=0, item=out))
    return events


def whole_item(event: Events, index: int, out: dict[str, Any]) -> list[str]:
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
        events.append(event("response.content_part.added", **where, part=text_part("")))
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
