"""OpenAI's /v1/models, /v1/completions and /v1/embeddings (refused: generation models only).

Responses and stream chunks have the shapes of OpenAI's OpenAPI description; completion
logprobs carry `text_offset` in characters of the whole text, continued across stream chunks.
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request

from radixflow.runtime.io_struct import GenerateInput
from radixflow.runtime.server.engine_client import EngineStream, LogprobArgs, ServerContext
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_convert import (
    OPENAI_NAMES,
    aborted,
    check_model,
    error_event,
    finish,
    sampling_params,
    token_bytes,
    token_name,
    usage,
)
from radixflow.runtime.server.openai_protocol import CompletionRequest
from radixflow.runtime.server.wire import SSEResponse, sse

router = APIRouter()


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
            lp = _completion_logprobs(ctx, meta, bool(body.echo))
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
    offsets = [TextOffsets() for _ in batch.items]
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
            lp = _completion_logprobs(ctx, meta, False, offsets[i])
        if not delta and reason is None and not (lp and lp["tokens"]):
            continue
        choice = {"index": i, "text": delta, "logprobs": lp, "finish_reason": reason}
        yield sse({**base, "choices": [choice], **({"usage": None} if include_usage else {})})
        if reason is not None:
            results[i] = item
    if include_usage and all(r is not None for r in results):
        yield sse({**base, "choices": [], "usage": usage(batch, results)})
    yield "data: [DONE]\n\n"


@dataclass
class TextOffsets:
    """Where each token starts in the decoded text, in characters, for tokens fed in order: a
    token holding the tail of a multi-byte character starts where that character does. One per
    streamed choice, so each chunk decodes only its new tokens."""

    fed: int = 0  # tokens fed so far
    chars: int = 0
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def feed(self, ctx: ServerContext, token_ids: list[int]) -> list[int]:
        offsets = []
        for t in token_ids:
            offsets.append(self.chars)
            self.chars += len(self.decoder.decode(token_bytes(ctx, t)))
        self.fed += len(token_ids)
        return offsets


def _completion_logprobs(
    ctx: ServerContext, meta: dict, echo: bool, offsets: TextOffsets | None = None
) -> dict[str, Any]:
    """Completion logprobs of the entries `offsets` has not seen yet (all, and the prompt's
    with echo, when it is None); `text_offset` counts characters of the whole text, so stream
    chunks continue it."""
    entries = list(meta.get("output_token_logprobs", []))
    tops = list(meta.get("output_top_logprobs", []))
    if echo:
        prompt_lps = meta.get("input_token_logprobs", [])
        entries = [(lp, t, None) for (lp, t, _) in prompt_lps] + entries
        tops = list(meta.get("input_top_logprobs", [None] * len(prompt_lps))) + tops
    offsets = offsets or TextOffsets()
    entries, tops = entries[offsets.fed :], tops[offsets.fed :]
    top = None
    if tops:
        top = [
            None if row is None else {token_name(ctx, t): lp for lp, t, _ in row} for row in tops
        ]
    return {
        "tokens": [token_name(ctx, t) for _, t, _ in entries],
        "token_logprobs": [lp for lp, _, _ in entries],
        "top_logprobs": top,
        "text_offset": offsets.feed(ctx, [t for _, t, _ in entries]),
    }
