"""Shared pieces of the OpenAI wire tests (no tests of its own): a server over a tiny random
model with a chat template, and validation against OpenAI's OpenAPI description.

The tiny model writes noise, so tests over it check shapes and constrained output (a JSON
Schema makes a structured answer valid whatever the model's quality), never wording.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from server_harness import start_server
from tiny_models import make_tiny_model_dir
from transformers import AutoTokenizer

import radixflow as rf

OPENAPI = Path(__file__).resolve().parents[1].parent / "shared/peer-data/openai/openapi.json"
TINY_NAME = "tiny"
TINY_ALIASES = ["tiny", "tiny-alias", "org/tiny-v1"]
# Small enough for a random model to fill within a few tokens once constrained
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` (which the 3.1 spec still uses) as JSON Schema: the
    schema or null."""
    if isinstance(node, list):
        return [_nullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items()}
    if out.pop("nullable", False) is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _openapi() -> tuple[dict[str, Any], Registry]:
    spec = _nullable(json.loads(OPENAPI.read_text()))
    resource = Resource.from_contents(spec, default_specification=DRAFT202012)
    return spec, Registry().with_resource("openapi.json", resource)


def assert_valid(instance: Any, schema_name: str) -> None:
    """Validate a response body against components/schemas/<schema_name> of OpenAI's spec."""
    if not OPENAPI.exists():
        pytest.skip(f"OpenAI's OpenAPI description is not here ({OPENAPI})")
    spec, registry = _openapi()
    assert schema_name in spec["components"]["schemas"], schema_name
    schema = {"$ref": f"openapi.json#/components/schemas/{schema_name}"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(instance), key=lambda e: len(list(e.path)))
    assert not errors, f"{schema_name}: {errors[0].message} at {list(errors[0].path)}"


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("openai-tiny"), "llama", seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    eng = rf.Engine(str(path), dtype="float32", max_total_tokens=2048, chunked_prefill_size=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tiny_server(tiny_engine):
    running = start_server(tiny_engine, served_model_name=TINY_ALIASES)
    yield running
    running.stop()
