"""SGLang's native routes: /generate, /health, /get_model_info, /get_load, /flush_cache, ...

What SGLang's frontend (`RuntimeEndpoint`) and router call. /generate takes text or input_ids,
one or a batch, and streams server-sent events with the cumulative text (only the new part
with --incremental-streaming-output, as SGLang). Errors keep SGLang's shape (`code` = status).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from radixflow._version import __version__
from radixflow.runtime.server.engine_client import EngineStream, LogprobArgs, ServerContext
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.metrics import CONTENT_TYPE
from radixflow.runtime.server.native_protocol import (
    AbortRequest,
    GenerateRequest,
    PromptLogprobs,
    check_extra_fields,
)
from radixflow.runtime.server.request_guard import Keys
from radixflow.runtime.server.wire import SSEResponse, sse

WARMUP_PROMPT = "The capital of France is"

router = APIRouter()


async def require_admin(request: Request) -> None:
    """Admin routes need the admin key when one is set (SGLang's --admin-api-key)."""
    keys: Keys = request.app.state.ctx.keys
    if not keys.allows_admin(request.headers.get("authorization", "")):
        raise APIError(
            "this route needs the admin API key (--admin-api-key)", 403, type="permission_error"
        )


@router.get("/health")
async def health(request: Request) -> Response:
    """200 once the warm-up generation has run; 503 before and during shutdown."""
    return Response(status_code=200 if request.app.state.ctx.ready else 503)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 when the engine generates a token now."""
    ctx: ServerContext = request.app.state.ctx
    result = await ctx.engine.async_generate(WARMUP_PROMPT, {"max_new_tokens": 1})
    ok = ctx.ready and result["meta_info"]["completion_tokens"] == 1
    return Response(status_code=200 if ok else 503)


@router.get("/model_info")
@router.get("/get_model_info")
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


@router.get("/get_load")
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


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict[str, Any]:
    ctx: ServerContext = request.app.state.ctx
    engine = ctx.engine
    stats = engine.snapshot()
    return {
        **dataclasses.asdict(engine.config),
        "version": __version__,
        "served_model_name": ctx.served_model_name,
        "context_length": engine.context_length,
        "vocab_size": engine.vocab_size,
        "kv_pages_total": stats.kv_pages_total,
        "kv_pages_free": stats.kv_pages_free,
        "num_running_reqs": stats.num_running_reqs,
        "num_waiting_reqs": stats.num_waiting_reqs,
        "stats": dict(stats.counters),
    }


@router.post("/flush_cache", dependencies=[Depends(require_admin)])
async def flush_cache(request: Request) -> Response:
    """Empty the radix cache; 400 while requests run (the engine refuses then)."""
    try:
        await asyncio.to_thread(request.app.state.ctx.engine.flush_cache)
    except RuntimeError as exc:
        raise APIError(f"cache not flushed: {exc}") from None
    return Response("Cache flushed.\n", media_type="text/plain")


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict[str, Any]:
    """Abort a request by the rid it was sent with (or every request, with abort_all: an
    admin route)."""
    if not body.abort_all and not body.rid:
        raise APIError("give rid or abort_all: true", param="rid")
    if body.abort_all:
        await require_admin(request)
    client = request.app.state.ctx.client
    return {"aborted": client.abort(None if body.abort_all else body.rid)}


@router.post("/encode")
async def encode() -> None:
    raise APIError("/encode (embeddings) is not supported: this server serves generation models")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.ctx.metrics.render(), media_type=CONTENT_TYPE)


@router.post("/generate")
@router.put("/generate", include_in_schema=False)
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
