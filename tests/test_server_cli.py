"""The command line (flags generated from EngineConfig), the tool-call schemas, and a real
`radixflow serve` process: ready only after warm-up, serving both APIs, clean SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
import pytest

from radixflow.runtime.cli import build_parser, engine_kwargs
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.openai_protocol import ChatCompletionRequest, NamedToolChoice, Tool
from radixflow.runtime.openai_tools import ToolPlan
from radixflow.runtime.serving import APIError

FIELDS = dataclasses.fields(EngineConfig)


def _serve_args(*extra: str):
    return build_parser().parse_args(["serve", *extra])


def test_every_engine_field_is_a_flag_with_its_default():
    args = _serve_args()
    assert engine_kwargs(args) == {f.name: f.default for f in FIELDS}
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    actions = {a.dest: a for a in serve._actions}
    for f in FIELDS:
        action = actions[f.name]
        assert f"--{f.name.replace('_', '-')}" in action.option_strings
        assert f.metadata["help"] in action.help
        assert tuple(action.choices or ()) == tuple(f.metadata.get("choices") or ())


def test_flags_parse_to_engine_config():
    args = _serve_args(
        "--model", "/models/x", "--dtype", "bfloat16", "--page-size", "16",
        "--kv-cache-gb", "0.5", "--disable-radix-cache", "--port", "31000",
    )  # fmt: skip
    config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert (config.model_path, config.dtype, config.page_size) == ("/models/x", "bfloat16", 16)
    assert config.kv_cache_gb == 0.5 and config.disable_radix_cache is True
    assert (args.host, args.port) == ("127.0.0.1", 31000)
    assert engine_kwargs(_serve_args("--no-disable-radix-cache"))["disable_radix_cache"] is False


@pytest.mark.parametrize(
    "argv", [["serve", "--dtype", "int3"], ["serve", "--page-size", "x"], ["serve", "--bogus"]]
)
def test_bad_flags_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2 and "usage" in capsys.readouterr().err


# -- tool calls -----------------------------------------------------------------------------
ADD = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }
)
NOW = Tool.model_validate({"type": "function", "function": {"name": "now"}})


def _named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def test_tool_schemas_accept_exactly_valid_calls():
    good = {"name": "add", "arguments": {"a": 1, "b": 2}}
    bad_args = {"name": "add", "arguments": {"a": "1", "b": 2}}
    wrong_name = {"name": "sub", "arguments": {"a": 1, "b": 2}}
    named = ToolPlan.from_request([ADD, NOW], _named("add"), True).schema()
    required = ToolPlan.from_request([ADD, NOW], "required", True).schema()
    auto = ToolPlan.from_request([ADD, NOW], "auto", False).schema()
    valid = jsonschema.Draft202012Validator

    assert valid(named).is_valid(good) and not valid(named).is_valid(bad_args)
    assert valid(required).is_valid([good, {"name": "now", "arguments": {}}])
    for value in ([], [bad_args], [wrong_name], good):
        assert not valid(required).is_valid(value)
    assert valid(auto).is_valid([good]) and valid(auto).is_valid({"content": "hi"})
    assert not valid(auto).is_valid([good, good])  # parallel_tool_calls=False


def test_tool_plan_reads_calls_and_answers():
    auto = ToolPlan.from_request([ADD], "auto", True)
    calls, content = auto.parse('[{"name":"add","arguments":{"a":1,"b":2}}]')
    assert content is None and calls[0]["function"] == {
        "name": "add",
        "arguments": '{"a": 1, "b": 2}',
    }
    assert auto.parse('{"content":"four"}') == (None, "four")
    assert auto.parse('[{"name":"add","argum') == (None, '[{"name":"add","argum')
    assert auto.parse('{"content":"cut \\"short') == (None, 'cut "short')  # by max_tokens
    named = ToolPlan.from_request([ADD], _named("add"), True)
    assert (
        named.parse('{"name":"add","arguments":{"a":1,"b":2}}')[0][0]["function"]["name"] == "add"
    )


def test_tool_choice_errors_name_the_field():
    assert ToolPlan.from_request([ADD], "none", True) is None
    assert ToolPlan.from_request(None, None, True) is None
    for tools, choice in (([ADD], _named("nope")), (None, "required")):
        with pytest.raises(APIError) as err:
            ToolPlan.from_request(tools, choice, True)
        assert err.value.param == "tool_choice"


def test_chat_request_rejects_unknown_fields_and_wrong_types():
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ChatCompletionRequest.model_validate(base)
    for bad in ({"temperature": "1"}, {"n": 1.5}, {"logprobs": 1}, {"frobnicate": True}):
        with pytest.raises(ValueError):
            ChatCompletionRequest.model_validate({**base, **bad})


# -- a real server process ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_process_ready_after_warmup_and_stops_cleanly():
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "radixflow", "serve", "--port", str(port), "--dtype", "float32"]
    cmd += ["--max-total-tokens", "2048", "--log-level", "warning", "--graceful-timeout", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        info = httpx.get(f"{url}/server_info").json()
        assert info["stats"]["requests"] >= 1  # the warm-up ran before /health said ready
        assert info["dtype"] == "float32" and info["max_total_tokens"] == 2048
        r = httpx.post(
            f"{url}/v1/completions", json={"model": "x", "prompt": "Hi", "max_tokens": 2}
        )
        assert r.json()["usage"]["completion_tokens"] == 2
        body = {
            "text": "Hi",
            "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
            "stream": True,
        }
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            proc.send_signal(signal.SIGTERM)
            tail = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert tail[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        # uvicorn re-raises the signal once shut down, so the process ends as SIGTERM says
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
