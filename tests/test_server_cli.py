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

import httpx
import jsonschema
import pytest
from server_harness import wait_healthy

from radixflow.runtime.cli import build_parser, configure_logging, engine_kwargs, main
from radixflow.runtime.config import SGLANG_VALUES, EngineConfig
from radixflow.runtime.constrained import grammar_limits
from radixflow.runtime.server.errors import APIError
from radixflow.runtime.server.openai_protocol import ChatCompletionRequest, NamedToolChoice, Tool
from radixflow.runtime.server.openai_tools import ToolPlan

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
        assert f.metadata["help"] in action.help.replace("%%", "%")  # as argparse prints it
        choices = f.metadata.get("choices")
        expected = (*choices, *SGLANG_VALUES.get(f.name, {})) if choices else ()
        assert tuple(action.choices or ()) == expected


@pytest.mark.parametrize("command", ["serve", "run", "bench"])
def test_help_lists_every_flag(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--grammar-import-paths" in out and "%import" in out


def test_flags_parse_to_engine_config():
    args = _serve_args(
        "--model", "/models/x", "--dtype", "bfloat16", "--page-size", "16",
        "--mem-fraction-static", "0.5", "--disable-radix-cache", "--port", "31000",
    )  # fmt: skip
    config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert (config.model_path, config.dtype, config.page_size) == ("/models/x", "bfloat16", 16)
    assert config.mem_fraction_static == 0.5 and config.disable_radix_cache is True
    assert (args.host, args.port) == ("127.0.0.1", 31000)
    assert engine_kwargs(_serve_args("--no-disable-radix-cache"))["disable_radix_cache"] is False


def test_json_key_order_flag_reaches_the_grammar_compiler():
    config = EngineConfig.from_kwargs(
        **engine_kwargs(_serve_args("--grammar-json-key-order", "any"))
    )
    assert grammar_limits(config).json_key_order == "any"
    assert grammar_limits(EngineConfig()).json_key_order == "declared"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("20000", (20000,)), ("20000,5", (20000, 5)), ("50000, 10, 10", (50000, 10, 10)),
     ([20000, 10, 10], (20000, 10, 10))],
)  # fmt: skip
def test_gc_threshold_reads_as_set_threshold_takes_it(value, expected):
    assert EngineConfig(gc_threshold=value).gc_thresholds() == expected
    if isinstance(value, str):
        flag = engine_kwargs(_serve_args("--gc-threshold", value))
        assert EngineConfig.from_kwargs(**flag).gc_thresholds() == expected


@pytest.mark.parametrize("value", ["", "a,b", "1,2,3,4", "-5", "700,-1", "1.5", [1.5], [True]])
def test_gc_threshold_errors_name_the_knob(value):
    with pytest.raises(ValueError, match="gc_threshold must be 1 to 3 integers"):
        EngineConfig(gc_threshold=value)


# -- SGLang's launch_server spellings --------------------------------------------------------
SGLANG_LAUNCH = (
    "--model-path /models/x --tokenizer-path /models/tok --tp-size 1 --mem-fraction-static 0.7 "
    "--max-running-requests 8 --context-length 512 --served-model-name m --chat-template chatml "
    "--tool-call-parser hermes --reasoning-parser qwen3 --enable-metrics --log-requests "
    "--dtype half --attention-backend torch_native --speculative-algorithm NGRAM "
    "--speculative-num-draft-tokens 3 --grammar-backend xgrammar --host 0.0.0.0 --port 1234 "
    "--api-key k --log-level debug --random-seed 3 --chunked-prefill-size 256 "
    "--max-total-tokens 4096 --schedule-policy fcfs --disable-radix-cache "
    "--cuda-graph-max-bs 16 --disable-cuda-graph --trust-remote-code"
)


def test_an_sglang_launch_line_parses_unchanged(caplog):
    args = _serve_args(*SGLANG_LAUNCH.split())
    with caplog.at_level("WARNING", logger="radixflow"):
        config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert (config.model_path, config.tokenizer_path) == ("/models/x", "/models/tok")
    assert (config.dtype, config.attention_backend) == ("float16", "torch")
    assert (config.speculative_algorithm, config.speculative_num_tokens) == ("ngram", 3)
    assert (config.mem_fraction_static, config.max_running_requests) == (0.7, 8)
    assert (config.context_length, config.max_total_tokens, config.random_seed) == (512, 4096, 3)
    assert (config.chunked_prefill_size, config.schedule_policy) == (256, "fcfs")
    assert config.disable_radix_cache and config.log_requests
    assert (config.chat_template, config.tool_call_parser, config.reasoning_parser) == (
        "chatml",
        "hermes",
        "qwen3",
    )
    assert (args.host, args.port, args.api_key) == ("0.0.0.0", 1234, "k")
    assert args.served_model_name == ["m"]
    assert args.log_level == "debug"
    assert config.grammar_backend == "xgrammar"
    logged = caplog.text
    for flag in ("enable_metrics", "cuda_graph_max_bs", "disable_cuda_graph"):
        assert f"{flag}=" in logged and "ignored" in logged


@pytest.mark.parametrize(
    ("flags", "knob"),
    [
        (["--pp-size", "2"], "pp_size"),
        (["--kv-cache-dtype", "fp8_e5m2"], "kv_cache_dtype"),
    ],
)
def test_sglang_knobs_we_lack_are_errors_naming_them(flags, knob, capsys):
    assert main(["serve", *flags]) == 2
    assert knob in capsys.readouterr().err


def test_sglang_quantization_methods_we_lack_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--quantization", "awq"])
    assert exit_info.value.code == 2
    assert "--quantization: invalid choice: 'awq'" in capsys.readouterr().err


def test_engine_config_takes_sglang_names_as_keywords():
    config = EngineConfig.from_kwargs(
        model_path="/m", tp_size=1, dtype="half", attention_backend="torch_native",
        speculative_algorithm="NGRAM", speculative_draft_model_path=None, port=30000,
        log_level="info", enable_metrics=True, cuda_graph_max_bs=8,
    )  # fmt: skip
    assert (config.dtype, config.attention_backend, config.speculative_algorithm) == (
        "float16",
        "torch",
        "ngram",
    )
    with pytest.raises(ValueError, match="pp_size=2 is not supported"):
        EngineConfig.from_kwargs(pp_size=2)
    with pytest.raises(ValueError, match="unknown engine option 'mem_fraction'"):
        EngineConfig.from_kwargs(mem_fraction=0.5)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        EngineConfig.from_kwargs(attention_backend="flashinfer")
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        EngineConfig.from_kwargs(tool_call_parser="gorilla")


def test_log_level_reaches_radixflow_loggers():
    import logging

    for command in ("serve", "run x", "bench"):
        assert build_parser().parse_args([*command.split(), "--log-level", "debug"]).log_level
    configure_logging("debug")
    assert logging.getLogger("radixflow.runtime.engine").getEffectiveLevel() == logging.DEBUG
    configure_logging("warning")
    assert logging.getLogger("radixflow.runtime.engine").getEffectiveLevel() == logging.WARNING


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--dtype", "int3"],
        ["serve", "--page-size", "x"],
        ["serve", "--bogus"],
        ["serve", "--enable-dp-attention"],  # an SGLang flag with no meaning here
    ],
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
    cmd += ["--served-model-name", "smol", "x"]  # an alias is accepted as `model`
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, lambda: proc.stdout.read().decode())
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
