"""The offline engine: a background loop that schedules, runs the model and samples.

caller thread(s)                         engine thread (one step at a time)
generate / async_generate ──inbox──►  admit, abort ─► Scheduler.schedule()
      ▲                                  ModelRunner.forward ─► Sampler ─► finish checks
      └──────── per-request sinks ◄───── outputs (every step when streaming, else at the end)
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from radixflow.grammars import GrammarBudgetExceeded
from radixflow.runtime.config import EngineConfig, request_log_line, startup_summary
from radixflow.runtime.constrained import GrammarBackend, budget_abort, grammar_limits
from radixflow.runtime.detokenizer import IncrementalDetokenizer, StopRegexTimeout
from radixflow.runtime.io_struct import (
    AbortCause,
    EngineStats,
    FinishReason,
    GenerateInput,
    GenerateItem,
    InputLimits,
)
from radixflow.runtime.jump_forward import jump_forward
from radixflow.runtime.model_loader import load_checkpoint
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.request import LogprobRequest, Req
from radixflow.runtime.sampler import RequestSampler, Sampler, SamplingBatch
from radixflow.runtime.scheduler import ScheduledStep, Scheduler, SchedulerLimits
from radixflow.runtime.speculative import Speculator, build_speculator
from radixflow.runtime.text import check_encodable

logger = logging.getLogger(__name__)

LOGPROB_FLOOR = -9999.0


class _Sink:
    """Where a request's outputs go: a thread queue, or an asyncio queue on its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.queue: queue.Queue | asyncio.Queue = asyncio.Queue() if loop else queue.Queue()

    def put(self, item: dict[str, Any]) -> None:
        if self.loop is None:
            self.queue.put(item)
        else:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Submission:
    req: Req
    sink: _Sink


@dataclass
class _Flush:
    done: queue.Queue


@dataclass
class _Unpin:
    pin_id: str
    done: queue.Queue


@dataclass(frozen=True)
class PinnedPrefix:
    """A prefix held in the radix cache until `Engine.unpin_prefix`; `tokens` says how many of
    its tokens are pinned (0: the cache is off or pins already hold half of the pool)."""

    pin_id: str
    tokens: int


