"""The offline engine: a background loop that schedules, runs the model and processes outputs.

caller thread(s)                         engine thread (one step at a time)
generate / async_generate ──inbox──►  admit, abort ─► Scheduler.schedule()
      ▲                                  ModelRunner.forward ─► OutputProcessor.process
      └──────── per-request sinks ◄───── finished / streamed requests (retired here)

A constrained request is posted as soon as its grammar starts compiling (on the grammar pool):
its prompt prefills meanwhile, the logits of its first token wait for the grammar, and the
engine gives it its matcher and samples that token from them when the compile is done (no
extra forward); the caller waits for the compile too, and on failure aborts the request and
raises the error.

Longer than the ~400 lines a module should hold because most of it is the SGLang-shaped public
API, whose nine arguments are spelled out in `generate`, `async_generate` and `make_input`.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import itertools
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixflow.runtime.cache_manager import CacheManager
from radixflow.runtime.config import EngineConfig, request_log_line, startup_summary
from radixflow.runtime.constrained import GrammarService, grammar_limits
from radixflow.runtime.distributed.driver import TPDriver, TPFailure
from radixflow.runtime.distributed.worker import StartupReport, load_rank_checkpoint
from radixflow.runtime.engine_inbox import Flush, Inbox, Unpin
from radixflow.runtime.io_struct import (
    AbortCause,
    EngineStats,
    FinishReason,
    GenerateInput,
    InputLimits,
)
from radixflow.runtime.model_loader import Checkpoint
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.output_processor import LogitRows, OutputProcessor, StepOutcome
from radixflow.runtime.request import Req
from radixflow.runtime.request_builder import RequestBuilder
from radixflow.runtime.sampler import Sampler
from radixflow.runtime.scheduler import Scheduler, SchedulerLimits
from radixflow.runtime.speculative import Speculator, build_speculator

if TYPE_CHECKING:
    from radixflow.grammars.backends import Grammar

logger = logging.getLogger(__name__)


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
        if self.config.node_rank != 0:
            raise ValueError(
                f"node_rank {self.config.node_rank} runs only worker ranks "
                "(`radixflow serve --node-rank N`); the engine runs on node 0"
            )
        # tp_size > 1: the workers start first (they load their shards meanwhile); this
        # process is rank 0, on its own device / share of the cores
        self.tp_driver = TPDriver.start(self.config) if self.config.tp_size > 1 else None
        if self.tp_driver is not None:
            self.config = self.tp_driver.config
        try:
            self._build(self._load_runner())
        except BaseException:
            if self.tp_driver is not None:  # no worker is left waiting for a step
                self.tp_driver.stop()
            raise
        self._thread = threading.Thread(target=self._loop, name="radixflow-engine", daemon=True)
        self._thread.start()
        if self.tp_driver is not None:
            self.tp_driver.watch(self._fail)
        atexit.register(_shutdown_if_alive, weakref.ref(self))
        logger.info("%s", startup_summary(self))

    def _load_runner(self) -> Checkpoint:
        """Build this rank's ModelRunner; with workers, every rank's outcome is checked
        together (one error naming each rank that failed). Returns the checkpoint."""
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        tp = None if self.tp_driver is None else self.tp_driver.tp
        try:
            checkpoint = load_rank_checkpoint(self.config)
            self.runner = ModelRunner(self.config, checkpoint, tp)
        except Exception as exc:
            if self.tp_driver is not None:  # raises the error of every rank that failed
                self.tp_driver.confirm(StartupReport.failed(0, exc))
            raise
        if self.tp_driver is not None:
            self.tp_driver.confirm(StartupReport(0, None, self.runner.pool.capacity_pages))
        return checkpoint

    def _build(self, checkpoint: Checkpoint) -> None:
        """Everything around the runner: limits, cache manager, scheduler, sampler,
        speculator, grammars, outputs, counters."""
        self.sampling_defaults = checkpoint.sampling_defaults
        self.tokenizer = checkpoint.tokenizer
        self.model_dir = checkpoint.model_dir
        # The hundreds of thousands of long-lived objects torch and transformers leave behind
        # would be rescanned by every full collection (about 0.3 s, stalling a step): move
        # them out of the collector's view.
        gc.freeze()
        self._gc_threshold_before = gc.get_threshold()
        thresholds = self.config.gc_thresholds()
        if thresholds is not None:
            gc.set_threshold(*thresholds)
            logger.info("garbage collector thresholds %s", gc.get_threshold())
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
        self.kv = CacheManager(self.runner.pool, disable=self.config.disable_radix_cache)
        self.scheduler = Scheduler(
            self.kv,
            SchedulerLimits(
                max_running_requests=self.config.max_running_requests,
                chunked_prefill_size=self.config.chunked_prefill_size,
                max_prefill_tokens=self.config.max_prefill_tokens,
                policy=self.config.schedule_policy,
            ),
        )
        self.sampler = Sampler(seed=self.config.random_seed)
        self.speculator: Speculator | None = build_speculator(
            self.config, self.runner, self.tokenizer, self.sampler
        )
        self.grammars = GrammarService(
            self.tokenizer,
            self.vocab_size,
            self.eos_token_ids,
            self.config.grammar_compile_timeout,
            limits=grammar_limits(self.config),
            cache_mb=self.config.grammar_cache_mb,
            workers=self.config.grammar_compile_workers,
            import_paths=self.config.grammar_import_paths,
            device=self.runner.device,
            backend=self.config.grammar_backend,
            fallback=self.config.grammar_backend_fallback,
        )
        self._requests = RequestBuilder(
            self.tokenizer, self.limits, self.eos_token_ids, self.grammars
        )
        self.outputs = OutputProcessor(
            sampler=self.sampler,
            grammars=self.grammars,
            speculator=self.speculator,
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            jump_forward=self.config.jump_forward,
        )
        self._inbox = Inbox()
        self._compiling: list[Req] = []  # requests whose grammar compiles (engine thread)
        self._stopped = False
        self.failure: str | None = None  # why the engine cannot run (a tensor-parallel rank died)
        self.failed = threading.Event()  # set with `failure`: the server exits on it
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
        reqs = self._requests.reqs(inp)
        compiling = self._start_compiling(reqs)
        sinks = self._inbox.submit(reqs, None)
        try:
            for future in compiling:
                future.result()
        except BaseException:
            self._abort_all(reqs)
            for sink in sinks:  # the rids are free again once the aborts are answered
                sink.wait_final()
            raise
        if inp.stream:
            return sinks[0].stream()
        return _shape([s.wait_final() for s in sinks], inp)

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
        self._check_alive()
        loop = asyncio.get_running_loop()
        reqs = self._requests.reqs(inp)
        compiling = self._start_compiling(reqs)
        sinks = self._inbox.submit(reqs, loop)
        try:
            for future in compiling:
                await asyncio.wrap_future(future)
        except BaseException as exc:
            self._abort_all(reqs)
            if not isinstance(exc, asyncio.CancelledError):
                for sink in sinks:  # the rids are free again once the aborts are answered
                    await sink.wait_final_async()
            raise
        if inp.stream:
            return sinks[0].stream_async(lambda: self.abort(reqs[0].rid))
        try:
            results = [await s.wait_final_async() for s in sinks]
        except asyncio.CancelledError:
            for r in reqs:
                self.abort(r.rid)
            raise
        return _shape(results, inp)

    def flush_cache(self) -> None:
        """Empty the prefix cache and the compiled-grammar cache; refuses (RuntimeError) while
        requests are running or waiting."""
        self._check_alive()
        error = self._inbox.ask(Flush())
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
        req = self._requests.req(inp.items[0], False)
        req.pin_id = req.rid
        out = self._inbox.submit([req], None)[0].wait_final()
        reason = out["meta_info"]["finish_reason"]
        if reason["type"] == "abort":
            raise RuntimeError(f"pin_prefix failed: {reason.get('message')}")
        return PinnedPrefix(req.rid, out["meta_info"]["pinned_tokens"])

    def unpin_prefix(self, pin: PinnedPrefix) -> None:
        """Let the cache evict a pinned prefix again (after a flush, or shut down: nothing to do)."""
        if self._stopped:
            return
        self._inbox.ask(Unpin(pin.pin_id))

    def cache_hit_rate(self) -> float:
        """Fraction of finished requests' prompt tokens served from the prefix cache."""
        return self.stats["cached_tokens"] / max(1, self.stats["prompt_tokens"])

    def abort(self, rid: str) -> None:
        """Stop a request; it finishes with finish_reason type 'abort'."""
        self._inbox.abort(rid)

    def _abort_all(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.abort(req.rid)

    def _start_compiling(self, reqs: list[Req]) -> list[Future[Grammar | None]]:
        """Start compiling the grammars of constrained requests; the engine prefills their
        prompts meanwhile and gives each its matcher when its compile is done."""
        compiling = []
        for req, future in self._requests.compile_grammars(reqs):
            req.grammar_compiling = future
            future.add_done_callback(lambda _: self._inbox.wake())
            compiling.append(future)
        return compiling

    def _check_alive(self) -> None:
        refusal = self._refusal()
        if refusal is not None:
            raise RuntimeError(refusal)

    def _refusal(self) -> str | None:
        """Why the engine takes no more requests, or None while it does."""
        if self.failure is not None:
            return f"the engine failed: {self.failure}"
        if self._stopped:
            return "the engine has been shut down"
        return None

    def _fail(self, message: str) -> None:
        """The engine cannot run another step (any thread): its loop fails every request,
        new ones are refused, and `failed` is set."""
        if self.failure is None:
            logger.error("engine failed: %s", message)
            self.failure = message
            if self.tp_driver is not None:
                self.tp_driver.broken = True
            self.failed.set()
        self._inbox.wake()

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._inbox.wake()
        self._thread.join(timeout=30)
        if self.tp_driver is not None:
            if self._thread.is_alive():  # stuck in a collective: the group carries no STOP
                self.tp_driver.broken = True
            self.tp_driver.stop()
        self.grammars.shutdown()
        gc.unfreeze()  # what __init__ froze can be collected again (at exit too)
        gc.set_threshold(*self._gc_threshold_before)

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
        self._check_alive()
        return self._requests.input(
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

    def check_prompt(self, ids: list[int]) -> None:
        """Raise ValueError unless `ids` is a prompt this engine can run: non-empty, in the
        vocabulary, and short enough to leave room for a generated token."""
        self.limits.check_prompt(ids)

    # -- the loop (engine thread) -----------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped and self.failure is None:
            self._drain_inbox()
            try:
                if self.tp_driver is not None:
                    self.tp_driver.ping()
                if not self.scheduler.has_work():
                    self._inbox.wait(timeout=0.5)
                elif not self.step():  # requests wait for their grammars: a compile wakes us
                    self._inbox.wait(timeout=0.01)
            except TPFailure as exc:  # the ranks are out of step: nothing more can run
                self._fail(str(exc))
            except Exception as exc:  # a bug must not hang callers: fail what was running
                logger.exception("engine step failed")
                for req in list(self.scheduler.running):
                    self.scheduler.remove(req)
                    self._finish(
                        req, FinishReason.abort(f"engine error: {exc!r}", AbortCause.ENGINE)
                    )
        self._inbox.seal(self._refusal() or "the engine has been shut down")
        self._drain_inbox()  # answer what arrived during shutdown: requests are aborted below
        reason = (
            FinishReason.abort("engine shut down", AbortCause.CANCELLED)
            if self.failure is None
            else FinishReason.abort(f"engine failed: {self.failure}", AbortCause.ENGINE)
        )
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.remove(req)
            self._finish(req, reason)

    def _drain_inbox(self) -> None:
        for item in self._inbox.drain():
            if isinstance(item, str):
                self._abort_now(item)
            elif isinstance(item, Flush):
                try:
                    self.scheduler.flush_cache()
                    self.grammars.flush()
                    item.done.put(None)
                except RuntimeError as exc:
                    item.done.put(exc)
                self.stats["pinned_tokens"] = self.kv.pinned_tokens
            elif isinstance(item, Unpin):
                self.kv.unpin(item.pin_id)
                self.stats["pinned_tokens"] = self.kv.pinned_tokens
                item.done.put(None)
            else:
                req = self._inbox.open(item)
                if req.grammar_compiling is not None:
                    self._compiling.append(req)
                self.scheduler.add(req)
                self.stats["requests"] += 1

    def _install_grammars(self) -> list[Req]:
        """Give each request whose grammar has compiled its matcher; returns those whose first
        token's logits wait for it (`Req.deferred_logits`). A failed compile leaves its request
        parked: the caller, who gets the error, aborts it."""
        ready = []
        for req in list(self._compiling):
            future = req.grammar_compiling
            if future is not None and not future.done():
                continue
            self._compiling.remove(req)
            grammar = None if future is None or future.exception() else future.result()
            if grammar is not None:
                req.grammar = grammar.matcher()
                req.grammar_compiling = None
                if req.deferred_logits is not None and not req.finished:
                    ready.append(req)
        return ready

    def _abort_now(self, rid: str) -> None:
        for req in itertools.chain(self.scheduler.running, self.scheduler.waiting):
            if req.rid == rid:
                self.scheduler.remove(req)
                self._finish(req, FinishReason.abort("aborted by request", AbortCause.CANCELLED))
                return

    def step(self) -> bool:
        """One round: schedule, run the model, process its logits, retire what finished.
        False when nothing could run (every request waits for its grammar)."""
        ready = self._install_grammars()
        if ready:
            self._settle(self.outputs.sample_deferred(ready))
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        step = self.scheduler.schedule()
        for req in self.scheduler.failed:
            assert req.finish_reason is not None  # the scheduler's abort
            self._finish(req, req.finish_reason)
        self.scheduler.failed.clear()
        if step is None:
            return bool(ready)
        self.stats["steps"] += 1
        rows = LogitRows.plan(step)
        batch = self.runner.build_batch(step, rows.indices)
        if self.tp_driver is None:
            logits = self.runner.forward(batch)
        else:  # the workers run the same batch
            logits = self.tp_driver.forward(self.runner, batch)
        for req, n in zip(step.reqs, step.extend_lens, strict=True):
            self.kv.commit(req, n)
        self._settle(self.outputs.process(step, rows, logits))
        return True

    def _settle(self, outcome: StepOutcome) -> None:
        """Count, retire and stream what sampling did."""
        for name, n in outcome.stats.items():
            self.stats[name] += n
        for req, reason in outcome.finished:
            self._retire(req, reason)
        for req in outcome.streamed:
            self._emit(req)

    def _retire(self, req: Req, reason: FinishReason) -> None:
        """Finish a request `process` returned: its KV goes back (a pin_prefix request's
        prompt is then pinned in the tree), its final output to its sink."""
        self.scheduler.remove(req)
        if req.pin_id is not None:
            req.pinned_tokens = self.kv.pin(req.pin_id, req.prompt_ids)
            self.stats["pinned_tokens"] = self.kv.pinned_tokens
        self._finish(req, reason)

    def _finish(self, req: Req, reason: FinishReason | dict[str, Any]) -> None:
        """Finish a request; a dict reason (the scheduler's) is read as SGLang's form. The
        request keeps that form: it is what outputs carry."""
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
        self._inbox.close(req.rid)

    def _emit(self, req: Req) -> None:
        sink = self._inbox.sink(req.rid)
        if sink is not None:
            sink.put(self.outputs.output(req))


def _shutdown_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.shutdown()


def _eos_ids(checkpoint: Checkpoint) -> set[int]:
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


def _shape(
    results: list[dict[str, Any]], inp: GenerateInput
) -> dict[str, Any] | list[dict[str, Any]]:
    """One dict for a lone prompt with n=1, else the list."""
    if inp.batched or len(inp.items) > 1:
        return results
    return results[0]
