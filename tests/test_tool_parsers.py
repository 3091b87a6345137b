"""The models' own tool-call formats read into OpenAI tool_calls, whole and streamed."""

from __future__ import annotations

import json

import pytest

from radixflow.runtime.tool_parsers import ToolCallStream, tool_call_parser

TOOLS = {"get_weather", "add"}
HERMES = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)
CASES = [
    ("hermes", HERMES, "Let me check.", [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]),
    ("qwen25", HERMES, "Let me check.", [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None, [("get_weather", {"city": "Oslo"})]),
    (
        "llama3",
        '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        None,
        [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Rome"})],
    ),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 4, "b": 5}}]', None, [("add", {"a": 4, "b": 5})]),
    ("mistral", 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Lima"}', "Sure.", [("get_weather", {"city": "Lima"})]),
]  # fmt: skip


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("name", "text", "content", "expected"), CASES)
def test_each_format_parses_into_openai_tool_calls(name, text, content, expected):
    got_content, calls = tool_call_parser(name).parse(text, TOOLS)
    assert got_content == content and _calls(calls) == expected
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "The weather is fine, no call needed."),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": '),  # cut short
        ("hermes", '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>'),  # unknown
        ("llama3", "Paris is the capital of France."),
        ("llama3", '{"name": "add", "parameters": {"a": 1'),
        ("mistral", "[TOOL_CALLS]not json"),
    ],
)
def test_text_without_a_valid_call_stays_content(name, text):
    assert tool_call_parser(name).parse(text, TOOLS) == (text, [])


def test_unknown_parser_is_a_clear_error():
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        tool_call_parser("gorilla")


@pytest.mark.parametrize(("name", "text", "content", "expected"), CASES)
def test_streaming_sends_text_at_once_and_calls_whole_at_the_end(name, text, content, expected):
    stream = ToolCallStream(tool_call_parser(name), TOOLS)
    sent = ""
    for end in range(1, len(text) + 1):  # one character at a time: every split point
        sent += stream.feed(text[:end])
    rest, calls = stream.finish(text)
    sent += rest
    assert _calls(calls) == expected
    assert sent.strip() == (content or "")
    assert "<tool_call>" not in sent and "[TOOL_CALLS]" not in sent


def test_streamed_plain_text_goes_out_unchanged():
    text = "No tools today: <b>bold</b> and {braces} inside the text."
    stream = ToolCallStream(tool_call_parser("hermes"), TOOLS)
    pieces = [stream.feed(text[:end]) for end in range(1, len(text) + 1)]
    rest, calls = stream.finish(text)
    assert "".join(pieces) + rest == text and calls == []
    # a "<" goes out as soon as the next character shows it is not "<tool_call>"
    assert "".join(pieces[: text.index("<b>") + 2]) == text[: text.index("<b>") + 2]
