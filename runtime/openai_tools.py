"""OpenAI tool calling by constrained decoding: the reply is JSON that matches the tools' schemas.

What the model writes, and the JSON Schema that forces it (compact JSON, no whitespace):

    tool_choice named f  ->  {"name":"f","arguments":{...f's parameters...}}
    tool_choice required ->  [{"name":...,"arguments":{...}}, ...]        (at least one call)
    tool_choice auto     ->  the list above, or {"content":"plain answer"}

The tools and this format are described to the model in a system message.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.openai_protocol import ChatMessage, NamedToolChoice, Tool
from radixflow.runtime.serving import APIError

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


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """One entry of an assistant message's `tool_calls`, arguments as JSON text."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.function.parameters or _ANY_OBJECT,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def history_message(message: ChatMessage) -> dict[str, Any]:
    """A request message as the chat template takes it; earlier tool calls become the JSON the
    model would have written, so the conversation shows it the format it is asked for."""
    role = "system" if message.role == "developer" else message.role
    content = message.text()
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
