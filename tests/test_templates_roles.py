"""The DSL's role markers follow any HF jinja chat template: the text before each `gen` is
exactly `tokenizer.apply_chat_template(messages, add_generation_prompt=True)`, and for
templates that only append, the whole conversation is exactly `apply_chat_template(messages)`.

Real tokenizers: ../shared/tokenizers/llama3 (Llama-3's template), qwen3 (Qwen3's, with
`enable_thinking`) and the default model's (SmolLM2's, from its GGUF). The other families are templates with each family's behaviour, set on a
small tokenizer: Llama-3.1's dated system header, Qwen2.5's and SmolLM's default system
prompt, Llama-2's system inside the first [INST], and Mistral's and Gemma's refusal of a
system role (merged into the first user turn, as their model cards say).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import tiny_config, tiny_tokenizer

import radixflow as rf
from radixflow.frontend.chat_template import JinjaChatTemplate, chat_template_from_tokenizer
from radixflow.runtime.chat_templates import BUILTIN_TEMPLATES, merge_system
from radixflow.runtime.gguf_convert import convert_gguf
from radixflow.runtime.model_loader import default_model_path

SHARED = Path(__file__).resolve().parents[1].parent / "shared/tokenizers"

LLAMA31_STYLE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content'] | trim %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set sys = '' %}{%- set rest = messages %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + (date_string if date_string is defined else '26 Jul 2024') }}"
    "{{- '\\n\\n' + sys + '<|eot_id|>' }}"
    "{%- for m in rest %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
DEFAULT_SYSTEM = (  # Qwen2.5 / SmolLM2: a default system prompt when the chat has none
    "{%- for m in messages %}{%- if loop.first and m['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def shared_tokenizer(name: str):
    """A real tokenizer from ../shared/tokenizers (the test skips where it is absent)."""
    if not (SHARED / name).is_dir():
        pytest.skip(f"no ../shared/tokenizers/{name} next to the repository")
    return transformers.AutoTokenizer.from_pretrained(SHARED / name)


def _tokenizer(name: str, template: str | None = None):
    if name == "smollm2":  # the default model's own tokenizer and template (from its GGUF)
        tok = transformers.AutoTokenizer.from_pretrained(convert_gguf(default_model_path()))
    else:
        tok = shared_tokenizer(name) if name in ("llama3", "qwen3") else tiny_tokenizer()
    if template is not None:
        tok.chat_template = BUILTIN_TEMPLATES.get(template, template)
    return tok


# family -> (tokenizer, template (None: the tokenizer's own), template kwargs, append-only)
FAMILIES = {
    "llama-3": ("llama3", None, {}, False),  # its template always ends with the assistant header
    "llama-3.1": ("llama3", LLAMA31_STYLE, {}, True),
    "llama-2": ("tiny", "llama-2", {}, True),
    "mistral": ("tiny", "mistral", {}, True),
    "gemma": ("tiny", "gemma", {}, True),
    "chatml": ("tiny", "chatml", {}, True),
    "qwen2.5": ("qwen3", DEFAULT_SYSTEM, {}, True),
    "smollm": ("tiny", DEFAULT_SYSTEM, {}, True),
    "smollm2": ("smollm2", None, {}, True),  # the real template
    "qwen3": ("qwen3", None, {}, False),  # drops earlier think blocks
    "qwen3-no-thinking": ("qwen3", None, {"enable_thinking": False}, False),
}

CONVERSATIONS = [
    [("user", "What is 2+2?")],
    [("system", "You answer briefly."), ("user", "What is 2+2?")],
    [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Name a color.")],
    [
        ("system", "You are terse."),
        ("user", "Hi"),
        ("assistant", "Hello."),
        ("user", "Bye"),
    ],
]


def _messages(conv, family=""):
    # Llama-2 writes "[/INST] " + the stripped reply: its model's replies begin with a space
    lead = " " if family == "llama-2" else ""
    return [{"role": r, "content": lead + c if r == "assistant" else c} for r, c in conv]


def _reference(tok, messages, kwargs, generation_prompt):
    """transformers' own rendering; a system turn merged into the first user turn for
    templates that refuse one (what their model cards say to do)."""
    try:
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
    except Exception:
        return tok.apply_chat_template(
            merge_system(messages),
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **kwargs,
        )


def _dsl_text(template, messages):
    """The text the interpreter builds: prefix + content + suffix per message."""
    text, history = "", []
    for m in messages:
        prefix, suffix = template.get_prefix_and_suffix(m["role"], history)
        text += prefix + m["content"] + suffix
        history.append(m)
    return text


@pytest.fixture(scope="module")
def templates():
    out = {}
    for family, (tok_name, template, kwargs, _) in FAMILIES.items():
        tok = _tokenizer(tok_name, template)
        out[family] = (tok, chat_template_from_tokenizer(tok, chat_template_kwargs=kwargs))
    return out


# Qwen3 rewrites earlier assistant turns: its chats with a reply are checked on their own
GEN_CASES = [
    (family, conv)
    for family in FAMILIES
    for conv in range(len(CONVERSATIONS))
    if not (family.startswith("qwen3") and any(r == "assistant" for r, _ in CONVERSATIONS[conv]))
]


@pytest.mark.parametrize(("family", "conv"), GEN_CASES)
def test_text_before_each_gen_is_the_generation_prompt(templates, family, conv):
    tok, template = templates[family]
    kwargs = FAMILIES[family][2]
    messages = _messages(CONVERSATIONS[conv], family)
    prefix = template.get_prefix_and_suffix("assistant", messages)[0]
    assert _dsl_text(template, messages) + prefix == _reference(tok, messages, kwargs, True)


@pytest.mark.parametrize("family", [f for f, spec in FAMILIES.items() if spec[3]])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_whole_conversation_is_the_template_rendering(templates, family, conv):
    tok, template = templates[family]
    messages = _messages(CONVERSATIONS[conv] + [("assistant", "Four.")], family)
    assert _dsl_text(template, messages) == _reference(tok, messages, FAMILIES[family][2], False)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_multi_turn_continues_what_the_model_saw(thinking):
    """Qwen3 drops old think blocks when it re-renders a chat; the DSL appends, so the next
    turn continues the text the model generated after, and the generation prompt is Qwen3's
    own (with the empty think block when thinking is off)."""
    tok = _tokenizer("qwen3")
    kwargs = {"enable_thinking": thinking}
    template = chat_template_from_tokenizer(tok, chat_template_kwargs=kwargs)
    first = [{"role": "user", "content": "Hi"}]
    start = _dsl_text(template, first) + template.get_prefix_and_suffix("assistant", first)[0]
    assert start == _reference(tok, first, kwargs, True)
    assert start.endswith("<think>\n\n</think>\n\n") != thinking
    reply = "<think>\nGreet.\n</think>\n\nHello." if thinking else "Hello."
    history = [*first, {"role": "assistant", "content": reply}]
    suffix = template.get_prefix_and_suffix("assistant", first)[1]
    user_prefix, user_suffix = template.get_prefix_and_suffix("user", history)
    assert (suffix, user_prefix, user_suffix) == (
        "<|im_end|>\n",
        "<|im_start|>user\n",
        "<|im_end|>\n",
    )


def test_a_template_that_cannot_be_followed_names_the_fix():
    tok = tiny_tokenizer()
    # renders the conversation newest first: no turn is ever a prefix of the next
    tok.chat_template = (
        "{% for m in messages | reverse %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ValueError, match="--chat-template") as err:
        chat_template_from_tokenizer(tok)
    assert "'user' markers after ['user', 'assistant']" in str(err.value)


def test_templates_with_no_system_role_still_take_a_system_message(templates):
    _, gemma = templates["gemma"]
    prefix, suffix = gemma.get_prefix_and_suffix("system", [])
    assert prefix.endswith("<start_of_turn>user\n") and suffix == ""
    system = [{"role": "system", "content": "Be terse."}]
    assert gemma.get_prefix_and_suffix("user", system)[0] == "\n\n"


# -- the DSL end to end, on a tiny random model ----------------------------------------------
def tiny_model_with_tokenizer(path: Path, tokenizer_name: str) -> Path:
    """A tiny random Llama model saved with one of the shared real tokenizers."""
    tok = shared_tokenizer(tokenizer_name)
    config = tiny_config(
        "llama",
        len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).float().save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_llama3_dir(tmp_path_factory):
    return tiny_model_with_tokenizer(tmp_path_factory.mktemp("llama3"), "llama3")


@rf.function
def _qa(s, question):
    s += rf.system("You answer briefly.")
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=3, temperature=0))


@pytest.mark.parametrize("template", [None, "gemma", "chatml", "llama-3"])
def test_runtime_programs_use_the_model_template_or_the_override(tiny_llama3_dir, template):
    runtime = rf.Runtime(
        str(tiny_llama3_dir), chat_template=template, dtype="float32", max_total_tokens=512
    )
    try:
        state = _qa.run(question="What is 2+2?", backend=runtime)
        tok = copy.deepcopy(runtime.tokenizer)
        assert isinstance(runtime.chat_template, JinjaChatTemplate)
        messages = state.messages()
        expected = _reference(tok, messages[:2], {}, True)
        answer = state["answer"]
        assert state.text().startswith(expected + answer)
        if template is not None:  # the engine's tokenizer (the chat route's) has it too
            assert runtime.tokenizer.chat_template == BUILTIN_TEMPLATES[template]
    finally:
        runtime.shutdown()
