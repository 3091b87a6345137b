"""Chat templates: a named built-in or a jinja file overriding the model's, and rendering.

`resolve_chat_template(value)` turns `--chat-template` / `chat_template=` into jinja text: a path
to a file (`.jinja` or a `tokenizer_config.json`-style JSON with a `chat_template` key) or one of
`BUILTIN_TEMPLATES` by name. `render_chat` is the one place a conversation becomes prompt text:
it passes `tools` and `chat_template_kwargs` to the template, and for templates that refuse a
system message (Gemma, Mistral v0.1) it merges the system text into the first user turn, as
those models' cards say to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

# Written for radixflow from each family's documented prompt format. `bos_token` and
# `eos_token` are the tokenizer's own.
_SPECIALS = (
    "{% set bos = bos_token if bos_token is defined and bos_token else '' %}"
    "{% set eos = eos_token if eos_token is defined and eos_token else '' %}"
)
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "llama-3": _SPECIALS
    + (
        "{{ bos }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
        "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    "llama-2": _SPECIALS
    + (
        "{% set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' "
        "else none %}{% for m in (messages[1:] if sys is not none else messages) %}"
        "{% if m['role'] == 'user' %}{{ bos + '[INST] ' }}"
        "{% if loop.first and sys is not none %}"
        "{{ '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' }}{% endif %}"
        "{{ m['content'] | trim + ' [/INST]' }}"
        "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim + ' ' + eos }}"
        "{% else %}{{ raise_exception('llama-2 takes system first, then user/assistant') }}"
        "{% endif %}{% endfor %}"
    ),
    "mistral": _SPECIALS
    + (
        "{{ bos }}{% for m in messages %}"
        "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos }}"
        "{% else %}{{ raise_exception('mistral takes user and assistant roles only') }}"
        "{% endif %}{% endfor %}"
    ),
    "gemma": _SPECIALS
    + (
        "{{ bos }}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{{ raise_exception('gemma has no system role') }}"
        "{% endif %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role'])"
        " + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
}
BUILTIN_TEMPLATES["qwen"] = BUILTIN_TEMPLATES["chatml"]

_RESERVED = {"tokenize", "tools", "messages", "conversation", "chat_template"}
SYSTEM_SEPARATOR = "\n\n"  # between merged system text and the first user message


def resolve_chat_template(value: str | None) -> str | None:
    """Jinja text for a built-in name or a file path; None stays None (the model's own)."""
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"chat_template {value!r} is neither a file nor a built-in template "
            f"(built-in: {', '.join(sorted(BUILTIN_TEMPLATES))})"
        )
    text = path.read_text()
    if path.suffix == ".json":
        try:
            text = json.loads(text)["chat_template"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"chat_template file {path} has no 'chat_template' key") from None
        if not isinstance(text, str):
            raise ValueError(f"chat_template file {path}: 'chat_template' must be a string")
    if not text.strip():
        raise ValueError(f"chat_template file {path} is empty")
    return text


def apply_template_override(tokenizer: Any, value: str | None) -> None:
    """Set the tokenizer's template from `value` (a name or a path); None leaves it."""
    template = resolve_chat_template(value)
    if template is not None:
        tokenizer.chat_template = template


def merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with a leading system message folded into the first user turn."""
    if not messages or messages[0].get("role") != "system":
        return messages
    system, rest = messages[0], messages[1:]
    if rest and rest[0].get("role") == "user":
        content = f"{system['content']}{SYSTEM_SEPARATOR}{rest[0]['content']}"
        return [{**rest[0], "content": content}, *rest[1:]]
    return [{"role": "user", "content": system["content"]}, *rest]


def check_template_kwargs(template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of `chat_template_kwargs`; ValueError unless it is a dict of string keys that
    `render_chat` does not set itself."""
    if template_kwargs is None:
        return {}
    is_dict = isinstance(template_kwargs, dict)
    if not is_dict or not all(isinstance(k, str) for k in template_kwargs):
        raise ValueError(
            f"chat_template_kwargs must be a dict with string keys, got {template_kwargs!r}"
        )
    for key in template_kwargs:
        if key in _RESERVED:
            raise ValueError(f"chat_template_kwargs may not set {key!r}")
    return dict(template_kwargs)


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for `messages` through the tokenizer's template; a template that refuses
    a leading system message gets it merged into the first user turn instead."""
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    kwargs.update(check_template_kwargs(template_kwargs))
    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except TemplateError:
        merged = merge_system(messages)
        if merged is messages:
            raise
        return tokenizer.apply_chat_template(merged, **kwargs)
