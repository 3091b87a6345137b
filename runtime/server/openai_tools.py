"""OpenAI tool calling by constrained decoding: the reply is JSON that matches the tools' schemas.

What the model writes, and the JSON Schema that forces it (compact JSON, no whitespace):

    tool_choice named f  ->  {"name":"f","arguments":{...f's parameters...}}
    tool_choice required ->  [{"name":...,"arguments":{...}}, ...]        (at least one call)
    tool_choice auto     ->  the list above, or {"content":"plain answer"}

The tools and this format are described to the model in a system message. A tool with
`strict: true` has its parameters closed as OpenAI means it (`openai_convert.strict_schema`:
no argument object holds keys its schema does not declare).

With `--tool-call-parser`, `tool_choice` auto (or unset) takes the model's own route instead
(`ChatReply`): the tools go to the model's chat template (`tools=`), the model writes calls in
its trained format, and the parser reads them back; `--reasoning-parser` splits `<think>`
reasoning off first. "required" and a named function keep the constrained path above.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.reasoning_parser import ReasoningParser, ReasoningStream, reasoning_parser
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_convert import checked_strict
from radixflow.runtime.server.openai_protocol import ChatMessage, NamedToolChoice, Tool
from radixflow.runtime.tool_parsers import (
    ToolCallParser,
    ToolCallStream,
    tool_call,
    tool_call_parser,
)

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    """How one chat request calls tools: the JSON schema to decode with and how to read it."""

    tools: list[Tool]
    mode: str  # "named", "required" or "auto"
    parallel: bool
    named: str | None = None

    @classmethod
    def from_request(
        cls,
        tools: list[Tool] | None,
        choice: str | NamedToolChoice | None,
        parallel: bool,
    ) -> ToolPlan | None:
        """None when no tool may be called (no tools, or tool_choice "none")."""
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in tools or []]
            if choice.function.name not in names:
                raise APIError(
                    f"tool_choice names function {choice.function.name!r}, not among the tools",
                    param="tool_choice",
                )
            return cls(tools or [], "named", parallel, choice.function.name)
        if not tools:
            if choice in ("auto", "required"):
                raise APIError(f"tool_choice {choice!r} needs tools", param="tool_choice")
            return None
        if choice == "none":
            return None
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise APIError("tools must have distinct function names", param="tools")
        return cls(tools, choice or "auto", parallel)

    def schema(self) -> dict[str, Any]:
        if self.mode == "named":
            return _call_schema(self._tool(self.named))
        calls: dict[str, Any] = {
            "type": "array",
            "items": {"anyOf": [_call_schema(t) for t in self.tools]},
            "minItems": 1,
        }
        if not self.parallel:
            calls["maxItems"] = 1
        if self.mode == "required":
            return calls
        answer = {
            "type": "object",
            "properties": {"content": {"type": "string"}},
            "required": ["content"],
            "additionalProperties": False,
        }
        return {"anyOf": [calls, answer]}

    def instructions(self) -> str:
        specs = "\n".join(json.dumps(t.function.model_dump(exclude_none=True)) for t in self.tools)
        call = '{"name": <function name>, "arguments": <arguments object>}'
        if self.mode == "named":
            how = f'Call the function "{self.named}": reply with only the JSON object {call}.'
        elif self.mode == "required":
            how = f"Call one or more functions: reply with only a JSON list [{call}, ...]."
        else:
            how = (
                f"To call functions, reply with only a JSON list [{call}, ...]. "
                'To answer without calling a function, reply with only {"content": <answer>}.'
            )
        return f"You can call these functions:\n{specs}\n{how}"

    def parse(self, text: str) -> tuple[list[dict[str, Any]] | None, str | None]:
        """(tool_calls, content) read from the model's reply; (None, text) if it is not JSON."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            if self.mode == "auto" and text.startswith(_ANSWER_START):
                return None, _cut_answer(text)
            return None, text
        if isinstance(value, dict) and "content" in value and self.mode == "auto":
            return None, str(value["content"])
        calls = [value] if isinstance(value, dict) else value
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
        ):
            return None, text
        return [tool_call(c["name"], c.get("arguments", {})) for c in calls], None

    def _tool(self, name: str | None) -> Tool:
        return next(t for t in self.tools if t.function.name == name)


_ANSWER_START = '{"content":"'


def _cut_answer(text: str) -> str:
    """The answer of a `{"content":"...` reply cut short by max_tokens, unwrapped."""
    for trim in range(min(len(text) - len(_ANSWER_START), 6) + 1):
        try:
            return json.loads(text[: len(text) - trim] + '"}')["content"]
        except json.JSONDecodeError:
            continue
    return text


