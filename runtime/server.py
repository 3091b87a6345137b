"""The HTTP server: one Engine behind SGLang's native routes, OpenAI's /v1 routes and /metrics.

    create_app(engine)                the FastAPI app (tests serve it; `serve` runs it under uvicorn)
    serve(engine_kwargs, host, port)  load the engine, warm it up, serve until SIGINT/SIGTERM
    python -m radixflow.runtime.server [flags]   the same as `radixflow serve [flags]`

Errors, for every route, are `{"error": {"message", "type", "param", "code"}}` (OpenAI's form);
bad input is HTTP 400 naming the field. Keys and body size are checked before any route reads
the body (`http_guard`); what one request may ask for is in `ServerLimits`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

import radixflow
from radixflow.runtime import openai_api, openai_responses
from radixflow.runtime.heap import trim_heap_periodically
from radixflow.runtime.http_guard import Keys, RequestGuard
from radixflow.runtime.metrics import CONTENT_TYPE, ServerMetrics
from radixflow.runtime.native_protocol import (
    AbortRequest,
    GenerateRequest,
    PromptLogprobs,
    check_extra_fields,
)
from radixflow.runtime.serving import (
    APIError,
    EngineClient,
    EngineStream,
    LogprobArgs,
    ServerContext,
    ServerLimits,
    SSEResponse,
    json_text,
    sse,
)

if TYPE_CHECKING:
    from radixflow.runtime.engine import Engine

logger = logging.getLogger(__name__)

WARMUP_PROMPT = "The capital of France is"


class StrictJSONResponse(JSONResponse):
    """JSON that is valid everywhere: no NaN/Infinity, lone surrogates escaped."""

    def render(self, content: Any) -> bytes:
        return json_text(content).encode()


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
        version=radixflow.__version__,
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
    _add_error_handlers(app, metrics)
    _add_docs(app)
    app.add_api_route("/health", health, methods=["GET"])
    app.include_router(native_router)
    app.include_router(openai_api.router)
    app.include_router(openai_responses.router)
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


async def require_admin(request: Request) -> None:
    """Admin routes need the admin key when one is set (SGLang's --admin-api-key)."""
    keys: Keys = request.app.state.ctx.keys
    if not keys.allows_admin(request.headers.get("authorization", "")):
        raise APIError(
            "this route needs the admin API key (--admin-api-key)", 403, type="permission_error"
        )


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def answer(err: APIError, request: Request) -> JSONResponse:
        metrics.errors.labels(str(err.status)).inc()
        openai_shape = request.url.path.startswith("/v1/")  # native routes keep SGLang's shape
        body = openai_api.error_body(err) if openai_shape else err.body()
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


# -- SGLang-native routes -------------------------------------------------------------------
native_router = APIRouter()


async def health(request: Request) -> Response:
    """200 once the warm-up generation has run; 503 before and during shutdown."""
    return Response(status_code=200 if request.app.state.ctx.ready else 503)


@native_router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 when the engine generates a token now."""
    ctx: ServerContext = request.app.state.ctx
    result = await ctx.engine.async_generate(WARMUP_PROMPT, {"max_new_tokens": 1})
    ok = ctx.ready and result["meta_info"]["completion_tokens"] == 1
    return Response(status_code=200 if ok else 503)


@native_router.get("/model_info")
@native_router.get("/get_model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    """SGLang's model info (the router reads it from /model_info, then /get_model_info)."""
    ctx: ServerContext = request.app.state.ctx
    hf_config = ctx.engine.runner.hf_config
    return {
        "model_path": ctx.model_path,
        "tokenizer_path": ctx.engine.config.tokenizer_path or ctx.model_path,
        "served_model_name": ctx.served_model_name,
        "is_generation": True,
        "model_type": getattr(hf_config, "model_type", None),
        "architectures": getattr(hf_config, "architectures", None),
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "context_length": ctx.engine.context_length,
        "vocab_size": ctx.engine.vocab_size,
        # the template chat requests use (--chat-template's when set), for RuntimeEndpoint
        "chat_template": getattr(ctx.engine.tokenizer, "chat_template", None),
    }


@native_router.get("/get_load")
async def get_load(request: Request) -> list[dict[str, Any]]:
    """What SGLang's router balances on, one entry per data-parallel rank (it sums
    `num_tokens`): requests running and waiting, KV tokens held (the prefix cache's too)."""
    stats = request.app.state.ctx.engine.snapshot()
    return [
        {
            "dp_rank": 0,
            "num_reqs": stats.num_running_reqs,
            "num_waiting_reqs": stats.num_waiting_reqs,
            "num_tokens": stats.kv_tokens_used,
        }
    ]


@native_router.get("/server_info")
@native_router.get("/get_server_info")
async def server_info(request: Request) -> dict[str, Any]:
    ctx: ServerContext = request.app.state.ctx
    engine = ctx.engine
    stats = engine.snapshot()
    return {
        **dataclasses.asdict(engine.config),
        "version": radixflow.__version__,
        "served_model_name": ctx.served_model_name,
        "context_length": engine.context_length,
        "vocab_size": engine.vocab_size,
        "kv_pages_total": stats.kv_pages_total,
        "kv_pages_free": stats.kv_pages_free,
        "num_running_reqs": stats.num_running_reqs,
        "num_waiting_reqs": stats.num_waiting_reqs,
        "stats": dict(stats.counters),
    }


@native_router.post("/flush_cache", dependencies=[Depends(require_admin)])
async def flush_cache(request: Request) -> Response:
    """Empty the radix cache; 400 while requests run (the engine refuses then)."""
    try:
        await asyncio.to_thread(request.app.state.ctx.engine.flush_cache)
    except RuntimeError as exc:
        raise APIError(f"cache not flushed: {exc}") from None
    return Response("Cache flushed.\n", media_type="text/plain")


@native_router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict[str, Any]:
    """Abort a request by the rid it was sent with (or every request, with abort_all: an
    admin route)."""
    if not body.abort_all and not body.rid:
        raise APIError("give rid or abort_all: true", param="rid")
    if body.abort_all:
        await require_admin(request)
    client = request.app.state.ctx.client
    return {"aborted": client.abort(None if body.abort_all else body.rid)}


@native_router.post("/encode")
async def encode() -> None:
    raise APIError("/encode (embeddings) is not supported: this server serves generation models")


@native_router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.ctx.metrics.render(), media_type=CONTENT_TYPE)