class Engine:
    """SGLang-style offline engine. `rf.Engine()` loads the default model."""

    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        self.config = EngineConfig.from_kwargs(model_path=model_path, **kwargs)
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        checkpoint = load_checkpoint(
            self.config.model_path,
            tokenizer_path=self.config.tokenizer_path,
            chat_template=self.config.chat_template,
            generation_config=self.config.generation_config,
        )
        self.sampling_defaults = checkpoint.sampling_defaults
        self.tokenizer = checkpoint.tokenizer
        self.model_dir = checkpoint.model_dir
        self.runner = ModelRunner(self.config, checkpoint)
        self.vocab_size = self.runner.vocab_size
        self.model_context_length = self.runner.context_length
        # SGLang's max request length: the KV pool caps it too, so one request always fits.
        self.context_length = min(self.model_context_length, self.runner.pool.capacity_tokens)
        self.eos_token_ids = _eos_ids(checkpoint)
        self.limits = InputLimits(
            self.vocab_size,
            self.model_context_length,
            self.context_length,
            dict(self.sampling_defaults or {}),
        )
        self.scheduler = Scheduler(
            self.runner.pool,
            SchedulerLimits(
                max_running_requests=self.config.max_running_requests,
                chunked_prefill_size=self.config.chunked_prefill_size,
                max_prefill_tokens=self.config.max_prefill_tokens,
                policy=self.config.schedule_policy,
                disable_radix_cache=self.config.disable_radix_cache,
            ),
        )
        self.sampler = Sampler(seed=self.config.random_seed)
        self.speculator: Speculator | None = build_speculator(
            self.config, self.runner, self.tokenizer, self.sampler
        )
        self.grammars = GrammarBackend(
            self.tokenizer,
            self.vocab_size,
            self.eos_token_ids,
            self.config.grammar_compile_timeout,
            limits=grammar_limits(self.config),
            cache_mb=self.config.grammar_cache_mb,
            workers=self.config.grammar_compile_workers,
            import_paths=self.config.grammar_import_paths,
        )
        self._sinks: dict[str, _Sink] = {}
        self._live_rids: set[str] = set()  # submitted, not yet finished (any thread reads it)
        self._rid_lock = threading.Lock()
        self._inbox: queue.Queue[_Submission | _Flush | _Unpin | str] = queue.Queue()
        self._wake = threading.Event()
        self._stopped = False
        self._counter = itertools.count()
        self.stats = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "steps": 0,
            "jump_forward_tokens": 0,
            "spec_verify_steps": 0,  # request-steps that verified drafts
            "spec_draft_tokens": 0,
            "spec_accepted_tokens": 0,  # drafts accepted (the token after them not counted)
            "pinned_tokens": 0,
        }
        self._thread = threading.Thread(target=self._loop, name="radixflow-engine", daemon=True)
        self._thread.start()
        atexit.register(_shutdown_if_alive, weakref.ref(self))
        logger.info("%s", startup_summary(self))

    # -- public API -------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (a dict), a list (a list of dicts) or stream (an iterator)."""
        inp = self.make_input(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            token_ids_logprob,
        )
        reqs = self._reqs(inp)
        for req, compiled in self._compile_grammars(reqs):
            req.grammar = compiled.result().matcher()
        sinks = self._submit_all(reqs, None)
        if inp.stream:
            return self._stream_sync(sinks[0])
        return _shape([self._wait_final_sync(s) for s in sinks], inp)

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        """The asyncio twin of `generate`; with stream=True it returns an async iterator."""
        inp = self.make_input(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            token_ids_logprob,
        )
        return await self.async_run(inp)

    async def async_run(
        self, inp: GenerateInput
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        """Run an already validated input: its result dicts, shaped as `async_generate`'s
        (an async iterator when it streams: the server streams each item on its own)."""
        if self._stopped:
            raise RuntimeError("the engine has been shut down")
        loop = asyncio.get_running_loop()
        reqs = self._reqs(inp)
        for req, compiled in self._compile_grammars(reqs):
            req.grammar = (await asyncio.wrap_future(compiled)).matcher()
        sinks = self._submit_all(reqs, loop)
        if inp.stream:
            return self._stream_async(sinks[0], reqs[0].rid)
        try:
            results = [await self._wait_final_async(s) for s in sinks]
        except asyncio.CancelledError:
            for r in reqs:
                self.abort(r.rid)
            raise
        return _shape(results, inp)

    def flush_cache(self) -> None:
        """Empty the prefix cache and the compiled-grammar cache; refuses (RuntimeError) while
        requests are running or waiting."""
        if self._stopped:
            raise RuntimeError("the engine has been shut down")
        done: queue.Queue[Exception | None] = queue.Queue()
        self._inbox.put(_Flush(done))
        self._wake.set()
        error = done.get()
        if error is not None:
            raise error

    def pin_prefix(
        self, prompt: str | None = None, input_ids: list[int] | None = None
    ) -> PinnedPrefix:
        """Compute the KV of a prefix and keep it in the radix cache, never evicted, until
        `unpin_prefix`: what a program that forks or batches over the prefix does first."""
        inp = self.make_input(prompt, {"max_new_tokens": 0}, input_ids)
        if inp.batched:
            raise ValueError("pin_prefix takes one prompt, not a list")
        req = self._new_req(inp.items[0], False)
        req.pin_id = req.rid
        out = self._wait_final_sync(self._submit_all([req], None)[0])
        reason = out["meta_info"]["finish_reason"]
        if reason["type"] == "abort":
            raise RuntimeError(f"pin_prefix failed: {reason.get('message')}")
        return PinnedPrefix(req.rid, out["meta_info"]["pinned_tokens"])

    def unpin_prefix(self, pin: PinnedPrefix) -> None:
        """Let the cache evict a pinned prefix again (after a flush, or shut down: nothing to do)."""
        if self._stopped:
            return
        done: queue.Queue[None] = queue.Queue()
        self._inbox.put(_Unpin(pin.pin_id, done))
        self._wake.set()
        done.get()

    def cache_hit_rate(self) -> float:
        """Fraction of finished requests' prompt tokens served from the prefix cache."""
        return self.stats["cached_tokens"] / max(1, self.stats["prompt_tokens"])

    def abort(self, rid: str) -> None:
        """Stop a request; it finishes with finish_reason type 'abort'."""
        self._inbox.put(rid)
        self._wake.set()

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.grammars.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def snapshot(self) -> EngineStats:
        """The engine's load and counters now (read from any thread)."""
        return EngineStats(
            num_running_reqs=len(self.scheduler.running),
            num_waiting_reqs=len(self.scheduler.waiting),
            kv_pages_total=self.kv_pages_total(),
            kv_pages_free=self.kv_pages_free(),
            page_size=self.config.page_size,
            grammar_cache_bytes=self.grammars.cache_nbytes(),
            counters=dict(self.stats),
        )

    def kv_pages_free(self) -> int:
        return self.runner.pool.available()

    def kv_pages_total(self) -> int:
        return self.runner.pool.capacity_pages

    # -- request construction (caller thread) -----------------------------------------------
    def make_input(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> GenerateInput:
        """The validated `GenerateInput` of `generate`'s arguments."""
        if self._stopped:
            raise RuntimeError("the engine has been shut down")
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        if prompt is not None:
            batched = isinstance(prompt, list)
            prompts = prompt if batched else [prompt]
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids_list = [self._encode(p) for p in prompts]
        else:
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            ids_list = input_ids if batched else [input_ids]
        logprob = self.limits.logprob(
            return_logprob, logprob_start_len, top_logprobs_num, token_ids_logprob
        )
        return GenerateInput.build(
            ids_list,
            sampling_params,
            self.limits,
            batched=batched,
            rid=rid,
            logprobs=[logprob] * len(ids_list),
            stream=stream,
            prompt_field="prompt" if prompt is not None else "input_ids",
        )

    def _reqs(self, inp: GenerateInput) -> list[Req]:
        return [self._new_req(item, inp.stream) for item in inp.items]

    def _compile_grammars(self, reqs: list[Req]) -> list[tuple[Req, Future]]:
        """Start compiling the grammars of constrained requests on the grammar pool."""
        return [(r, self.grammars.submit(r.params)) for r in reqs if r.params.grammar is not None]

    def _encode(self, text: str) -> list[int]:
        check_encodable(text, "prompt")
        return self.tokenizer.encode(text)

    def check_prompt(self, ids: list[int]) -> None:
        """Raise ValueError unless `ids` is a prompt this engine can run: non-empty, in the
        vocabulary, and short enough to leave room for a generated token."""
        self.limits.check_prompt(ids)

    def _new_req(self, item: GenerateItem, stream: bool) -> Req:
        params, ids = item.params, item.input_ids
        detok = IncrementalDetokenizer(
            self.tokenizer,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            stop_strings=params.stop_strings,
            no_stop_trim=params.no_stop_trim,
            stop_regexes=params.stop_regex_patterns,
        )
        sampler = RequestSampler(params, prompt_ids=ids, eos_token_ids=self.eos_token_ids)
        logprob = item.logprob or LogprobRequest()
        return Req(item.rid, list(ids), params, sampler, detok, logprob, stream)

    def _submit_all(self, reqs: list[Req], loop: asyncio.AbstractEventLoop | None) -> list[_Sink]:
        """Hand requests to the engine thread; a rid still in use refuses them all."""
        with self._rid_lock:
            taken = [r.rid for r in reqs if r.rid in self._live_rids]
            if taken or len({r.rid for r in reqs}) < len(reqs):
                name = taken[0] if taken else reqs[0].rid
                raise ValueError(f"rid {name!r} is already in use by a running request")
            self._live_rids.update(r.rid for r in reqs)
        sinks = [_Sink(loop) for _ in reqs]
        for req, sink in zip(reqs, sinks, strict=True):
            self._inbox.put(_Submission(req, sink))
        self._wake.set()
        return sinks

    # -- waiting for results ----------------------------------------------------------------
    def _wait_final_sync(self, sink: _Sink) -> dict[str, Any]:
        while True:
            item = sink.queue.get()
            if item["meta_info"]["finish_reason"] is not None:
                return item

    async def _wait_final_async(self, sink: _Sink) -> dict[str, Any]:
        while True:
            item = await sink.queue.get()
            if item["meta_info"]["finish_reason"] is not None:
                return item

    def _stream_sync(self, sink: _Sink) -> Iterator[dict[str, Any]]:
        while True:
            item = sink.queue.get()
            yield item
            if item["meta_info"]["finish_reason"] is not None:
                return

    async def _stream_async(self, sink: _Sink, rid: str) -> AsyncIterator[dict[str, Any]]:
        finished = False
        try:
            while not finished:
                item = await sink.queue.get()
                finished = item["meta_info"]["finish_reason"] is not None
                yield item
        finally:
            if not finished:
                self.abort(rid)

    # -- the loop (engine thread) -----------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            self._drain_inbox()
            if not self.scheduler.has_work():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                self.step()
            except Exception as exc:  # a bug must not hang callers: fail what was running
                logger.exception("engine step failed")
                for req in list(self.scheduler.running):
                    self.scheduler.remove(req)
                    self._finish(
                        req, FinishReason.abort(f"engine error: {exc!r}", AbortCause.ENGINE)
                    )
        self._drain_inbox()  # answer what arrived during shutdown: requests are aborted below
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.remove(req)
            self._finish(req, FinishReason.abort("engine shut down", AbortCause.CANCELLED))

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, str):
                self._abort_now(item)
            elif isinstance(item, _Flush):
                try:
                    self.scheduler.flush_cache()
                    self.grammars.flush()
                    item.done.put(None)
                except RuntimeError as exc:
                    item.done.put(exc)
                self.stats["pinned_tokens"] = self.scheduler.pinned_tokens
            elif isinstance(item, _Unpin):
                self.scheduler.unpin(item.pin_id)
                self.stats["pinned_tokens"] = self.scheduler.pinned_tokens
                item.done.put(None)
            else:
                self._sinks[item.req.rid] = item.sink
                self.scheduler.add(item.req)
                self.stats["requests"] += 1

    def _abort_now(self, rid: str) -> None:
        for req in itertools.chain(self.scheduler.running, self.scheduler.waiting):
            if req.rid == rid:
                self.scheduler.remove(req)
                self._finish(req, FinishReason.abort("aborted by request", AbortCause.CANCELLED))
                return

    def step(self) -> None:
        """One schedule → forward → sample (or verify drafts) → finish round."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        step = self.scheduler.schedule()
        for req in self.scheduler.failed:
            self._finish(req, req.finish_reason)
        self.scheduler.failed.clear()
        if step is None:
            return
        self.stats["steps"] += 1
        rows = _LogitRows.plan(step)
        batch = self.runner.build_batch(step, rows.indices)
        logits = self.runner.forward(batch)
        for req, n in zip(step.reqs, step.extend_lens, strict=True):
            req.kv_len += n
            if n > 1 and req.kv_len - n < len(req.prompt_ids):  # a prompt chunk, not a jump
                self.scheduler.cache_prefill_chunk(req)
        if rows.input_rows:
            self._input_logprobs(step, rows, logits)
        sampled = []
        for i, row in zip(rows.sample_reqs, rows.sample_rows, strict=True):
            req = step.reqs[i]
            if req.params.max_new_tokens == 0:  # prefill only: cache the prompt, score it
                self.scheduler.remove(req)
                if req.pin_id is not None:
                    req.pinned_tokens = self.scheduler.pin(req.pin_id, req.prompt_ids)
                    self.stats["pinned_tokens"] = self.scheduler.pinned_tokens
                self._finish(req, FinishReason.limit(0))
            else:
                sampled.append((req, row))
        if not sampled:
            return
        plain = [(req, row) for req, row in sampled if not req.draft_ids]
        verifying = [(req, row) for req, row in sampled if req.draft_ids]
        now = time.monotonic()
        if plain:
            self._sample(logits, plain, now)
        if verifying:
            self._verify(logits, verifying, now)

    def _sample(self, logits: torch.Tensor, sampled: list[tuple[Req, int]], now: float) -> None:
        """Sample one token for each request from its logits row."""
        sample_logits = logits[torch.tensor([row for _, row in sampled])]
        reqs = [req for req, _ in sampled]
        failed = self.grammars.mask_logits(sample_logits, reqs)  # rows whose grammar gave out
        want_lp = any(r.logprob.return_logprob for r in reqs)
        top_k = max(r.logprob.top_logprobs_num for r in reqs) if want_lp else 0
        out = self.sampler.sample(
            sample_logits,
            SamplingBatch.build([r.sampler for r in reqs], self.vocab_size, logits.device),
            return_logprob=want_lp,
            top_logprobs_num=top_k,
            return_all_logprobs=want_lp and any(r.logprob.token_ids for r in reqs),
        )
        tokens = out.next_token_ids.tolist()
        for i, (req, token) in enumerate(zip(reqs, tokens, strict=True)):
            refused = budget_abort(failed[i]) if i in failed else self._append(req, token, now)
            if refused is not None:
                self._after_sampling(req, 0, refused)
                continue
            if req.logprob.return_logprob:
                req.output_logprobs.append(float(out.logprobs[i]))
                if req.logprob.top_logprobs_num:
                    req.output_top_logprobs.append(_top(out.top_logprobs, i, req))
                if req.logprob.token_ids:
                    row = out.all_logprobs[i, req.logprob.token_ids].clamp(min=LOGPROB_FLOOR)
                    req.output_token_ids_logprobs.append(row.tolist())
            self._after_sampling(req, 1, self._finish_reason(req, token))

    def _verify(self, logits: torch.Tensor, verifying: list[tuple[Req, int]], now: float) -> None:
        """Check each request's drafts (rows row..row+k) and append what the target accepts."""
        rows = [r for req, row in verifying for r in range(row, row + len(req.draft_ids) + 1)]
        reqs = [req for req, _ in verifying]
        emitted = self.speculator.verify(logits[torch.tensor(rows)], reqs)
        for req, tokens in zip(reqs, emitted, strict=True):
            self.stats["spec_verify_steps"] += 1
            self.stats["spec_draft_tokens"] += len(req.draft_ids)
            self.stats["spec_accepted_tokens"] += len(tokens) - 1
            req.draft_ids = []
            reason = None
            appended = 0
            for token in tokens:  # stop checks token by token: truncate at the first finish
                reason = self._append(req, token, now)
                if reason is not None:
                    break
                appended += 1
                reason = self._finish_reason(req, token)
                if reason is not None:
                    break
            self._after_sampling(req, appended, reason)

    def _append(self, req: Req, token: int, now: float) -> FinishReason | dict[str, Any] | None:
        """Add a sampled token; an abort reason if the request's grammar refuses it."""
        try:
            refused = req.grammar is not None and not req.grammar.accept(token)
        except GrammarBudgetExceeded as exc:
            return budget_abort(exc)
        if refused:
            # Only a row with no allowed token at all (e.g. min_new_tokens blocking the EOS
            # the grammar requires) gets here; fail this request alone.
            return FinishReason.abort(f"no token satisfies the grammar (sampled {token})")
        req.output_ids.append(token)
        req.sampler.observe(token)
        if req.first_token_time is None:
            req.first_token_time = now
        return None

    def _after_sampling(
        self, req: Req, appended: int, reason: FinishReason | dict[str, Any] | None
    ) -> None:
        """Drop the KV of rejected drafts, jump forward, then finish or stream the request."""
        # Only the newest token lacks KV; a verify step wrote KV for drafts that were rejected,
        # lowering kv_len leaves their pages to be rewritten (they never reach the radix tree).
        req.kv_len = min(req.kv_len, req.fill_len - 1)
        if self.speculator is not None:
            req.sample_steps += 1
            req.sampled_tokens += appended
        if reason is None and req.grammar is not None and self.config.jump_forward:
            try:
                self.stats["jump_forward_tokens"] += jump_forward(req, self.tokenizer)
            except GrammarBudgetExceeded as exc:
                reason = budget_abort(exc)
            else:
                reason = self._done_reason(req)
        if reason is not None:
            self.scheduler.remove(req)
            self._finish(req, reason)
        elif req.stream:
            self._emit(req)

    def _finish_reason(self, req: Req, token: int) -> FinishReason | dict[str, Any] | None:
        p = req.params
        if (not p.ignore_eos and token in self.eos_token_ids) or (
            p.stop_token_ids and token in p.stop_token_ids
        ):
            return FinishReason.stop(token)
        if req.stream or p.stop_strings or p.stop_regex_patterns:
            try:
                matched = req.detokenizer.update(req.output_ids)
            except StopRegexTimeout as exc:
                return FinishReason.abort(str(exc))
            if matched is not None:
                return FinishReason.stop(matched)
        return self._done_reason(req)

    def _done_reason(self, req: Req) -> FinishReason | dict[str, Any] | None:
        """Finish reason once the grammar is complete or the output or context is full."""
        p = req.params
        try:
            if req.grammar is not None and req.grammar.is_terminated():
                return FinishReason.stop(None)
        except GrammarBudgetExceeded as exc:
            return budget_abort(exc)
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason.limit(p.max_new_tokens)
        if req.fill_len >= self.context_length:
            return FinishReason.limit(len(req.output_ids))
        return None

    def _finish(self, req: Req, reason: FinishReason | dict[str, Any]) -> None:
        """Finish a request; a dict reason (the scheduler's, a grammar budget's) is read as
        SGLang's form. The request keeps that form: it is what outputs carry."""
        if isinstance(reason, dict):
            reason = FinishReason.from_dict(reason)
        req.finish_reason = reason.to_dict()
        if self.speculator is not None:
            self.speculator.release(req)
        if reason.kind != "stop" or not isinstance(reason.matched, str):
            req.detokenizer.flush(req.output_ids)
        self.stats["prompt_tokens"] += len(req.prompt_ids)
        self.stats["cached_tokens"] += req.cached_tokens
        self.stats["completion_tokens"] += len(req.output_ids)
        if self.config.log_requests:
            logger.info("%s", request_log_line(req))
        self._emit(req)
        self._sinks.pop(req.rid, None)
        with self._rid_lock:
            self._live_rids.discard(req.rid)

    def _emit(self, req: Req) -> None:
        sink = self._sinks.get(req.rid)
        if sink is not None:
            sink.put(self._output(req))

    def _output(self, req: Req) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason,
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.first_token_time is not None:
            meta["ttft"] = req.first_token_time - req.created
        if req.pin_id is not None:
            meta["pinned_tokens"] = req.pinned_tokens
        if self.speculator is not None:
            meta["spec_accept_length"] = req.sampled_tokens / max(1, req.sample_steps)
        if req.logprob.return_logprob:
            meta.update(_logprob_meta(req))
        detok = req.detokenizer
        text = detok.text if req.finished else detok.stream_text
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def _input_logprobs(self, step: ScheduledStep, rows: _LogitRows, logits: torch.Tensor) -> None:
        """Logprob of each prompt token given the tokens before it (for `select` scoring)."""
        logp = torch.log_softmax(logits[rows.input_rows_flat], dim=-1)
        offset = 0
        for req_i, positions in rows.input_rows:
            req = step.reqs[req_i]
            start = min(req.logprob.logprob_start_len, len(req.prompt_ids) - 1)
            if start == 0 and not req.input_logprobs:
                req.input_logprobs.append(None)
                req.input_top_logprobs.append(None)
                req.input_token_ids_logprobs.append(None)
            k = req.logprob.top_logprobs_num
            wanted = req.logprob.token_ids
            for j, pos in enumerate(positions):
                row = logp[offset + j]
                if pos + 1 == start + len(req.input_logprobs):
                    token = req.prompt_ids[pos + 1]
                    req.input_logprobs.append(float(row[token]))
                    if k:
                        vals, ids = row.topk(k)
                        req.input_top_logprobs.append(
                            list(zip(vals.tolist(), ids.tolist(), strict=True))
                        )
                    if wanted:
                        req.input_token_ids_logprobs.append(row[wanted].tolist())
            offset += len(positions)


@dataclass
class _LogitRows:
    """Which token rows of a step need logits: one per request that samples (k+1 in a row for
    one verifying k drafts), plus prompt rows."""

    indices: torch.Tensor
    sample_reqs: list[int]  # indices into step.reqs
    sample_rows: list[int]  # rows of the logits tensor to sample from
    input_rows: list[tuple[int, list[int]]]  # (req index, prompt positions predicting pos+1)
    input_rows_flat: torch.Tensor

    @classmethod
    def plan(cls, step: ScheduledStep) -> _LogitRows:
        indices: list[int] = []
        sample_reqs: list[int] = []
        sample_rows: list[int] = []
        input_rows: list[tuple[int, list[int]]] = []
        input_flat: list[int] = []
        start = 0
        for i, (req, n) in enumerate(zip(step.reqs, step.extend_lens, strict=True)):
            if req.wants_input_logprobs:
                first = max(
                    min(req.logprob.logprob_start_len, len(req.prompt_ids) - 1) - 1, req.kv_len
                )
                last = min(req.kv_len + n, len(req.prompt_ids) - 1)
                positions = list(range(first, last))
                start_at_zero = req.logprob.logprob_start_len == 0 and not req.input_logprobs
                if positions or start_at_zero:
                    input_rows.append((i, positions))
                    for pos in positions:
                        input_flat.append(len(indices))
                        indices.append(start + pos - req.kv_len)
            drafts = len(req.draft_ids)
            if req.kv_len + n == req.fill_len + drafts:  # sample, or verify k drafts: k+1 rows
                sample_reqs.append(i)
                sample_rows.append(len(indices))
                indices.extend(range(start + n - 1 - drafts, start + n))
            start += n
        return cls(
            torch.tensor(indices, dtype=torch.int64),
            sample_reqs,
            sample_rows,
            input_rows,
            torch.tensor(input_flat, dtype=torch.int64),
        )


def _logprob_meta(req: Req) -> dict[str, Any]:
    """SGLang's logprob entries, (logprob, token id, text) with the text left to the server.

    Input entries start at logprob_start_len (the first is None at position 0: nothing
    predicts it); with logprob_start_len -1 the input lists are empty, as in SGLang.
    """
    lp = req.logprob
    meta: dict[str, Any] = {
        "output_token_logprobs": [
            (v, t, None) for v, t in zip(req.output_logprobs, req.output_ids, strict=False)
        ],
        "output_token_logprobs_length": min(len(req.output_logprobs), len(req.output_ids)),
        "input_token_logprobs": [],
    }
    if lp.top_logprobs_num:
        meta["output_top_logprobs"] = [
            [(v, t, None) for v, t in row] for row in req.output_top_logprobs
        ]
        meta["input_top_logprobs"] = []
    if lp.token_ids:
        meta["output_token_ids_logprobs"] = [
            [(v, t, None) for v, t in zip(row, lp.token_ids, strict=True)]
            for row in req.output_token_ids_logprobs
        ]
        meta["input_token_ids_logprobs"] = []
    if lp.logprob_start_len < 0:
        return meta
    start = min(lp.logprob_start_len, len(req.prompt_ids) - 1)
    ids = req.prompt_ids[start:]
    meta["input_token_logprobs"] = [
        (v, t, None) for v, t in zip(req.input_logprobs, ids, strict=False)
    ]
    if lp.top_logprobs_num:
        meta["input_top_logprobs"] = [
            None if row is None else [(v, t, None) for v, t in row]
            for row in req.input_top_logprobs
        ]
    if lp.token_ids:
        meta["input_token_ids_logprobs"] = [
            None if row is None else [(v, t, None) for v, t in zip(row, lp.token_ids, strict=True)]
            for row in req.input_token_ids_logprobs
        ]
    return meta


def _top(
    top_logprobs: tuple[torch.Tensor, torch.Tensor], i: int, req: Req
) -> list[tuple[float, int]]:
    vals, ids = top_logprobs
    k = req.logprob.top_logprobs_num
    # Tokens a grammar forbids have logprob -inf, which JSON cannot carry; report the floor
    # vLLM reports for them.
    finite = vals[i, :k].clamp(min=LOGPROB_FLOOR)
    return list(zip(finite.tolist(), ids[i, :k].tolist(), strict=True))


def _shutdown_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.shutdown()


def _eos_ids(checkpoint) -> set[int]:
    ids: set[int] = set()
    for source in (checkpoint.config, getattr(checkpoint, "generation_config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    if checkpoint.tokenizer.eos_token_id is not None:
        ids.add(checkpoint.tokenizer.eos_token_id)
    return ids


def _shape(results: list[dict[str, Any]], inp: GenerateInput):
    """One dict for a lone prompt with n=1, else the list."""
    if inp.batched or len(inp.items) > 1:
        return results
    return results[0]
