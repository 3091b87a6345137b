"""What loading a HF folder takes from it and from the options: a chat template by name or
file, a separate tokenizer, and generation_config.json (extra EOS ids, default sampling)."""

from __future__ import annotations

import json
import logging

import pytest
import transformers
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.grammars import native_rows, native_walk
from radixflow.runtime.chat_templates import BUILTIN_TEMPLATES, resolve_chat_template
from radixflow.runtime.model_loader import load_checkpoint, sampling_defaults, with_defaults

GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def test_template_by_name_file_or_json_file(tmp_path):
    assert resolve_chat_template(None) is None
    assert resolve_chat_template("chatml") == BUILTIN_TEMPLATES["chatml"]
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert resolve_chat_template(str(jinja)) == jinja.read_text()
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    assert resolve_chat_template(str(config)) == "{{ messages[0]['content'] }}"


@pytest.mark.parametrize(
    ("value", "message"),
    [("chatm1", "neither a file nor a built-in template"), ("{empty}", "is empty")],
)
def test_bad_template_values_say_what_is_wrong(tmp_path, value, message):
    if value == "{empty}":
        value = str(tmp_path / "empty.jinja")
        (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match=message):
        resolve_chat_template(value)


def test_checkpoint_takes_the_override_and_another_tokenizer(model_dir, tmp_path):
    ckpt = load_checkpoint(model_dir, chat_template="gemma")
    assert ckpt.tokenizer.chat_template == BUILTIN_TEMPLATES["gemma"]
    other = tmp_path / "tok"
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = BUILTIN_TEMPLATES["mistral"]
    tok.save_pretrained(other)
    ckpt = load_checkpoint(model_dir, tokenizer_path=other)
    assert ckpt.tokenizer.chat_template == BUILTIN_TEMPLATES["mistral"]


def _first_greedy_token(engine) -> int:
    return engine.generate("The capital of France", {**GREEDY, "max_new_tokens": 1})["output_ids"][
        0
    ]


def test_generation_config_adds_eos_ids_and_default_sampling(model_dir, tmp_path):
    with rf.Engine(str(model_dir), dtype="float32", max_total_tokens=256) as engine:
        first = _first_greedy_token(engine)
        assert engine.sampling_defaults == {}
        out = engine.generate("The capital of France", GREEDY)
        assert out["meta_info"]["completion_tokens"] == 4  # the token is not an EOS yet
    gen = {"eos_token_id": [1, first], "temperature": 0.25, "top_k": 7, "top_p": 0.9}
    (model_dir / "generation_config.json").write_text(json.dumps(gen))
    try:
        with rf.Engine(str(model_dir), dtype="float32", max_total_tokens=256) as engine:
            assert first in engine.eos_token_ids
            assert engine.sampling_defaults == {"temperature": 0.25, "top_k": 7, "top_p": 0.9}
            out = engine.generate("The capital of France", GREEDY)
            assert out["output_ids"] == [first]
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
        off = rf.Engine(
            str(model_dir), dtype="float32", max_total_tokens=256, generation_config="none"
        )
        with off:
            assert first not in off.eos_token_ids and off.sampling_defaults == {}
    finally:
        (model_dir / "generation_config.json").unlink()


def test_request_values_win_over_the_model_defaults():
    defaults = {"temperature": 0.6, "top_p": 0.95}
    assert with_defaults(defaults, {"temperature": 0}) == {"temperature": 0, "top_p": 0.95}
    assert with_defaults(defaults, {"temperature": None}) == defaults  # null: the default
    assert with_defaults(defaults, None) == defaults
    assert with_defaults(defaults, "bad") == "bad"  # left for the validator to name
    gen = transformers.GenerationConfig(temperature=0.7, repetition_penalty=1.1)
    assert sampling_defaults(gen) == {"temperature": 0.7, "repetition_penalty": 1.1}


def test_generation_config_folder_must_hold_the_file(model_dir, tmp_path):
    with pytest.raises(ValueError, match="has no generation_config.json"):
        load_checkpoint(model_dir, generation_config=str(tmp_path))


def test_startup_summary_and_request_log(model_dir, caplog):
    caplog.set_level(logging.INFO, logger="radixflow")
    with rf.Engine(str(model_dir), dtype="float32", max_total_tokens=256, log_requests=True) as e:
        e.generate("Hello", {"max_new_tokens": 2, "temperature": 0}, rid="logged-1")
    lines = [r.getMessage() for r in caplog.records]
    summary = next(line for line in lines if line.startswith("model "))
    for part in (
        "dtype float32",
        "kernels ",
        "KV pool 256 tokens",
        "GiB",
        "attention torch",
        f"grammar backend radixflow, {native_walk.describe()}, {native_rows.describe()}",
    ):
        assert part in summary
    request = next(line for line in lines if line.startswith("request "))
    assert "prompt_tokens=" in request and "'max_new_tokens': 2" in request
    assert "'type': 'length'" in request
