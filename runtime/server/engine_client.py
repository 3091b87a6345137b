"""The HTTP layer's view of the engine: validated sub-requests, merged streams, aborts, metrics.

Every HTTP request becomes a `GenerateInput` whose items, one per (prompt, sample) pair, each
run as their own engine request with n=1, so that `/abort_request`, client disconnects and
shutdown can stop exactly the engine requests an HTTP request owns:

    HTTP request (rid R, 2 prompts, n=2) ─► names R-0 R-1 R-2 R-3 (what responses show)
                                            engine rids: random, never chosen by a client

A client rid names one live HTTP request (a second one with the same rid is a 400); the engine
rids behind it are random 128-bit tokens, so no client can guess or take over another's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from radixflow.runtime.io_struct import GenerateInput, GenerateItem, InputError
from radixflow.runtime.request import LogprobRequest
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.limits import CHARS_PER_TOKEN, ServerLimits
from radixflow.runtime.server.metrics import ServerMetrics, StreamTimer
from radixflow.runtime.server.request_guard import Keys
from radixflow.runtime.text import check_encodable

if TYPE_CHECKING:
    from radixflow.runtime.engine import Engine


@dataclass
class LogprobArgs:
    """The logprob fields of one request, as a route collects them."""

    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: list[int] | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        return {
            "return_logprob": self.return_logprob,
            "logprob_start_len": self.logprob_start_len,
            "top_logprobs_num": self.top_logprobs_num,
            "token_ids_logprob": self.token_ids_logprob,
        }


class EngineClient:
    """Runs batches on the engine; tracks in-flight rids; records metrics."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, limits: ServerLimits) -> None:
        self.engine = engine
        self.metrics = metrics
        self.limits = limits
        self.max_prompt_chars = limits.max_prompt_chars or CHARS_PER_TOKEN * engine.context_length
        self.inflight: dict[str, list[GenerateItem]] = {}  # client rid -> its items
        self._token_texts: dict[int, str] = {}

    # -- building ---------------------------------------------------------------------------
    async def tokenize(
        self, text: str, field_name: str, add_special_tokens: bool = True
    ) -> list[int]:
        """Token ids of a prompt, refused before any work when it is too long or not valid
        Unicode; tokenized off the event loop, so other requests go on meanwhile."""
        if not isinstance(text, str):
            raise APIError(f"{field_name} must be a string", param=field_name)
        if len(text) > self.max_prompt_chars:
            raise APIError(
                f"{field_name}: the prompt has {len(text)} characters; this server accepts at "
                f"most {self.max_prompt_chars} (--max-prompt-chars)",
                param=field_name,
            )
        _check_encodable(text, field_name)
        return await asyncio.to_thread(
            self.engine.tokenizer.encode, text, add_special_tokens=add_special_tokens
        )

    def detokenize(self, ids: list[int]) -> str:
        return self.engine.tokenizer.decode(ids)

    def token_text(self, token_id: int) -> str:
        """The text of one token (cached: logprob responses name every token)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.engine.tokenizer.decode([token_id])
        return text

    def check_ids(self, ids: list[int], field_name: str) -> list[int]:
        """Refuse a prompt the engine cannot run before any other work on the request."""
        try:
            self.engine.check_prompt(ids)
        except ValueError as exc:
            raise APIError(f"{field_name}: {exc}", param=field_name) from None
        return ids

    def build(
        self,
        prompts: list[list[int]],
        params: dict[str, Any] | list[dict[str, Any]] | None,
        rid: str | list[str] | None,
        param_names: dict[str, str] | None = None,
        prompt_field: str = "input_ids",
        batched: bool = True,
    ) -> GenerateInput:
        """The validated input of one HTTP request: `n` expanded, engine rids random, and
        items named after the client rid.

        `param_names` renames engine field names in errors (max_new_tokens -> max_tokens).
        """
        for r in rid if isinstance(rid, list) else [rid]:
            if isinstance(r, str):
                _check_encodable(r, "rid")
        try:
            return GenerateInput.build(
                prompts,
                params,
                self.engine.limits,
                batched=batched,
                rid=rid,
                prompt_field=prompt_field,
                private_rids=True,
                max_items=self.limits.max_requests_per_call,
            )
        except InputError as exc:
            raise APIError(str(exc), param=exc.field) from None
        except (ValueError, TypeError) as exc:
            err = APIError.from_value_error(ValueError(str(exc)), "sampling_params")
            err.param = (param_names or {}).get(err.param, err.param)
            raise err from None

    def logprob_options(self, args: LogprobArgs) -> LogprobRequest:
        """The engine's validated form of a request's logprob fields."""
        try:
            return self.engine.limits.logprob(**args.engine_kwargs())
        except InputError as exc:
            raise APIError(str(exc), param=exc.field) from None

    def _logprob(self, item: GenerateItem, logprob: LogprobArgs) -> GenerateInput:
        """The single-item engine input of `item`, with the call's logprob options unless the
        item has its own."""
        options = item.logprob or self.logprob_options(logprob)
        one = dataclasses.replace(item, logprob=options)
        return GenerateInput([one], batched=False)

    # -- running ----------------------------------------------------------------------------
    async def generate(
        self, batch: GenerateInput, logprob: LogprobArgs, request: Request
    ) -> list[dict]:
        """Run a batch to completion; a client disconnect aborts it (returns no results)."""
        self._register(batch)
        work = asyncio.gather(*(self._one(s, logprob) for s in batch.items))
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        ok = False
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise APIError("client disconnected", 499)
            results = work.result()
            ok = True
        finally:
            watcher.cancel()
            if not ok:  # gather leaves siblings of a failed request running: stop them all
                work.cancel()
                work.add_done_callback(_retrieve)  # its error (if any) is answered already
                for s in batch.items:
                    self.engine.abort(s.rid)
            self._release(batch)
        for r in results:
            self.metrics.observe_finished(r, streamed=False)
        return results

    async def _one(self, item: GenerateItem, logprob: LogprobArgs) -> dict:
        result = await self.engine.async_run(self._logprob(item, logprob))
        return _named(result, item)

    async def stream(self, batch: GenerateInput, logprob: LogprobArgs) -> EngineStream:
        """Start every item now and return their merged stream.

        The caller must end it with `EngineStream.close()` (SSEResponse does, even when the
        client is gone before the first byte): that aborts whatever has not finished.
        """
        self._register(batch)
        iters = []
        try:
            for item in batch.items:
                one = self._logprob(item, logprob)
                one.stream = True
                iters.append(await self.engine.async_run(one))
        except BaseException:
            for s in batch.items[: len(iters)]:
                self.engine.abort(s.rid)
            self._release(batch)
            raise
        return EngineStream(self, batch, iters)

    def abort(self, rid: str | None) -> int:
        """Abort the HTTP request registered under the client rid `rid` (all for None)."""
        keys = list(self.inflight) if rid is None else [rid]
        subs = [sub for key in keys for sub in self.inflight.get(key, [])]
        for sub in subs:
            self.engine.abort(sub.rid)
        return len(subs)

    def _register(self, batch: GenerateInput) -> None:
        """Claim the batch's client rids; a 400 if one names a request still running."""
        for key in batch.groups:
            if key in self.inflight:
                raise APIError(f"rid {key!r} is already in use by a running request", param="rid")
        by_name = {item.name: item for item in batch.items}
        for key, names in batch.groups.items():
            self.inflight[key] = [by_name[n] for n in names]

    def _release(self, batch: GenerateInput) -> None:
        for key in batch.groups:
            registered = self.inflight.get(key)
            if registered and any(registered[0] is item for item in batch.items):
                del self.inflight[key]


