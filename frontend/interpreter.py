"""Running programs: each state has an executor thread that runs what the program appends.

program body (caller thread)          StreamExecutor thread (one per state, one per fork)
  s += expr  ──── queue ────────────►   text, gen, select, roles, scopes, in order
  s["x"]     ◄─── waits for "x" ─────   sets variables / meta_info, appends text
  s.fork(n)  ──── n new executors, each copying the state; they run concurrently

The body never blocks on a model call unless it reads a result, so independent states (and
forks) have their calls in flight together and the engine batches them. The body's side, `s`
itself, is `state.ProgramState`.

Longer than our usual module on purpose: `StreamExecutor` is one state machine whose cases
(text, gen, select, roles, scopes, API speculation, reasoning split, joins) all read and write
the same text, variables and lock, and it reads best whole.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from radixflow.frontend.backend import PER_TOKEN_META, Backend, Prompt, RequestError
from radixflow.frontend.chat_speculation import SPEC_TRIES, ChatSpeculation
from radixflow.frontend.choices import ChoicesDecision
from radixflow.frontend.ir import (
    ConcatAndAppend,
    Expr,
    ExprList,
    Gen,
    GenArgs,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    Video,
)
from radixflow.frontend.program_error import ProgramError
from radixflow.runtime.reasoning_parser import REASONING_PARSERS


def merge_stream_meta(earlier: dict[str, Any] | None, later: dict[str, Any]) -> dict[str, Any]:
    """`later`'s meta info with the per-token lists of `earlier` put in front of its own."""
    if earlier is None:
        return later
    merged = dict(later)
    for key in PER_TOKEN_META:
        if key in earlier or key in later:
            merged[key] = [*earlier.get(key, []), *later.get(key, [])]
    return merged


def _produced_names(expr: Expr) -> list[str]:
    """Variables an expression sets (what `s["x"]` must wait for)."""
    if isinstance(expr, ExprList):
        return [n for e in expr.exprs for n in _produced_names(e)]
    if isinstance(expr, Gen | Select) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, VarScopeEnd):
        return [expr.name]
    if isinstance(expr, SeparateReasoning):
        return [f"{n}_reasoning_content" for n in _produced_names(expr.expr)]
    if isinstance(expr, Gather):
        return list(expr.names)
    return []