@native_router.post("/generate")
@native_router.put("/generate", include_in_schema=False)
async def generate(body: GenerateRequest, request: Request):
    """SGLang's /generate: text or input_ids, one or a batch. Streams are SSE chunks with the
    cumulative text (only the new part with --incremental-streaming-output, as SGLang)."""
    ctx: ServerContext = request.app.state.ctx
    client = ctx.client
    check_extra_fields(body.model_extra)
    if (body.text is None) == (body.input_ids is None):
        raise APIError("give exactly one of text or input_ids", param="text")
    if body.text is not None:
        batched = isinstance(body.text, list)
        texts = body.text if batched else [body.text]
        prompts = [await client.tokenize(t, "text") for t in texts]
    else:
        batched = bool(body.input_ids) and isinstance(body.input_ids[0], list)
        prompts = body.input_ids if batched else [body.input_ids]
    prompt_field = "text" if body.text is not None else "input_ids"
    batch = client.build(prompts, body.sampling_params, body.rid, None, prompt_field, batched)
    logprobs = PromptLogprobs.from_request(body, prompts)
    for item in batch.items:
        args = _sub_logprob(logprobs.per_prompt[item.prompt_index], item.params.max_new_tokens)
        item.logprob = client.logprob_options(args)
    shape = _OutputShape(
        ctx, logprobs.with_text, body.return_prompt_token_ids, [s.input_ids for s in batch.items]
    )
    many = batched or len(batch.items) > 1
    if body.stream:
        chunks = await client.stream(batch, LogprobArgs())
        incremental = bool(getattr(ctx.engine.config, "incremental_streaming_output", False))
        return SSEResponse(_generate_stream(shape, chunks, many, incremental), chunks)
    results = await client.generate(batch, LogprobArgs(), request)
    out = [shape.render(i, r) for i, r in enumerate(results)]
    return out if many else out[0]


