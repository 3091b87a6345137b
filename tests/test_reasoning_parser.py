"""`<think>` reasoning split from the answer, whole and streamed, and when it is not split."""

from __future__ import annotations

import pytest

from radixflow.runtime.reasoning_parser import ReasoningStream, reasoning_parser

QWEN3 = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello! How can I help?"
R1 = "The user greets me.\nI greet back.\n</think>\n\nHello! How can I help?"


@pytest.mark.parametrize(("name", "text"), [("qwen3", QWEN3), ("deepseek-r1", R1)])
def test_reasoning_and_content_are_split(name, text):
    reasoning, content = reasoning_parser(name).split(text)
    assert reasoning.rstrip() == "The user greets me.\nI greet back."
    assert content == "Hello! How can I help?"


def test_qwen3_without_think_is_all_content_and_r1_unfinished_is_all_reasoning():
    assert reasoning_parser("qwen3").split("Just an answer.") == (None, "Just an answer.")
    assert reasoning_parser("deepseek-r1").split("still thinking") == ("still thinking", "")


def test_request_options_turn_the_parser_off():
    assert reasoning_parser(None) is None
    assert reasoning_parser("qwen3", separate=False) is None
    assert reasoning_parser("qwen3", template_kwargs={"enable_thinking": False}) is None
    assert reasoning_parser("qwen3", template_kwargs={"enable_thinking": True}) is not None
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        reasoning_parser("o1")


@pytest.mark.parametrize(("name", "text"), [("qwen3", QWEN3), ("deepseek-r1", R1)])
def test_streamed_deltas_add_up_to_the_whole_split(name, text):
    parser = reasoning_parser(name)
    stream = ReasoningStream(parser)
    reasoning = content = ""
    for end in range(1, len(text) + 1):  # every split point, tags cut anywhere
        r, c = stream.feed(text[:end], final=end == len(text))
        assert "<" not in r and "</" not in c  # no piece of a tag ever goes out
        reasoning, content = reasoning + r, content + c
    whole_reasoning, whole_content = parser.split(text)
    assert (reasoning, content) == (whole_reasoning, whole_content)