class Gather(Expr):
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
        use_thread: bool = True,
        num_api_spec_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        # API speculative execution (SGLang's num_api_spec_tokens, completion backends): one
        # request generates this many tokens, and the gens and texts after it consume them
        self.num_api_spec_tokens = num_api_spec_tokens
        self.speculated_text = ""
        # the same on chat models: the open assistant message, written when the role ends
        self.chat_spec: ChatSpeculation | None = None
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
        # (variable, text, per-chunk meta info) in the order the stream produced them
        self._chunks: list[tuple[str | None, str, dict[str, Any] | None]] = []
        self._ended = False
        self._done = False
        self.use_thread = use_thread
        self._queue: queue.SimpleQueue[tuple[Expr, str | None] | None] = queue.SimpleQueue()
        if use_thread:
            self._thread = threading.Thread(
                target=self._worker, name="radixflow-state", daemon=True
            )
            self._thread.start()

    # -- called from the program body ------------------------------------------------------
    def submit(self, expr: Expr, site: str | None) -> None:
        with self._cond:
            if self._ended:
                raise ProgramError("this state has ended; it takes no more expressions", site)
            self._pending += 1
            self._producing.update(_produced_names(expr))
        if self.use_thread:
            self._queue.put((expr, site))
        else:  # run_program(use_thread=False): the caller's thread runs it now
            self._run_item(expr, site)

    def end(self) -> None:
        """No more expressions: the thread finishes what is queued and exits."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
            if not self.use_thread:
                self._done = True
                self._cond.notify_all()
        if self.use_thread:
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

    def fork(
        self, n: int, site: str | None, position_ids_offset: list[int] | None = None
    ) -> list[StreamExecutor]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork takes a positive number of branches, got {n!r}")
        # SGLang takes position_ids_offset (one int per branch) and leaves positions as they are;
        # so do we, after checking its shape
        if position_ids_offset is not None and (
            len(position_ids_offset) != n
            or not all(isinstance(o, int) for o in position_ids_offset)
        ):
            raise ValueError(
                f"fork position_ids_offset must hold one int per branch ({n}), "
                f"got {position_ids_offset!r}"
            )
        self.sync()
        if self.error_ is not None:
            raise self.error_
        if self.chat_spec is not None:
            raise ValueError(
                "fork inside an assistant role that num_api_spec_tokens writes in one request "
                "(a chat model): end the role first"
            )
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
            StreamExecutor(self.backend, self.defaults, self.stream, self, self.use_thread)
            for _ in range(n)
        ]
        self.children.extend(children)
        return children

    def iter_chunks(self, var_name: str | None) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """(text, meta info of that chunk) as text is appended (only what `var_name` produces,
        if given) until the end; a chunk may carry meta info and no text."""
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda n=seen: len(self._chunks) > n or self._done)
                chunks, done = self._chunks[seen:], self._done
            seen += len(chunks)
            for name, text, meta in chunks:
                if var_name is None or name == var_name:
                    yield text, meta
            if done and not chunks:
                return

    # -- the executor thread ---------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            self._run_item(*item)
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _run_item(self, expr: Expr, site: str | None) -> None:
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

    def _append(self, text: str, var: str | None = None, meta: dict | None = None) -> None:
        if not text and meta is None:
            return
        with self._cond:
            self.text_ += text
            if self.stream:
                self._chunks.append((var, text, meta))
                self._cond.notify_all()

    def _prompt(self) -> Prompt:
        role_text = self.text_[self.cur_role_begin :] if self.cur_role else ""
        return Prompt(self.text_, list(self.messages_), self.cur_role, role_text)

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._execute(e)
        elif isinstance(expr, Text):
            self._fill(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            if self.cur_role is not None:
                raise ValueError(f"role {expr.role!r} begins inside role {self.cur_role!r}")
            prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
            self._fill(prefix)
            self.cur_role, self.cur_role_begin = expr.role, len(self.text_)
            if expr.role == "assistant" and self._speculates_chat():
                self.chat_spec = ChatSpeculation(self.num_api_spec_tokens or 0)
        elif isinstance(expr, RoleEnd):
            if self.cur_role != expr.role:
                raise ValueError(f"role {expr.role!r} ends, but the open role is {self.cur_role!r}")
            self._write_speculated_message()
            _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
            content = self.text_[self.cur_role_begin :].lstrip()  # as SGLang's messages()
            self._fill(suffix)
            self.messages_.append({"role": expr.role, "content": content})
            self.cur_role = None
        elif isinstance(expr, VarScopeBegin):
            self.scopes[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            if expr.name not in self.scopes:
                raise ValueError(f"var_scope {expr.name!r} ends without having begun")
            self.variables[expr.name] = self.text_[self.scopes.pop(expr.name) :]
        elif isinstance(expr, Image | Video):
            kind = "an image" if isinstance(expr, Image) else "a video"
            raise RequestError(
                f"{kind} ({expr.path!r}) cannot be sent: radixflow serves text-only models"
            )
        elif isinstance(expr, SeparateReasoning):
            self._write_speculated_message()  # the gens it splits need their text
            self._separate_reasoning(expr.model_type, expr.expr)
        elif isinstance(expr, ConcatAndAppend):
            for state in expr.states:
                ex = state.stream_executor
                if ex.error_ is not None:
                    raise ex.error_
                self._append(ex.text_[ex.fork_start :])
        elif isinstance(expr, Gather):
            for ex in expr.executors:
                if ex.error_ is not None:
                    raise ex.error_
            for name in expr.names:
                self.variables[name] = [ex.variables.get(name) for ex in expr.executors]
        else:
            raise TypeError(f"cannot run {type(expr).__name__}")

    def _fill(self, text: str) -> None:
        """Append constant text; speculated text that matches it is used up, else dropped."""
        if self.chat_spec is not None:
            self.chat_spec.add_text(text)
            return
        if self.speculated_text.startswith(text):
            self.speculated_text = self.speculated_text[len(text) :]
        else:
            self.speculated_text = ""
        self._append(text)

    def _speculates(self) -> bool:
        chat_only = getattr(self.backend, "is_chat_model", False)
        return self.num_api_spec_tokens is not None and not self.stream and not chat_only

    def _speculates_chat(self) -> bool:
        chat_only = getattr(self.backend, "is_chat_model", False)
        return self.num_api_spec_tokens is not None and not self.stream and chat_only

    def _write_speculated_message(self) -> None:
        """Write the recorded assistant message with one request (retried while the answer
        does not follow the message's texts and gens), then append it term by term."""
        spec, self.chat_spec = self.chat_spec, None
        if spec is None:
            return
        meta: dict[str, Any] = {}
        parts: list[tuple[str | None, str]] | None = [(None, t.text) for t in spec.terms]
        if spec.has_gens:
            for _ in range(SPEC_TRIES):  # the prompt ends at the role's prefix: nothing appended
                answer, meta = self.backend.generate(self._prompt(), spec.request_args())
                parts = spec.match(answer if isinstance(answer, str) else answer[0])
                if parts is not None:
                    break
            else:
                raise RequestError(
                    f"num_api_spec_tokens: in {SPEC_TRIES} tries the chat model never wrote "
                    f"the assistant message as the program lays it out ({spec.layout!r}); "
                    f"last answer: {answer!r}"
                )
        for name, text in parts:
            self._append(text, name)
            if name is not None:
                self.variables[name] = text
                self.meta_info[name] = meta

    def _spec_gen(self, args: GenArgs) -> tuple[str, dict[str, Any]]:
        """SGLang's completion-model speculation: the gen's text is the speculated text up to
        its first stop string (or max_new_tokens characters); an empty store asks the
        backend for max(max_new_tokens, num_api_spec_tokens) tokens without stop strings."""
        if args.n not in (None, 1):
            raise ValueError("gen with n > 1 cannot run under num_api_spec_tokens")
        meta: dict[str, Any] = {}
        if not self.speculated_text:
            ask = max(args.max_new_tokens or 0, self.num_api_spec_tokens or 0)
            spec = dataclasses.replace(args, max_new_tokens=ask, stop=None)
            text, meta = self.backend.generate(self._prompt(), spec)
            self.speculated_text = text if isinstance(text, str) else text[0]
        stops = [args.stop] if isinstance(args.stop, str) else list(args.stop or [])
        found = [i for i in (self.speculated_text.find(st) for st in stops) if i >= 0]
        end = min(found) if found else min(args.max_new_tokens or 0, len(self.speculated_text))
        value, self.speculated_text = self.speculated_text[:end], self.speculated_text[end:]
        return value, meta

    def _gen(self, expr: Gen) -> None:
        args = expr.args.merged_over(self.defaults)
        if self.chat_spec is not None:
            self.chat_spec.add_gen(expr.name, args)
            return
        if self._speculates():
            value, meta = self._spec_gen(args)
            self._append(value, expr.name)
            if expr.name is not None:
                self.variables[expr.name] = value
                self.meta_info[expr.name] = meta
            return
        if self.stream and args.n in (None, 1):
            meta: dict[str, Any] | None = None
            start = len(self.text_)
            for delta, item_meta in self.backend.generate_stream(self._prompt(), args):
                self._append(delta, expr.name, item_meta)
                if item_meta is not None:
                    meta = merge_stream_meta(meta, item_meta)
            value: Any = self.text_[start:]
        else:
            value, meta = self.backend.generate(self._prompt(), args)
            self._append(value[0] if isinstance(value, list) else value, expr.name)
        if expr.name is not None:
            self.variables[expr.name] = value
            self.meta_info[expr.name] = meta

    def _separate_reasoning(self, model_type: str, expr: Expr) -> None:
        """SGLang's separate_reasoning: each gen's `<think>` part moves to
        `<name>_reasoning_content`; the variable and the role's text keep the answer."""
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._separate_reasoning(model_type, e)
            return
        if not isinstance(expr, Gen | Select) or expr.name is None:
            return
        value = self.variables[expr.name]
        if not isinstance(value, str):
            raise ValueError(f"separate_reasoning needs one text in {expr.name!r} (n=1)")
        reasoning, content = REASONING_PARSERS[model_type].split(value)
        with self._cond:
            self.variables[expr.name] = content
            self.variables[f"{expr.name}_reasoning_content"] = reasoning or ""
            # as SGLang: the open role (or the whole text) now holds the answer only
            begin = self.cur_role_begin if self.cur_role else len(self.text_) - len(value)
            self.text_ = self.text_[:begin] + content

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
        inner = [e for e in expr.exprs if isinstance(e, Gen | Select | Image | Video)]
        return _what(inner[0]) if inner else "appending text"
    if isinstance(expr, Gen):
        return f"gen({expr.name!r})"
    if isinstance(expr, Select):
        return f"select({expr.name!r})"
    if isinstance(expr, Image | Video):
        return f"{type(expr).__name__.lower()}({expr.path!r})"
    return type(expr).__name__
