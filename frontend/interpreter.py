"""Running programs: each state has an executor thread that runs what the program appends.

program body (caller thread)          StreamExecutor thread (one per state, one per fork)
  s += expr  ──── queue ────────────►   text, gen, select, roles, scopes, in order
  s["x"]     ◄─── waits for "x" ─────   sets variables / meta_info, appends text
  s.fork(n)  ──── n new executors, each copying the state; they run concurrently

The body never blocks on a model call unless it reads a result, so independent states (and
forks) have their calls in flight together and the engine batches them.
"""

from __future__ import annotations

import asyncio
import linecache
import queue
import sys
import threading
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from radixflow.frontend.backend import Backend, Prompt
from radixflow.frontend.choices import ChoicesDecision
from radixflow.frontend.ir import (
    ConcatAndAppend,
    Expr,
    ExprList,
    Gen,
    GenArgs,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    to_expr,
)


class ProgramError(RuntimeError):
    """A program failed: its body raised, or a gen/select it ran failed.

    The message names the program line; `__cause__` is the original exception.
    """

    def __init__(self, message: str, site: str | None = None) -> None:
        super().__init__(message if site is None else f"{message}\n  at {site}")
        self.site = site


def caller_site() -> str | None:
    """'File "f.py", line 12, in prog: s += gen(...)' for the nearest frame outside radixflow."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("radixflow."):
        frame = frame.f_back
    if frame is None:
        return None
    return _describe(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _describe(filename: str, lineno: int, name: str) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f'File "{filename}", line {lineno}, in {name}' + (f": {code}" if code else "")


def body_site(exc: BaseException, func: Callable) -> str | None:
    """The deepest traceback line inside the program's own source file."""
    filename = getattr(getattr(func, "__code__", None), "co_filename", None)
    site = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename == filename:
            site = _describe(fs.filename, fs.lineno or 0, fs.name)
    return site


def _produced_names(expr: Expr) -> list[str]:
    """Variables an expression sets (what `s["x"]` must wait for)."""
    if isinstance(expr, ExprList):
        return [n for e in expr.exprs for n in _produced_names(e)]
    if isinstance(expr, Gen | Select) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, VarScopeEnd):
        return [expr.name]
    if isinstance(expr, _Gather):
        return list(expr.names)
    return []


class _Gather(Expr):
    """join(mode="gather_variable"): each new fork variable becomes a list in the parent."""

    def __init__(self, executors: list[StreamExecutor], names: list[str]) -> None:
        self.executors = executors
        self.names = names


