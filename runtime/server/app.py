"""The FastAPI app over one Engine: SGLang's native routes, OpenAI's /v1 routes and /metrics.

    create_app(engine)   the app (tests serve it; `radixflow serve` runs it under uvicorn)

Errors, for every route, are `{"error": {"message", "type", "param", "code"}}` (OpenAI's form);
bad input is HTTP 400 naming the field (errors.py). Keys and body size are checked before any
route reads the body (request_guard.py); what one request may ask for is in `ServerLimits`.
"""

from __future__ import annotations

import asyncio
import importlib.util
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from radixflow._version import __version__
from radixflow.runtime.server import (
    native_routes,
    openai_chat,
    openai_completions,
    responses_api,
)
from radixflow.runtime.server.engine_client import EngineClient, ServerContext
from radixflow.runtime.server.errors import add_error_handlers
from radixflow.runtime.server.heap import trim_heap_periodically
from radixflow.runtime.server.limits import ServerLimits
from radixflow.runtime.server.metrics import ServerMetrics
from radixflow.runtime.server.native_routes import WARMUP_PROMPT
from radixflow.runtime.server.request_guard import Keys, RequestGuard
from radixflow.runtime.server.wire import StrictJSONResponse

if TYPE_CHECKING:
    from radixflow.runtime.engine import Engine


def create_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    cors_origins: list[str] | None = None,
    served_model_name: str | list[str] | None = None,
    owns_engine: bool = False,
    limits: ServerLimits | None = None,
) -> FastAPI:
    """The app over `engine`. Startup runs a warm-up generation before /health turns 200;
    with `owns_engine`, shutdown aborts what is in flight and shuts the engine down.
    `served_model_name` may be a list: the first is the main name, the rest aliases."""
    metrics = ServerMetrics(engine)
    model_path = engine.config.model_path or str(engine.model_dir)
    limits = limits or ServerLimits()
    names = [served_model_name] if isinstance(served_model_name, str) else served_model_name
    names = list(dict.fromkeys(names or [engine.config.model_path or Path(model_path).name]))
    ctx = ServerContext(
        engine=engine,
        client=EngineClient(engine, metrics, limits),
        metrics=metrics,
        served_model_name=names[0],
        model_path=model_path,
        keys=Keys(api_key, admin_api_key),
        model_aliases=tuple(names[1:]),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.async_generate(WARMUP_PROMPT, {"max_new_tokens": 2, "temperature": 0})
        ctx.ready = True
        trimmer = asyncio.create_task(trim_heap_periodically())
        yield
        trimmer.cancel()
        ctx.ready = False
        ctx.client.abort(None)
        if owns_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(
        title="radixflow",
        version=__version__,
        lifespan=lifespan,
        default_response_class=StrictJSONResponse,
        docs_url=None,  # served below from local assets, behind the key like every route
        redoc_url=None,
    )
    app.state.ctx = ctx
    # Starlette runs the last-added middleware first: CORS answers preflights before the guard.
    app.add_middleware(
        RequestGuard,
        keys=ctx.keys,
        max_body_bytes=limits.max_body_bytes,
        on_error=lambda status: metrics.errors.labels(str(status)).inc(),
    )
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    add_error_handlers(app, metrics)
    _add_docs(app)
    app.include_router(native_routes.router)
    app.include_router(openai_completions.router)
    app.include_router(openai_chat.router)
    app.include_router(responses_api.router)
    return app


def _add_docs(app: FastAPI) -> None:
    """/docs: Swagger UI from the `swagger-ui-py` package's files, so it works offline."""
    spec = importlib.util.find_spec("swagger_ui")
    assets = Path(spec.origin).parent / "static"
    app.mount("/docs/assets", StaticFiles(directory=assets), name="docs-assets")

    async def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=f"{app.title} - API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon-32x32.png",
        )

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
