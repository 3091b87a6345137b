"""Tracing: run a program body on placeholders to get its graph, without any model call.

Arguments not given become `Placeholder`s, and so do the values of `s["x"]`. A placeholder
can be appended to the state (it becomes a node), but using it in Python (printing it,
branching on it, formatting it) ends the trace there: what follows depends on real values.
The constant text before the first placeholder or gen is the program's shared prefix, which
`run_batch` computes once for the whole batch.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from radixflow.frontend.chat_template import PLAIN_TEMPLATE, ChatTemplate
from radixflow.frontend.ir import (
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    to_expr,
)


class StopTracing(Exception):
    """The body used a placeholder's value; the trace ends here."""


class Placeholder(Expr):
    """An argument or variable whose value is unknown while tracing."""

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind  # "arg" or "var"

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing(f"the program uses the value of {self.kind} {self.name!r}")

    __str__ = __format__ = __bool__ = __len__ = __iter__ = __contains__ = _stop
    __int__ = __float__ = __index__ = __lt__ = __gt__ = __le__ = __ge__ = _stop
    __getitem__ = __mul__ = __hash__ = _stop

    def __eq__(self, other: object) -> bool:
        self._stop()
        return False

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name}>"


@dataclass
class TraceNode:
    kind: str  # text, gen, select, role_begin, role_end, var_scope_begin, var_scope_end, arg, var, fork
    detail: str
    expr: Expr | None = None
    prev_node: TraceNode | None = field(default=None, repr=False)  # the node before, as SGLang's

    def __str__(self) -> str:
        return f"{self.kind:<15} {self.detail}"


@dataclass
class ProgramTrace:
    """A program's graph as far as tracing could follow it."""

    name: str
    nodes: list[TraceNode] = field(default_factory=list)
    stopped: str | None = None  # why tracing ended early, if it did
    prefix: str = ""  # the constant text every run of the program starts with

    @property
    def last_node(self) -> TraceNode | None:
        """The last node traced (follow `prev_node` back to the first), as SGLang's trace."""
        return self.nodes[-1] if self.nodes else None

    def __str__(self) -> str:
        lines = [f"program {self.name}:", *(f"  {n}" for n in self.nodes)]
        if self.stopped:
            lines.append(f"  (trace stops: {self.stopped})")
        return "\n".join(lines)


class TracerState:
    """Stands in for ProgramState while tracing; records what the body appends."""

    def __init__(self, trace: ProgramTrace, template: ChatTemplate) -> None:
        self._trace = trace
        self._template = template
        self._messages = 0
        self._constant = True

    def __iadd__(self, other: object) -> TracerState:
        expr = to_expr(other)
        for e in expr.exprs if isinstance(expr, ExprList) else [expr]:
            self._record(e)
        return self

    def _record(self, e: Expr) -> None:
        node = _node(e)
        node.prev_node = self._trace.last_node
        self._trace.nodes.append(node)
        if not self._constant:
            return
        if isinstance(e, Text):
            self._trace.prefix += e.value
        elif isinstance(e, RoleBegin):
            history = [{}] * self._messages
            self._trace.prefix += self._template.get_prefix_and_suffix(e.role, history)[0]
        elif isinstance(e, RoleEnd):
            self._trace.prefix += self._template.get_prefix_and_suffix(e.role, [{}])[1]
            self._messages += 1
        elif not isinstance(e, VarScopeBegin | VarScopeEnd):
            self._constant = False

    def __getitem__(self, name: str) -> Placeholder:
        return Placeholder(name, "var")

    def __setitem__(self, name: str, value: Any) -> None:
        pass  # a variable set by Python code is not part of the graph

    def fork(self, size: int = 1, position_ids_offset: list[int] | None = None) -> Any:
        self._trace.nodes.append(TraceNode("fork", str(size), prev_node=self._trace.last_node))
        raise StopTracing("fork: the branches are not traced")

    def _role(self, role: str, expr: object | None):
        if expr is not None:
            self += ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str):
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
    def var_scope(self, name: str):
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing("the program reads the state's text")

    text = messages = text_iter = get_meta_info = copy = _stop


def _node(e: Expr) -> TraceNode:
    if isinstance(e, Text):
        return TraceNode("text", repr(e.value), e)
    if isinstance(e, Gen):
        return TraceNode("gen", repr(e.name), e)
    if isinstance(e, Select):
        return TraceNode("select", f"{e.name!r} from {e.choices}", e)
    if isinstance(e, RoleBegin | RoleEnd):
        return TraceNode("role_begin" if isinstance(e, RoleBegin) else "role_end", e.role, e)
    if isinstance(e, VarScopeBegin | VarScopeEnd):
        kind = "var_scope_begin" if isinstance(e, VarScopeBegin) else "var_scope_end"
        return TraceNode(kind, e.name, e)
    if isinstance(e, Placeholder):
        return TraceNode(e.kind, e.name, e)
    return TraceNode(type(e).__name__, "", e)


def trace_program(program: Any, arguments: dict[str, Any], template: ChatTemplate | None):
    """Trace `program` (an SglFunction) with the given arguments; the rest are placeholders."""
    trace = ProgramTrace(program.func.__name__)
    state = TracerState(trace, template or PLAIN_TEMPLATE)
    params = inspect.signature(program.func).parameters
    args = {}
    for name in program.arg_names:
        default = params[name].default
        if name in arguments:
            args[name] = arguments[name]
        elif default is not inspect.Parameter.empty:
            args[name] = default
        else:
            args[name] = Placeholder(name, "arg")
    try:
        program.func(state, **args)
    except StopTracing as stop:
        trace.stopped = str(stop)
    except Exception as exc:  # the body failed on a placeholder in some other way
        trace.stopped = f"{type(exc).__name__}: {exc}"
    return trace