def _call_schema(tool: Tool) -> dict[str, Any]:
    arguments = tool.function.parameters or _ANY_OBJECT
    if tool.function.strict:
        arguments = checked_strict(arguments, "tools")
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def history_message(message: ChatMessage, native_tools: bool = False) -> dict[str, Any]:
    """A request message as the chat template takes it. Earlier tool calls become the JSON the
    model would have written, so the conversation shows it the format it is asked for; with
    `native_tools` (a tool-call parser reads the model's own format) they stay structured for
    the template to write in that format."""
    role = "system" if message.role == "developer" else message.role
    content = message.text()
    if message.tool_calls and native_tools:
        out_calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": _arguments(c.function.arguments),
                },
            }
            for c in message.tool_calls
        ]
        return {"role": role, "content": content, "tool_calls": out_calls}
    if message.tool_calls:
        calls = [
            {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
            for c in message.tool_calls
        ]
        content = (content + "\n" if content else "") + json.dumps(calls, ensure_ascii=False)
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise APIError(
            "tool_calls[].function.arguments must be JSON text", param="messages"
        ) from None


@dataclass
class ChatReply:
    """How the chat route reads a reply in the model's own formats: reasoning first, then
    tool calls. Built per request; inactive (None from `for_request`) when neither applies."""

    tool_parser: ToolCallParser | None
    tool_names: set[str]
    reasoning: ReasoningParser | None
    stream_reasoning: bool = True

    @classmethod
    def for_request(
        cls,
        config: Any,
        plan: ToolPlan | None,
        separate_reasoning: bool = True,
        stream_reasoning: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> ChatReply | None:
        parser = None
        if plan is not None and plan.mode == "auto" and config.tool_call_parser:
            parser = tool_call_parser(config.tool_call_parser)
        reasoning = reasoning_parser(config.reasoning_parser, separate_reasoning, template_kwargs)
        if parser is None and reasoning is None:
            return None
        names = {t.function.name for t in plan.tools} if parser is not None and plan else set()
        return cls(parser, names, reasoning, stream_reasoning)

    def sampling_overrides(self) -> dict[str, Any]:
        """Sampling params the formats need (special-token markers kept in the text)."""
        if self.tool_parser is not None and self.tool_parser.keeps_special_tokens:
            return {"skip_special_tokens": False}
        return {}

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The assistant message fields (content, reasoning_content, tool_calls) and the
        finish reason ("tool_calls" when the reply called tools)."""
        reasoning, content = self.reasoning.split(text) if self.reasoning else (None, text)
        out: dict[str, Any] = {"content": content}
        if reasoning is not None:
            out["reasoning_content"] = reasoning.rstrip()
        if self.tool_parser is not None:
            rest, calls = self.tool_parser.parse(content, self.tool_names)
            if calls:
                return {**out, "content": rest, "tool_calls": calls}, "tool_calls"
        return out, reason

    def stream(self) -> ChatReplyStream:
        return ChatReplyStream(self)


@dataclass
class ChatReplyStream:
    """One streamed choice: `feed(cumulative text, finish reason)` gives the delta to send."""

    reply: ChatReply
    reasoning: ReasoningStream | None = None
    tools: ToolCallStream | None = None
    held_reasoning: str = ""
    _sent_content: int = 0

    def __post_init__(self) -> None:
        if self.reply.reasoning is not None:
            self.reasoning = ReasoningStream(self.reply.reasoning)
        if self.reply.tool_parser is not None:
            self.tools = ToolCallStream(self.reply.tool_parser, self.reply.tool_names)

    def feed(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        final = reason is not None
        if self.reasoning is not None:
            r_delta, _ = self.reasoning.feed(text, final)
            content = self.reply.reasoning.split(text, final)[1]  # type: ignore[union-attr]
        else:
            r_delta, content = "", text
        delta: dict[str, Any] = {}
        if not self.reply.stream_reasoning:  # reasoning goes out whole, once it has ended
            self.held_reasoning += r_delta
            r_delta = ""
            if (content or final) and self.held_reasoning:
                r_delta, self.held_reasoning = self.held_reasoning, ""
        if r_delta:
            delta["reasoning_content"] = r_delta
        if self.tools is None:
            c_delta = content[self._sent_content :]
            self._sent_content = max(self._sent_content, len(content))
        else:
            c_delta = self.tools.feed(content)
            if final:
                rest, calls = self.tools.finish(content)
                c_delta += rest
                if calls:
                    delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                    reason = "tool_calls"
        if c_delta:
            delta["content"] = c_delta
        return delta, reason
