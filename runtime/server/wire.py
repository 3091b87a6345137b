"""What goes on the wire: strict JSON, server-sent events, and the responses that send them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, StreamingResponse

if TYPE_CHECKING:
    from radixflow.runtime.server.engine_client import EngineStream


def json_text(payload: Any) -> str:
    """Strict JSON (no NaN or Infinity) that encodes as UTF-8: a lone surrogate a client sent,
    echoed in an error, is written as its escape."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(payload, allow_nan=False)
    return text


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json_text(payload)}\n\n"


class StrictJSONResponse(JSONResponse):
    """JSON that is valid everywhere: no NaN/Infinity, lone surrogates escaped."""

    def render(self, content: Any) -> bytes:
        return json_text(content).encode()


class SSEResponse(StreamingResponse):
    """A server-sent event stream that closes its `EngineStream` however the response ends."""

    def __init__(self, content: AsyncIterator[str], stream: EngineStream) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.stream = stream

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close()