class EngineStream:
    """The engine streams of one HTTP request, merged: iterate for (sub index, output)."""

    def __init__(self, client: EngineClient, batch: GenerateInput, iters: list) -> None:
        self.client = client
        self.batch = batch
        self.iters = iters
        self.finished: set[int] = set()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[tuple[int, dict]]:
        timers = [StreamTimer(self.client.metrics) for _ in self.iters]
        queue: asyncio.Queue[tuple[int, dict]] = asyncio.Queue()

        async def pump(i: int, it: AsyncIterator[dict]) -> None:
            async for item in it:
                await queue.put((i, item))

        tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(self.iters)]
        try:
            while len(self.finished) < len(self.iters):
                i, item = await queue.get()
                meta = item["meta_info"]
                timers[i].chunk(meta["completion_tokens"])
                if meta["finish_reason"] is not None:
                    self.finished.add(i)
                    self.client.metrics.observe_finished(item, streamed=True)
                yield i, _named(item, self.batch.items[i])
        finally:
            for t in tasks:
                t.cancel()
            self.close()

    def close(self) -> None:
        """Abort the sub-requests that have not finished; forget the rids. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for i, s in enumerate(self.batch.items):
            if i not in self.finished:
                self.client.engine.abort(s.rid)
        self.client._release(self.batch)


@dataclass
class ServerContext:
    """What the routes share: the engine, its client, metrics and the server's identity."""

    engine: Engine
    client: EngineClient
    metrics: ServerMetrics
    served_model_name: str
    model_path: str
    keys: Keys
    started: int = field(default_factory=lambda: int(time.time()))
    ready: bool = False
    model_aliases: tuple[str, ...] = ()  # more names /v1 answers to (--served-model-name a b)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a /v1 request may give as `model`, the main one first."""
        return (self.served_model_name, *self.model_aliases)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _check_encodable(text: str, field_name: str) -> None:
    try:
        check_encodable(text, field_name)
    except ValueError as exc:
        raise APIError(str(exc), param=field_name) from None


def _named(result: dict[str, Any], item: GenerateItem) -> dict[str, Any]:
    """The engine's result under the name the client knows (never the engine rid)."""
    result["meta_info"]["id"] = item.name
    return result


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
