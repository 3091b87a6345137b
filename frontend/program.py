"""`@function`: a program, with `.run`, `.run_batch`, `.bind` and `.trace`."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm.auto import tqdm

from radixflow.frontend.backend import Backend
from radixflow.frontend.global_config import global_config
from radixflow.frontend.interpreter import StreamExecutor
from radixflow.frontend.ir import GenArgs
from radixflow.frontend.program_error import ProgramError, body_site
from radixflow.frontend.state import ProgramState

logger = logging.getLogger(__name__)


def set_default_backend(backend: Backend) -> None:
    """The backend programs use when `run` gets none (`global_config.default_backend`)."""
    if not isinstance(backend, Backend):
        raise ValueError(f"set_default_backend takes a backend, got {type(backend).__name__}")
    global_config.default_backend = backend


def get_default_backend() -> Backend | None:
    return global_config.default_backend


def resolve_backend(backend: Backend | None) -> Backend:
    backend = backend or global_config.default_backend
    if backend is None:
        raise ValueError(
            "no backend: call rf.set_default_backend(rf.Runtime()) or pass backend=..."
        )
    return backend


class SglFunction:
    """A generation program: a Python function whose first argument is the state `s`."""

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise ValueError(f"program {func.__name__} must take the state as its first argument")
        if num_api_spec_tokens is not None and (
            not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1
        ):
            raise ValueError(
                f"num_api_spec_tokens must be a positive int, got {num_api_spec_tokens!r}"
            )
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        self.arg_names = [p.name for p in params[1:] if p.kind not in variadic]
        self._accepts_var_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
        self._defaults = {p.name for p in params[1:] if p.default is not p.empty}
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some arguments fixed."""
        unknown = [k for k in kwargs if k not in self.arg_names and not self._accepts_var_kwargs]
        if unknown:
            raise ValueError(f"{self.func.__name__} has no argument(s) {', '.join(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def _arguments(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.arg_names):
            raise ValueError(
                f"{self.func.__name__} takes {len(self.arg_names)} argument(s) after s, "
                f"got {len(args)}"
            )
        return {**self.bind_arguments, **dict(zip(self.arg_names, args, strict=False)), **kwargs}

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: Backend | None = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once; the keyword sampling knobs are defaults for its `gen` calls.

        Raises ProgramError (naming the program line) if it fails. With stream=True it
        returns at once; read `state.text_iter()`, which raises at the end if it failed.
        use_thread=False runs every expression in the calling thread as it is appended.
        """
        defaults = GenArgs(
            max_new_tokens=max_new_tokens,
            n=n,
            stop=stop,
            stop_token_ids=stop_token_ids,
            stop_regex=stop_regex,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        arguments = self._arguments(args, kwargs)
        executor = StreamExecutor(
            resolve_backend(backend),
            defaults,
            stream,
            use_thread=use_thread,
            num_api_spec_tokens=self.num_api_spec_tokens,
        )
        state = ProgramState(executor)
        if stream:
            threading.Thread(
                target=self._execute, args=(state, arguments), name="radixflow-program", daemon=True
            ).start()
            return state
        self._execute(state, arguments)
        if state.error() is not None:
            raise state.error()
        return state

    def _execute(self, state: ProgramState, arguments: dict[str, Any]) -> None:
        """Run the body; any failure ends up in state.error(). The state is ended either way."""
        executor = state.stream_executor
        try:
            self.func(state, **arguments)
        except ProgramError as exc:
            executor.fail(exc)
        except Exception as exc:
            error = ProgramError(
                f"program {self.func.__name__} raised {type(exc).__name__}: {exc}",
                body_site(exc, self.func),
            )
            error.__cause__ = exc
            executor.fail(error)
        finally:
            executor.end()
            executor.wait_done()
            executor.release_pins()

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[list[Any] | tuple[Any, ...]],
        *,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program on each kwargs dict concurrently; states come back in input order.

        Each item is a dict of keyword arguments or (as SGLang) a list/tuple of positional
        ones. A failing program does not stop the others: its state has `.error()` set. Before
        the batch, the program's constant prefix (found by tracing) is computed once and cached.
        """
        if not isinstance(batch_kwargs, list | tuple):
            raise ValueError("run_batch takes a list of keyword-argument dicts or argument lists")
        batch_kwargs = [self._batch_item(item) for item in batch_kwargs]
        if not batch_kwargs:
            return iter([]) if generator_style else []
        backend = resolve_backend(backend)
        sampling = dict(
            max_new_tokens=max_new_tokens,
            n=n,
            stop=stop,
            stop_token_ids=stop_token_ids,
            stop_regex=stop_regex,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
        )
        defaults = GenArgs(**sampling)
        if num_threads == "auto":
            num_threads = max(64, (os.cpu_count() or 1) * 16)
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(
                f"num_threads must be 'auto' or a positive integer, got {num_threads!r}"
            )
        num_threads = max(1, min(num_threads, len(batch_kwargs)))
        pin = None
        if len(batch_kwargs) > 1:
            prefix = self.trace(backend=backend).prefix
            if prefix:
                pin = backend.pin_prefix(prefix)

        def one(kw: dict[str, Any]) -> ProgramState:
            state = ProgramState(
                StreamExecutor(backend, defaults, num_api_spec_tokens=self.num_api_spec_tokens)
            )
            self._execute(state, self._arguments((), kw))
            return state

        def run_all() -> Iterator[ProgramState]:
            try:
                yield from run_pinned()
            finally:
                backend.unpin_prefix(pin)

        def run_pinned() -> Iterator[ProgramState]:
            with ThreadPoolExecutor(num_threads) as pool:
                futures = [pool.submit(one, kw) for kw in batch_kwargs]
                with tqdm(total=len(futures), disable=not progress_bar) as bar:
                    if generator_style:
                        for f in futures:
                            yield f.result()
                            bar.update(1)
                        return
                    for _ in as_completed(futures):
                        bar.update(1)
                states = [f.result() for f in futures]
            failed = sum(s.error() is not None for s in states)
            if failed:
                logger.warning("%d of %d programs failed; see state.error()", failed, len(states))
            yield from states

        return run_all() if generator_style else list(run_all())

    def _batch_item(self, item: Any) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        if isinstance(item, list | tuple):
            required = [n for n in self.arg_names if n not in self._defaults]
            if not len(required) <= len(item) <= len(self.arg_names):
                raise ValueError(
                    f"{self.func.__name__} takes {len(required)} to {len(self.arg_names)} "
                    f"positional argument(s) after s, a run_batch item has {len(item)}"
                )
            return dict(zip(self.arg_names, item, strict=False))
        raise ValueError(
            f"a run_batch item must be a dict or a list of arguments, got {type(item).__name__}"
        )

    def cache(self, backend: Backend | None = None) -> Any:
        """Compute and cache the program's constant prefix (found by tracing) ahead of runs,
        as SGLang's `cache`: a hint only, skipped for prefixes of 64 characters or fewer."""
        backend = resolve_backend(backend)
        prefix = self.trace(backend=backend).prefix
        if len(prefix) > 64:
            return backend.cache_prefix(prefix)
        return None

    def trace(self, *, backend: Backend | None = None, **kwargs: Any):
        """Run the body symbolically and return its program graph (a ProgramTrace)."""
        from radixflow.frontend.tracer import trace_program

        backend = backend or global_config.default_backend
        template = backend.chat_template if backend is not None else None
        return trace_program(self, {**self.bind_arguments, **kwargs}, template)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def function(
    func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None
) -> SglFunction | Callable[[Callable[..., Any]], SglFunction]:
    """Decorator: `@function` or `@function(num_api_spec_tokens=...)` makes a program."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens)
