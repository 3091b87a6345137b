"""What the server checks before any route reads a request: its key and its body size.

    client ──► CORS ──► RequestGuard ──► FastAPI (body parsed, route runs)
                          │ 401: no or wrong key (the body is never read)
                          │ 413: Content-Length over the cap, or more bytes arrive than it

Keys: with an API key set, every path but /health needs `Authorization: Bearer KEY` (the docs
page and the OpenAPI description too). Admin routes (flush, abort-all) follow SGLang's
`--admin-api-key`: when an admin key is set they need it and the API key is not enough;
without one they take what every other route takes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class Keys:
    api_key: str | None = None
    admin_api_key: str | None = None

    def allows(self, authorization: str) -> bool:
        """Whether the Authorization header opens the ordinary routes."""
        if self.api_key is None:
            return True
        return _matches(authorization, self.api_key) or (
            self.admin_api_key is not None and _matches(authorization, self.admin_api_key)
        )

    def allows_admin(self, authorization: str) -> bool:
        """Whether the Authorization header opens the admin routes."""
        if self.admin_api_key is not None:
            return _matches(authorization, self.admin_api_key)
        return self.allows(authorization)


def _matches(authorization: str, key: str) -> bool:
    return secrets.compare_digest(authorization.encode(), f"Bearer {key}".encode())


class RequestGuard:
    """ASGI middleware: answers 401 before reading the body, and caps the body's size."""

    def __init__(self, app: ASGIApp, keys: Keys, max_body_bytes: int, on_error) -> None:
        self.app = app
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error  # (status) -> None, counts the error in metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if scope["path"] not in OPEN_PATHS and not self.keys.allows(authorization):
            await self._refuse(
                send, 401, "invalid or missing API key", "authentication_error", scope["path"]
            )
            return
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(send, 413, self._too_large(), "invalid_request_error", scope["path"])
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:  # the app's 413 handler answers it
                    raise HTTPException(413, self._too_large())
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except HTTPException as exc:
            if exc.status_code != 413 or started:
                raise
            await self._refuse(send, 413, self._too_large(), "invalid_request_error", scope["path"])

    def _too_large(self) -> str:
        return f"request body is larger than the server's limit of {self.max_body_bytes} bytes"

    async def _refuse(
        self, send: Send, status: int, message: str, kind: str, path: str = ""
    ) -> None:
        self.on_error(status)
        code: int | str | None = status  # SGLang's shape; /v1 routes: OpenAI's string or null
        if path.startswith("/v1/"):
            code = "invalid_api_key" if status == 401 else None
        body = json.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
