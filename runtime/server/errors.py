"""Errors answered to clients, and the app's handlers that answer them.

Every route answers `{"error": {"message", "type", "param", "code"}}`: the native routes put the
HTTP status in `code` (SGLang's shape), the /v1 routes OpenAI's string code or null. Bad input
is HTTP 400 naming the field; an unhandled exception is a 500 whose text stays in the log.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from radixflow.runtime.io_struct import InputError
from radixflow.runtime.server.wire import StrictJSONResponse

if TYPE_CHECKING:
    from radixflow.runtime.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error answered to the client: status, message and the request field at fault."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type

    @classmethod
    def from_value_error(cls, exc: ValueError, default_param: str | None = None) -> APIError:
        """Wrap an engine ValueError: an `InputError` names its field, any other's first quoted
        identifier does."""
        if isinstance(exc, InputError):
            return cls(str(exc), 400, exc.field)
        found = re.search(r"'([A-Za-z_][\w.]*)'", str(exc))
        return cls(str(exc), 400, found.group(1) if found else default_param)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


class OpenAIError(APIError):
    """An APIError with OpenAI's string `code` (`model_not_found`, ...)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, **kw: Any):
        super().__init__(message, status, **kw)
        self.code = code


def error_body(err: APIError) -> dict[str, Any]:
    """OpenAI's error object: `code` is a string or null (the native routes use the status)."""
    code = getattr(err, "code", None)
    return {"error": {**err.body()["error"], "code": code}}


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer every error in the shape of the route it happened on, and count it."""

    def answer(err: APIError, request: Request) -> JSONResponse:
        metrics.errors.labels(str(err.status)).inc()
        openai_shape = request.url.path.startswith("/v1/")  # native routes keep SGLang's shape
        body = error_body(err) if openai_shape else err.body()
        return StrictJSONResponse(body, status_code=err.status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(exc, request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if _is_field(p)]
        if first.get("type") == "unknown_field":  # raised by the model that holds the field
            loc.append(first["ctx"]["field"])
        if first.get("type") == "json_invalid":
            return answer(APIError(f"malformed JSON body: {first.get('msg')}"), request)
        param = ".".join(loc) or None
        where = f"{param}: " if param else "request body: "
        return answer(APIError(where + first.get("msg", "invalid value"), param=param), request)

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        return answer(APIError.from_value_error(exc), request)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = _ERROR_TYPES.get(exc.status_code, "invalid_request_error")
        return answer(APIError(str(exc.detail), exc.status_code, type=kind), request)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        # The exception stays in the log: its text can hold internals a client must not see.
        return answer(
            APIError("internal server error (see the server log)", 500, type="server_error"),
            request,
        )


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
# OpenAI's error types by status, for errors the framework raises (unknown route, method).
_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def _is_field(loc_part: object) -> bool:
    """Whether a pydantic error location part names a field (or list index), not the body or
    the union branch tried (`str`, `list[int]`, `NamedToolChoice`, `literal['auto']`)."""
    if isinstance(loc_part, int):
        return True
    text = str(loc_part)
    return not (
        text == "body" or text in _TYPE_TAGS or text[:1].isupper() or any(c in text for c in "[(-")
    )