class StreamExecutor:
    """The state of one program (or fork) and the thread that advances it."""

    def __init__(
        self,
        backend: Backend,
        defaults: GenArgs,
        stream: bool = False,
        parent: StreamExecutor | None = None,
    ) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.chat_template = backend.chat_template
        self.text_ = parent.text_ if parent else ""
        self.messages_: list[dict[str, Any]] = list(parent.messages_) if parent else []
        self.variables: dict[str, Any] = dict(parent.variables) if parent else {}
        self.meta_info: dict[str, Any] = dict(parent.meta_info) if parent else {}
        self.cur_role: str | None = parent.cur_role if parent else None
        self.cur_role_begin = parent.cur_role_begin if parent else 0
        self.scopes: dict[str, int] = dict(parent.scopes) if parent else {}
        self.fork_start = len(self.text_)
        self.root: StreamExecutor = parent.root if parent else self
        self._pins: list[Any] = []  # the root's: prefixes its forks pinned, held until release_pins
        self.error_: ProgramError | None = None
        self.children: list[StreamExecutor] = []
        self._cond = threading.Condition()
        self._pending = 0
        self._producing: Counter[str] = Counter()
        self._chunks: list[tuple[str | None, str]] = []
        self._ended = False
        self._done = False
        self._queue: queue.SimpleQueue[tuple[Expr, str | None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._worker, name="radixflow-state", daemon=True)
        self._thread.start()

    # -- called from the program body ------------------------------------------------------
    def submit(self, expr: Expr, site: str | None) -> None:
        with self._cond:
            if self._ended:
                raise ProgramError("this state has ended; it takes no more expressions", site)
            self._pending += 1
            self._producing.update(_produced_names(expr))
        self._queue.put((expr, site))

    def end(self) -> None:
        """No more expressions: the thread finishes what is queued and exits."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
        self._queue.put(None)
        for child in self.children:
            child.end()

    def sync(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def release_pins(self) -> None:
        """Unpin the prefixes this program's forks pinned (call on the root once it is done)."""
        with self._cond:
            pins, self._pins = self._pins, []
        for pin in pins:
            self.backend.unpin_prefix(pin)

    def wait_done(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._done)

    def get_var(self, name: str) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: self._producing[name] == 0 or self.error_ is not None)
            if name in self.variables and self._producing[name] == 0:
                return self.variables[name]
            if self.error_ is not None:
                raise self.error_
            raise KeyError(f"the program has no variable {name!r}")

    def set_var(self, name: str, value: Any) -> None:
        with self._cond:
            self.variables[name] = value

    def fail(self, error: ProgramError) -> None:
        """Record the first error; later expressions are skipped, waiters wake up."""
        with self._cond:
            if self.error_ is None:
                self.error_ = error
            self._cond.notify_all()

    def fork(self, n: int, site: str | None) -> list[StreamExecutor]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork takes a positive number of branches, got {n!r}")
        self.sync()
        if self.error_ is not None:
            raise self.error_
        if n > 1:  # compute the shared prefix once; the branches then hit the cache
            try:
                pin = self.backend.pin_prefix(self.text_)
            except Exception as exc:
                error = ProgramError(f"fork failed to cache its prefix: {exc}", site)
                self.fail(error)
                raise error from exc
            if pin is not None:
                with self.root._cond:
                    self.root._pins.append(pin)
        children = [
            StreamExecutor(self.backend, self.defaults, self.stream, self) for _ in range(n)
        ]
        self.children.extend(children)
        return children

    def iter_chunks(self, var_name: str | None) -> Iterator[str]:
        """Text as it is appended (only what `var_name` produces, if given) until the end."""
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda n=seen: len(self._chunks) > n or self._done)
                chunks, done = self._chunks[seen:], self._done
            seen += len(chunks)
            for name, text in chunks:
                if var_name is None or name == var_name:
                    yield text
            if done and not chunks:
                return

    # -- the executor thread ---------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            expr, site = item
            if self.error_ is None:
                try:
                    self._execute(expr)
                except ProgramError as exc:
                    self.fail(exc)
                except Exception as exc:
                    error = ProgramError(f"{_what(expr)} failed: {type(exc).__name__}: {exc}", site)
                    error.__cause__ = exc
                    self.fail(error)
            with self._cond:
                self._pending -= 1
                self._producing.subtract(_produced_names(expr))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _append(self, text: str, var: str | None = None) -> None:
        if not text:
            return
        with self._cond:
            self.text_ += text
            if self.stream:
                self._chunks.append((var, text))
                self._cond.notify_all()

    def _prompt(self) -> Prompt:
        role_text = self.text_[self.cur_role_begin :] if self.cur_role else ""
        return Prompt(self.text_, list(self.messages_), self.cur_role, role_text)

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._execute(e)
        elif isinstance(expr, Text):
            self._append(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            if self.cur_role is not None:
                raise ValueError(f"role {expr.role!r} begins inside role {self.cur_role!r}")
            prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
            self._append(prefix)
            self.cur_role, self.cur_role_begin = expr.role, len(self.text_)
        elif isinstance(expr, RoleEnd):
            if self.cur_role != expr.role:
                raise ValueError(f"role {expr.role!r} ends, but the open role is {self.cur_role!r}")
            _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
            content = self.text_[self.cur_role_begin :]
            self._append(suffix)
            self.messages_.append({"role": expr.role, "content": content})
            self.cur_role = None
        elif isinstance(expr, VarScopeBegin):
            self.scopes[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            if expr.name not in self.scopes:
                raise ValueError(f"var_scope {expr.name!r} ends without having begun")
            self.variables[expr.name] = self.text_[self.scopes.pop(expr.name) :]
        elif isinstance(expr, ConcatAndAppend):
            for state in expr.states:
                ex = state.stream_executor
                if ex.error_ is not None:
                    raise ex.error_
                self._append(ex.text_[ex.fork_start :])
        elif isinstance(expr, _Gather):
            for ex in expr.executors:
                if ex.error_ is not None:
                    raise ex.error_
            for name in expr.names:
                self.variables[name] = [ex.variables.get(name) for ex in expr.executors]
        else:
            raise TypeError(f"cannot run {type(expr).__name__}")

    def _gen(self, expr: Gen) -> None:
        args = expr.args.merged_over(self.defaults)
        if self.stream and args.n in (None, 1):
            meta: dict[str, Any] | None = None
            start = len(self.text_)
            for delta, item_meta in self.backend.generate_stream(self._prompt(), args):
                self._append(delta, expr.name)
                meta = item_meta or meta
            value: Any = self.text_[start:]
        else:
            value, meta = self.backend.generate(self._prompt(), args)
            self._append(value[0] if isinstance(value, list) else value, expr.name)
        if expr.name is not None:
            self.variables[expr.name] = value
            self.meta_info[expr.name] = meta

    def _select(self, expr: Select) -> None:
        decision: ChoicesDecision = self.backend.select(
            self._prompt(), expr.choices, expr.temperature, expr.method
        )
        self._append(decision.decision, expr.name)
        if expr.name is not None:
            self.variables[expr.name] = decision.decision
            self.meta_info[expr.name] = decision.meta_info


def _what(expr: Expr) -> str:
    if isinstance(expr, ExprList):
        inner = [e for e in expr.exprs if isinstance(e, Gen | Select)]
        return _what(inner[0]) if inner else "appending text"
    if isinstance(expr, Gen):
        return f"gen({expr.name!r})"
    if isinstance(expr, Select):
        return f"select({expr.name!r})"
    return type(expr).__name__


class ProgramState:
    """What a program's `s` is: append with `+=`, read with `s["x"]`, `s.text()`, ..."""

    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor

    def __iadd__(self, other: object) -> ProgramState:
        self.stream_executor.submit(to_expr(other), caller_site())
        return self

    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        self.stream_executor.get_var(name)
        return self.stream_executor.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, Any]]:
        self.sync()
        return list(self.stream_executor.messages_)

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> ProgramError | None:
        return self.stream_executor.error_

    def fork(self, size: int = 1) -> ProgramStateGroup:
        site = caller_site()
        children = self.stream_executor.fork(size, site)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    # roles: s += s.user("hi") is not needed; `with s.user(): ...` or s.user("hi")
    def _role(self, role: str, expr: object | None):
        if expr is not None:
            self += ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self += RoleBegin(role)
        yield
        self += RoleEnd(role)

    def system(self, expr: object | None = None):
        return self._role("system", expr)

    def user(self, expr: object | None = None):
        return self._role("user", expr)

    def assistant(self, expr: object | None = None):
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced (stream=True): all of it, or only what `var_name` gets."""
        if not self.stream_executor.stream:
            yield self.text() if var_name is None else str(self[var_name])
            return
        yield from self.stream_executor.iter_chunks(var_name)
        if self.error() is not None:
            raise self.error()

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio; with return_meta_data, the last item is (text, meta)."""
        it = self.text_iter(var_name)
        done = object()
        while (chunk := await asyncio.to_thread(next, it, done)) is not done:
            yield chunk
        if return_meta_data and var_name is not None:
            yield "", self.get_meta_info(var_name)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.text_async_iter()

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states `s.fork(n)` made; `+=` appends to each, `join()` merges them back."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState) -> None:
        self.states = states
        self.src_state = src_state

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: object) -> ProgramStateGroup:
        site = caller_site()
        for i, state in enumerate(self.states):
            expr = other(i) if callable(other) else other
            state.stream_executor.submit(to_expr(expr), site)
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable the forks made becomes a list in the parent;
        concate_and_append: the parent gets the text each fork added, in order."""
        site = caller_site()
        executors = [s.stream_executor for s in self.states]
        for ex in executors:
            ex.sync()
        parent = self.src_state.stream_executor
        if mode == "gather_variable":
            names = sorted(
                {n for ex in executors for n in ex.variables if n not in parent.variables}
            )
            parent.submit(_Gather(executors, names), site)
        elif mode == "concate_and_append":
            parent.submit(ConcatAndAppend(self.states), site)
        else:
            raise ValueError(
                f"join mode must be gather_variable or concate_and_append, got {mode!r}"
            )
        for ex in executors:
            ex.end()
