"""Role markers for `system`/`user`/`assistant`, read off the tokenizer's own chat template.

The template is rendered with sentinel contents and the renderings are diffed, per position in
the conversation (the roles that came before), so the markers follow what templates inject:
a default system prompt or a dated system header before the first user turn (Qwen2.5,
Llama-3.1), BOS on the first message only, `<think>` blocks in the generation prompt (Qwen3
with `enable_thinking`), or a system message merged into the first user turn for templates
that refuse a system role (Gemma, Mistral). The assistant's prefix is the template's own
generation prompt, so the text before each `gen` is exactly what
`apply_chat_template(messages, add_generation_prompt=True)` gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixflow.runtime.chat_templates import (
    apply_template_override,
    check_template_kwargs,
    render_chat,
)

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
_FIX = "pass a template that accepts it: --chat-template NAME|FILE or Runtime(chat_template=...)"
# the role most programs put next, to tell a message's suffix from the next one's prefix
_NEXT = {"system": "user", "user": "assistant", "assistant": "user"}


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

Render = Callable[[list[dict[str, Any]], bool], str]


def _sentinel(i: int) -> str:
    return f"\x00M{i}\x00"


@dataclass
class JinjaChatTemplate(ChatTemplate):
    """Markers computed from a jinja template for each sequence of roles (cached)."""

    render: Render | None = None
    _markers: dict[tuple[tuple[str, ...], str], tuple[str, str]] = field(
        default_factory=dict, repr=False
    )
    _last_error: str = field(default="", repr=False)

    def get_prefix_and_suffix(self, role: str, history: list[dict[str, Any]]) -> tuple[str, str]:
        if role not in ROLES:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}")
        if any("role" not in m for m in history):  # a tracer's placeholder history
            return super().get_prefix_and_suffix(role, history)
        return self.markers(tuple(m["role"] for m in history), role)

    def markers(self, roles: tuple[str, ...], role: str) -> tuple[str, str]:
        key = (roles, role)
        if key not in self._markers:
            self._markers[key] = self._probe(roles, role)
        return self._markers[key]

    def _probe(self, roles: tuple[str, ...], role: str) -> tuple[str, str]:
        history = [{"role": r, "content": _sentinel(i)} for i, r in enumerate(roles)]
        this = {"role": role, "content": _sentinel(len(roles))}
        follow = {"role": _NEXT[role], "content": _sentinel(len(roles) + 1)}
        self._last_error = ""
        alone = self._try(history + [this])
        followed = self._try(history + [this, follow])
        with_prompt = self._try(history, generation_prompt=True) if role == "assistant" else None
        if with_prompt is not None:
            start = with_prompt
        else:
            start = alone if alone is not None and this["content"] in alone else followed
        prefix = None if start is None else self._new_text(start, roles)
        if with_prompt is None and prefix is not None:
            prefix, found, _ = prefix.partition(this["content"])
            prefix = prefix if found else None
        if prefix is None:
            raise ValueError(
                f"chat template {self.name!r}: cannot read the {role!r} markers after "
                f"{list(roles) or 'nothing'} (the template refuses that order of roles or "
                f"changes the turns before it{'; ' + self._last_error if self._last_error else ''}"
                f"); {_FIX}"
            )
        tails = [
            text.partition(this["content"])[2].partition(follow["content"])[0]
            for text in (alone, followed)
            if text is not None and this["content"] in text
        ]
        return prefix, _common_prefix(tails)

    def _new_text(self, rendered: str, roles: tuple[str, ...]) -> str | None:
        """What `rendered` adds after the last of the earlier messages and its suffix. Only
        the tail counts: templates may rewrite earlier turns (Qwen3 drops old think blocks)."""
        if not roles:
            return rendered
        positions = [rendered.find(_sentinel(i)) for i in range(len(roles))]
        if min(positions) < 0 or positions != sorted(positions):
            return None  # a turn dropped or moved
        tail = rendered.partition(_sentinel(len(roles) - 1))[2]
        suffix = self.markers(roles[:-1], roles[-1])[1]
        return tail[len(suffix) :] if tail.startswith(suffix) else None

    def _try(self, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str | None:
        if not messages and not generation_prompt:
            return ""
        assert self.render is not None
        try:
            return self.render(messages, generation_prompt)
        except Exception as exc:  # a template's raise_exception: that order is not accepted
            self._last_error = f"{type(exc).__name__}: {exc}"
            return None


def _common_prefix(texts: list[str]) -> str:
    if not texts:
        return ""
    first = texts[0]
    for i, ch in enumerate(first):
        if any(len(t) <= i or t[i] != ch for t in texts[1:]):
            return first[:i]
    return first


def chat_template_from_tokenizer(
    tokenizer: Any,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ChatTemplate:
    """The tokenizer's template (or `chat_template`: a built-in name or a jinja file, which
    replaces the tokenizer's) as role markers, rendered with `chat_template_kwargs` (e.g.
    `{"enable_thinking": False}`); PLAIN_TEMPLATE (with a warning) if there is none. Raises
    ValueError naming the fix when the template's user/assistant turns cannot be read."""
    kwargs = check_template_kwargs(chat_template_kwargs)
    if tokenizer is not None and chat_template is not None:
        apply_template_override(tokenizer, chat_template)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        if kwargs:
            raise ValueError("chat_template_kwargs needs a chat template, and the model has none")
        logger.warning("the model has no chat template; roles use the plain 'User: ' template")
        return PLAIN_TEMPLATE

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return render_chat(
            tokenizer, messages, add_generation_prompt=generation_prompt, template_kwargs=kwargs
        )

    name = getattr(tokenizer, "name_or_path", "") or "tokenizer"
    template = JinjaChatTemplate(name, {}, render=render)
    # the common turns, read now so a template we cannot follow fails at load time
    user, assistant = template.markers((), "user"), template.markers(("user",), "assistant")
    template.role_prefix_and_suffix = {
        "user": template.markers(("user", "assistant"), "user"),
        "assistant": assistant,
    }
    template.first_prefix = {"user": user[0]}
    try:
        template.role_prefix_and_suffix["system"] = template.markers((), "system")
    except ValueError as exc:
        logger.warning("%s", exc)
    return template


__all__ = [
    "PLAIN_TEMPLATE",
    "ROLES",
    "ChatTemplate",
    "JinjaChatTemplate",
    "chat_template_from_tokenizer",
]
