"""The chat route with a model's own formats: tools rendered by the model's template, its
`<tool_call>` output read into OpenAI tool_calls and its `<think>` reasoning into
reasoning_content, stream and non-stream, through the real `openai` client. A tiny random
Llama model with Qwen3's tokenizer and template; the replies are forced with a regex (an
SGLang request extension), so what the parsers read is known."""

from __future__ import annotations

import json

import openai
import pytest
import transformers
from server_harness import start_server
from test_templates_roles import tiny_model_with_tokenizer

import radixflow as rf
from radixflow.runtime.chat_templates import BUILTIN_TEMPLATES

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c"}}\n</tool_call>'
THINK_TEXT = "<think>\nI add two and two.\n</think>\n\nFour."


def _regex(text: str) -> str:
    return "".join("\\" + c if c in "{}[]().*+?|^$\\" else c for c in text)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_with_tokenizer(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="module")
def served(model_dir):
    path = model_dir
    engine = rf.Engine(
        str(path),
        dtype="float32",
        max_total_tokens=2048,
        tool_call_parser="qwen25",
        reasoning_parser="qwen3",
    )
    running = start_server(engine, served_model_name="m")
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)
    yield client, transformers.AutoTokenizer.from_pretrained(path)
    running.stop()
    engine.shutdown()


def test_tools_reach_the_model_template(served):
    client, tok = served
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], max_tokens=1, temperature=0
    )
    reference = tok.apply_chat_template(
        ASK, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert "<tools>" in reference  # Qwen3's template lists the tools in its system turn
    assert out.usage.prompt_tokens == len(tok.encode(reference, add_special_tokens=False))


def test_model_tool_call_becomes_tool_calls(served):
    client, _ = served
    out = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER],
        max_tokens=64,
        extra_body={"regex": _regex(CALL_TEXT)},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"unit": "c"}


def test_model_tool_call_streams_as_tool_calls(served):
    client, _ = served
    stream = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER],
        max_tokens=64,
        stream=True,
        extra_body={"regex": _regex(CALL_TEXT)},
    )
    content, calls, reasons = "", [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "" and reasons[-1] == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"unit": "c"})
    ]


def test_required_tool_choice_keeps_the_constrained_path(served):
    client, _ = served
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64
    )
    calls = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:  # what the schema allowed, whatever the random model chose
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["unit"] in ("c", "f")


def test_reasoning_goes_to_reasoning_content(served):
    client, _ = served
    kwargs = {"model": "m", "messages": ASK, "max_tokens": 64}
    out = client.chat.completions.create(**kwargs, extra_body={"regex": _regex(THINK_TEXT)})
    message = out.choices[0].message
    assert message.content == "Four."
    assert message.model_extra["reasoning_content"] == "I add two and two."
    stream = client.chat.completions.create(
        **kwargs, stream=True, extra_body={"regex": _regex(THINK_TEXT)}
    )
    reasoning = content = ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (reasoning.strip(), content) == ("I add two and two.", "Four.")


@pytest.mark.parametrize(
    "extra", [{"separate_reasoning": False}, {"chat_template_kwargs": {"enable_thinking": False}}]
)
def test_reasoning_kept_in_content_when_the_request_says_so(served, extra):
    client, _ = served
    out = client.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=64,
        extra_body={"regex": _regex(THINK_TEXT), **extra},
    )
    message = out.choices[0].message
    assert message.content == THINK_TEXT
    assert (message.model_extra or {}).get("reasoning_content") is None


def test_reserved_template_kwargs_are_a_400_naming_the_field(served):
    client, _ = served
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"tokenize": True}},
        )
    assert "chat_template_kwargs" in str(err.value)


def test_chat_template_override_serves_a_template_without_a_system_role(model_dir):
    """`chat_template="gemma"` (`--chat-template gemma`): Gemma's template refuses a system
    message, so the route merges it into the first user turn, as Gemma's model card says."""
    engine = rf.Engine(str(model_dir), dtype="float32", max_total_tokens=512, chat_template="gemma")
    running = start_server(engine, served_model_name="m")
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "system", "content": "Be brief."}, *ASK]
        out = client.chat.completions.create(model="m", messages=messages, max_tokens=1)
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        tok.chat_template = BUILTIN_TEMPLATES["gemma"]
        merged = [{"role": "user", "content": "Be brief.\n\nWeather in Paris?"}]
        reference = tok.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)
        assert reference.endswith("<start_of_turn>model\n")
        assert out.usage.prompt_tokens == len(tok.encode(reference, add_special_tokens=False))
    finally:
        running.stop()
        engine.shutdown()
