"""The program's `s`: `ProgramState` and the group of states `s.fork(n)` makes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from radixflow.frontend.interpreter import Gather, StreamExecutor, merge_stream_meta
from radixflow.frontend.ir import (
    ConcatAndAppend,
    ExprList,
    RoleBegin,
    RoleEnd,
    VarScopeBegin,
    VarScopeEnd,
    to_expr,
)
from radixflow.frontend.program_error import ProgramError, caller_site


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

    def fork(
        self, size: int = 1, position_ids_offset: list[int] | None = None
    ) -> ProgramStateGroup:
        site = caller_site()
        children = self.stream_executor.fork(size, site, position_ids_offset)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextmanager
    def copy(self, position_ids_offset: list[int] | None = None) -> Iterator[ProgramState]:
        """`with s.copy() as c:` a one-branch fork, joined (gather_variable) at the end."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

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
        for text, _ in self._chunks_with_meta(var_name, False):
            yield text

    def _chunks_with_meta(
        self, var_name: str | None, with_meta: bool
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """Non-empty text chunks, each with its meta info (SGLang's shape: the per-token
        lists of a chunk that had meta info but no text go to the next chunk)."""
        if not self.stream_executor.stream:
            value = self.text() if var_name is None else self[var_name]
            yield value, (self.get_meta_info(var_name) if with_meta and var_name else None)
            return
        pending: dict[str, Any] | None = None
        for text, meta in self.stream_executor.iter_chunks(var_name):
            if meta is not None:
                pending = merge_stream_meta(pending, meta)
            if text:
                yield text, pending
                pending = None
        if self.error() is not None:
            raise self.error()

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio; with return_meta_data (and a variable), each item is
        (text chunk, meta info of that chunk), as SGLang's."""
        with_meta = return_meta_data and var_name is not None
        it = self._chunks_with_meta(var_name, with_meta)
        done = object()
        while (item := await asyncio.to_thread(next, it, done)) is not done:
            yield item if with_meta else item[0]

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

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """What `forks[i] += expr` does after appending: it stores the same state back."""
        if value is not self.states[i]:
            raise ValueError("a fork group's states cannot be replaced; append to them with +=")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: object) -> ProgramStateGroup:
        """`+= expr` appends to every branch, `+= lambda i: ...` each its own, and
        `+= [a, b, ...]` (one per branch) branch i gets item i."""
        site = caller_site()
        if isinstance(other, list | tuple) and len(other) != len(self.states):
            raise ValueError(f"+= takes one item per branch ({len(self.states)}), got {len(other)}")
        for i, state in enumerate(self.states):
            if callable(other):
                expr = other(i)
            elif isinstance(other, list | tuple):
                expr = other[i]
            else:
                expr = other
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
            parent.submit(Gather(executors, names), site)
        elif mode == "concate_and_append":
            parent.submit(ConcatAndAppend(self.states), site)
        else:
            raise ValueError(
                f"join mode must be gather_variable or concate_and_append, got {mode!r}"
            )
        for ex in executors:
            ex.end()