def _sub_logprob(args: LogprobArgs, max_new_tokens: int) -> LogprobArgs:
    """A prefill-only request that asks for logprobs without logprob_start_len scores its whole
    prompt: SGLang's frontend sends no start when it scores choices without their context
    (select's unconditional_likelihood_normalized), expecting every prompt token's logprob."""
    if args.return_logprob and args.logprob_start_len is None and max_new_tokens == 0:
        return dataclasses.replace(args, logprob_start_len=0)
    return args


async def _generate_stream(
    shape: _OutputShape, chunks: EngineStream, many: bool, incremental: bool
):
    sent: dict[int, tuple[int, int]] = {}  # sub index -> (text chars, output ids) already sent
    async for i, item in chunks:
        out = shape.render(i, item)
        if incremental:
            out = _increment(out, *sent.get(i, (0, 0)))
            sent[i] = (sent.get(i, (0, 0))[0] + len(out["text"]), len(item["output_ids"]))
        if many:
            out["index"] = i
        yield sse(out)
    yield "data: [DONE]\n\n"


# Per-output-token meta_info lists, sliced like the output ids in incremental streaming.
_PER_OUTPUT_TOKEN = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def _increment(out: dict[str, Any], text_sent: int, ids_sent: int) -> dict[str, Any]:
    """The part of a cumulative chunk not sent yet. A stop_regex can trim text already
    streamed (as in SGLang); then nothing more is sent."""
    meta = dict(out["meta_info"])
    for key in _PER_OUTPUT_TOKEN:
        if key in meta:
            meta[key] = meta[key][ids_sent:]
    return {
        **out,
        "text": out["text"][text_sent:],
        "output_ids": out["output_ids"][ids_sent:],
        "meta_info": meta,
    }


@dataclasses.dataclass
class _OutputShape:
    """How /generate renders the engine's results: logprob entries get their token text with
    return_text_in_logprobs; the prompt's ids come back with return_prompt_token_ids."""

    ctx: ServerContext
    with_text: bool
    with_prompt_ids: bool
    prompt_ids: list[list[int]]  # per sub-request

    def render(self, i: int, result: dict[str, Any]) -> dict[str, Any]:
        out = dict(result)
        if self.with_prompt_ids:
            out["prompt_token_ids"] = self.prompt_ids[i]
        if not self.with_text:
            return out
        meta = dict(result["meta_info"])
        name = self.ctx.client.token_text
        for key in ("output_token_logprobs", "input_token_logprobs"):
            if key in meta:
                meta[key] = [(lp, t, name(t)) for lp, t, _ in meta[key]]
        for key in (
            "output_top_logprobs",
            "input_top_logprobs",
            "output_token_ids_logprobs",
            "input_token_ids_logprobs",
        ):
            if key in meta:
                meta[key] = [
                    None if row is None else [(lp, t, name(t)) for lp, t, _ in row]
                    for row in meta[key]
                ]
        out["meta_info"] = meta
        return out


def serve(
    engine_kwargs: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    cors_origins: list[str] | None = None,
    served_model_name: str | list[str] | None = None,
    log_level: str = "info",
    graceful_timeout: float = 30.0,
    limits: ServerLimits | None = None,
) -> None:
    """Load an engine and serve it until SIGINT/SIGTERM.

    On the signal the server stops accepting connections and gives in-flight requests
    `graceful_timeout` seconds; then it aborts them (streams end with finish_reason "abort"
    and `[DONE]`), and shuts the engine down.
    """
    engine = radixflow.Engine(**engine_kwargs)
    try:
        app = create_app(
            engine,
            api_key=api_key,
            admin_api_key=admin_api_key,
            cors_origins=cors_origins,
            served_model_name=served_model_name,
            owns_engine=True,
            limits=limits,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=graceful_timeout + 10,
        )
        _GracefulServer(config, app.state.ctx, graceful_timeout).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down
        pass
    finally:
        engine.shutdown()


class _GracefulServer(uvicorn.Server):
    """uvicorn, plus: `graceful_timeout` after the exit signal, abort what still runs."""

    def __init__(self, config: uvicorn.Config, ctx: ServerContext, graceful_timeout: float):
        super().__init__(config)
        self.ctx = ctx
        self.graceful_timeout = graceful_timeout

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            self.ctx.ready = False
            self.loop.call_soon_threadsafe(
                self.loop.call_later, self.graceful_timeout, self.ctx.client.abort, None
            )
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    from radixflow.runtime.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
