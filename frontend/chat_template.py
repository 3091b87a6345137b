"""Role markers for `system`/`user`/`assistant`, read off the tokenizer's own chat template.

The template is rendered with sentinel contents; the text around each sentinel is that role's
prefix and suffix. So text built from the markers is exactly what `apply_chat_template` makes of
`state.messages()`, including a default system prompt the template inserts on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
_SENTINEL = {"system": "\x00SYS\x00", "user": "\x00USR\x00", "assistant": "\x00AST\x00"}


@dataclass
class ChatTemplate:
    """Per-role (prefix, suffix), plus what a conversation's first message gets instead."""

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    # prefix of a role when it opens the conversation (adds e.g. BOS or a default system prompt)
    first_prefix: dict[str, str] = field(default_factory=dict)

    def get_prefix_and_suffix(self, role: str, history: list[dict[str, Any]]) -> tuple[str, str]:
        if role not in self.role_prefix_and_suffix:
            raise ValueError(
                f"chat template {self.name!r} has no role {role!r} "
                f"(it has {', '.join(self.role_prefix_and_suffix)})"
            )
        prefix, suffix = self.role_prefix_and_suffix[role]
        if not history:
            prefix = self.first_prefix.get(role, prefix)
        return prefix, suffix


PLAIN_TEMPLATE = ChatTemplate(
    "plain",
    {
        "system": ("System: ", "\n\n"),
        "user": ("User: ", "\n\n"),
        "assistant": ("Assistant: ", "\n\n"),
    },
)


def chat_template_from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """The tokenizer's template as role markers; PLAIN_TEMPLATE (with a warning) if it has none."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        logger.warning("the model has no chat template; roles use the plain 'User: ' template")
        return PLAIN_TEMPLATE

    def render(messages: list[dict[str, str]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False) if messages else ""

    def msg(role: str) -> dict[str, str]:
        return {"role": role, "content": _SENTINEL[role]}

    def block(history: list[str], role: str) -> tuple[str, str]:
        """(prefix, suffix) of a `role` message that follows messages of roles `history`."""
        before = render([msg(r) for r in history])
        after = render([msg(r) for r in [*history, role]])
        if not after.startswith(before):
            raise ValueError(f"cannot read the {role!r} markers from the chat template")
        prefix, _, suffix = after[len(before) :].partition(_SENTINEL[role])
        return prefix, suffix

    markers = {
        "user": block(["user", "assistant"], "user"),
        "assistant": block(["user"], "assistant"),
    }
    first = {"user": block([], "user")[0]}
    try:
        first["assistant"] = block([], "assistant")[0]
    except Exception:  # templates that insist on a user message first
        first["assistant"] = markers["assistant"][0]
    for history in (["user"], []):  # many templates only take a system message first
        try:
            markers["system"] = block(history, "system")
            first["system"] = block([], "system")[0]
            break
        except Exception:  # e.g. Gemma's template raises on any system message
            continue
    return ChatTemplate(getattr(tokenizer, "name_or_path", "") or "tokenizer", markers, first)
