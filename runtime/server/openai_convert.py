"""Between OpenAI's shapes and the engine's: request -> sampling params, result -> choices.

Shared by the chat, completions and responses routes: the served model check, the sampling
params of a request (`response_format` and tool plans become JSON Schemas, closed as OpenAI's
`strict: true` means: `strict_schema`), `usage` with radix-cache hits, finish reasons (an
aborted run becomes an error, never a `finish_reason` outside OpenAI's enum), and tokens named
as OpenAI shows them in logprobs.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixflow.grammars.json_schema_resolve import json_pointer
from radixflow.runtime.io_struct import AbortCause, FinishReason, GenerateInput
from radixflow.runtime.server.engine_client import ServerContext
from radixflow.runtime.server.errors import APIError, OpenAIError, error_body
from radixflow.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
)
from radixflow.runtime.server.wire import sse

if TYPE_CHECKING:  # openai_tools imports this module (strict tool schemas)
    from radixflow.runtime.server.openai_tools import ToolPlan

# engine field name -> OpenAI field name, for errors
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def check_model(ctx: ServerContext, model: str) -> str:
    """The requested model name when this server serves it; a 404 `model_not_found` if not."""
    if model not in ctx.model_names:
        raise OpenAIError(
            f"the model {model!r} does not exist; this server serves "
            + ", ".join(repr(n) for n in ctx.model_names),
            404,
            code="model_not_found",
            param="model",
            type="not_found_error",
        )
    return model


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, max_new: int | None
) -> dict[str, Any]:
    """The engine's sampling-params dict for an OpenAI request."""
    p: dict[str, Any] = {
        "min_new_tokens": body.min_tokens,
        "n": body.n,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "presence_penalty": body.presence_penalty or 0.0,
        "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens,
        "spaces_between_special_tokens": body.spaces_between_special_tokens,
        "no_stop_trim": body.no_stop_trim,
    }
    if max_new is not None:
        p["max_new_tokens"] = max_new
    optional = (
        "stop", "stop_token_ids", "seed", "temperature", "top_p", "top_k", "min_p",
        "repetition_penalty", "logit_bias", "regex", "ebnf", "json_schema",
    )  # fmt: skip
    for name in optional:
        value = getattr(body, name)
        if value is not None:
            p[name] = value
    if p.get("top_p") == 0:  # OpenAI allows 0; the engine's top_p must be positive
        del p["top_p"]
        p["top_k"] = 1
    if body.response_format is not None:
        schema = response_schema(body.response_format)
        if schema is not None:
            p["json_schema"] = schema
    return p


def response_schema(fmt: ResponseFormat) -> str | None:
    """The JSON Schema text a `response_format` constrains the output to (None: free text)."""
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(
            "response_format of type json_schema needs json_schema.schema",
            param="response_format.json_schema",
        )
    schema = fmt.json_schema.schema_
    if fmt.json_schema.strict:
        schema = checked_strict(schema, "response_format.json_schema.schema")
    return json.dumps(schema)


def checked_strict(schema: Any, param: str) -> Any:
    """`strict_schema(schema)`, its refusal a 400 naming `param`."""
    try:
        return strict_schema(schema)
    except ValueError as exc:
        raise APIError(f"{param} (strict: true): {exc}", param=param) from None


def usage(batch: GenerateInput, results: list[dict]) -> dict[str, Any]:
    """Prompt tokens count once per prompt (not per sample); completion tokens per sample."""
    prompt, cached = {}, {}
    for sub, r in zip(batch.items, results, strict=True):
        meta = r["meta_info"]
        prompt[sub.prompt_index] = meta["prompt_tokens"]
        cached[sub.prompt_index] = max(
            cached.get(sub.prompt_index, 0), meta.get("cached_tokens", 0)
        )
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    return {
        "prompt_tokens": sum(prompt.values()),
        "completion_tokens": completion,
        "total_tokens": sum(prompt.values()) + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached.values())},
    }


def finish(meta: dict) -> str | None:
    """OpenAI's finish reason (`stop` or `length`); an aborted run raises its error."""
    reason = meta["finish_reason"]
    if reason is None:
        return None
    if aborted(meta):
        raise abort_error(meta)
    return reason["type"]


def aborted(meta: dict) -> bool:
    reason = meta["finish_reason"]
    return reason is not None and reason["type"] == "abort"


def abort_error(meta: dict) -> OpenAIError:
    """The error an aborted engine run answers with: the request's own fault (a grammar
    budget, a prompt too large for the KV pool) is a 400, the server's a 5xx."""
    reason = FinishReason.from_dict(meta["finish_reason"])
    message = reason.message or "the request was aborted"
    kind = "invalid_request_error" if reason.cause is AbortCause.REQUEST else "server_error"
    return OpenAIError(message, reason.cause.status, code=reason.cause.err_type, type=kind)


def error_event(meta: dict) -> str:
    """The server-sent event that ends a stream whose engine run aborted."""
    return sse(error_body(abort_error(meta)))


def plan_schema(plan: ToolPlan) -> str:
    """The JSON Schema text a tool plan constrains the reply to."""
    return json.dumps(plan.schema())


def token_bytes(ctx: ServerContext, token_id: int) -> bytes:
    """The token's own bytes: a piece of a multi-byte character is that piece, not U+FFFD."""
    raw = ctx.engine.grammars.compiler.index.token_bytes
    data = raw[token_id] if 0 <= token_id < len(raw) else None
    return data if data is not None else ctx.client.token_text(token_id).encode()


def token_name(ctx: ServerContext, token_id: int) -> str:
    """A token as OpenAI shows it: its text, or `bytes:\\xNN...` when its bytes are only part
    of a UTF-8 character."""
    data = token_bytes(ctx, token_id)
    try:
        data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    return ctx.client.token_text(token_id)


# -- strict: true ---------------------------------------------------------------------------
STRICT_MAX_DEPTH = 200  # schema nesting levels `strict_schema` walks; deeper ones are refused
_OTHER_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # other instances
_OTHER_ONE = ("additionalProperties", "additionalItems", "contains", "unevaluatedItems")
_CONJUNCTS = ("dependentSchemas", "dependencies")  # maps of subschemas for the same instance
_ALTERNATIVES = ("anyOf", "oneOf")
_CLOSERS = ("additionalProperties", "patternProperties")


def strict_schema(schema: Any) -> Any:
    """The schema OpenAI's `strict: true` stands for: no object holds keys its schema does not
    declare. Every object schema (`type` object, or `properties`) that leaves other keys open
    (no `additionalProperties`, `patternProperties` or `unevaluatedProperties`) gets
    `additionalProperties: false`; `schema` itself is not changed.

    Subschemas that describe the same object (`allOf`, `anyOf`/`oneOf`, `$ref`, dependent
    schemas) are closed together: a part also allows the names its companions declare (as
    `{}` properties), so `allOf: [{"$ref": base}, {extension}]` still admits the extension's
    keys, while each `anyOf`/`oneOf` branch admits only its own keys besides the shared ones.
    `not`, `if`/`then`/`else` and a schema with `unevaluatedProperties` (which closes itself)
    are left as given: closing inside them could widen what they accept.
    Raises ValueError when the schema nests deeper than STRICT_MAX_DEPTH, or when a schema of
    type object requires a property that nothing declares (closed, it would admit nothing).
    """
    closer = _StrictCloser(schema)
    while True:  # a $ref target admits the names of every place it is used in: a fixpoint
        before = dict(closer.extra)
        out = closer.close(schema, frozenset(), "#", 0)
        if closer.extra == before:
            return out


@dataclass
class _StrictCloser:
    root: Any
    # names a $ref target (by JSON pointer) must admit besides its own: its users declare them
    extra: dict[str, frozenset[str]] = field(default_factory=dict)
    _keys: dict[int, frozenset[str]] = field(default_factory=dict)

    def close(self, node: Any, inherited: frozenset[str], path: str, depth: int) -> Any:
        if not isinstance(node, dict) or "unevaluatedProperties" in node:
            return node
        if depth > STRICT_MAX_DEPTH:
            raise ValueError(f"{path}: the schema nests deeper than {STRICT_MAX_DEPTH} levels")
        inherited |= self.extra.get(path, frozenset())
        visible = inherited | self.keys(node, depth)
        shared = inherited | _names(node) | self._conjunct_keys(node, depth)
        out = dict(node)
        for key, value in node.items():
            where = f"{path}/{_escape(key)}"
            if key in _OTHER_MAPS and isinstance(value, dict):
                out[key] = {
                    k: self.close(v, frozenset(), f"{where}/{_escape(k)}", depth + 1)
                    for k, v in value.items()
                }
            elif key in _OTHER_ONE or (key == "items" and isinstance(value, dict)):
                out[key] = self.close(value, frozenset(), where, depth + 1)
            elif key in ("items", "prefixItems") and isinstance(value, list):
                out[key] = [
                    self.close(v, frozenset(), f"{where}/{i}", depth + 1)
                    for i, v in enumerate(value)
                ]
            elif key == "allOf" and isinstance(value, list):
                out[key] = [
                    self.close(v, visible, f"{where}/{i}", depth + 1) for i, v in enumerate(value)
                ]
            elif key in _ALTERNATIVES and isinstance(value, list):
                out[key] = [
                    self.close(v, shared, f"{where}/{i}", depth + 1) for i, v in enumerate(value)
                ]
            elif key in _CONJUNCTS and isinstance(value, dict):
                out[key] = {
                    k: self.close(v, visible, f"{where}/{_escape(k)}", depth + 1)
                    for k, v in value.items()
                }
        ref = node.get("$ref")
        target = self._target(ref)
        if target is not None:
            missing = visible - self.keys(target, depth + 1)
            pointer = _pointer(ref)
            if not missing <= self.extra.get(pointer, frozenset()):
                self.extra[pointer] = self.extra.get(pointer, frozenset()) | missing
        if _is_object(node) and not any(k in node for k in _CLOSERS):
            undeclared = [n for n in node.get("required", []) if n not in visible]
            if undeclared and node.get("type") in ("object", ["object"]):
                raise ValueError(
                    f"{path}: required property {undeclared[0]!r} is not declared in "
                    "properties, so the closed object could never hold it"
                )
            props = dict(out.get("properties") or {})
            props.update({name: {} for name in sorted(visible - props.keys())})
            out["properties"] = props
            out["additionalProperties"] = False
        return out

    def keys(self, node: Any, depth: int) -> frozenset[str]:
        """Every property name `node` or a part of it describing the same object declares."""
        if not isinstance(node, dict):
            return frozenset()
        if depth > STRICT_MAX_DEPTH:
            raise ValueError(f"the schema nests deeper than {STRICT_MAX_DEPTH} levels")
        known = self._keys.get(id(node))
        if known is not None:
            return known
        self._keys[id(node)] = _names(node)  # a $ref cycle ends here
        names = _names(node) | self._conjunct_keys(node, depth)
        for key in _ALTERNATIVES:
            for branch in _branches(node.get(key)):
                names |= self.keys(branch, depth + 1)
        self._keys[id(node)] = names
        return names

    def _conjunct_keys(self, node: dict, depth: int) -> frozenset[str]:
        """The names of the parts that always apply with `node`: allOf, $ref, dependents."""
        parts = _branches(node.get("allOf")) + [self._target(node.get("$ref"))]
        for key in _CONJUNCTS:
            parts += _branches(node.get(key))
        names: frozenset[str] = frozenset()
        for part in parts:
            names |= self.keys(part, depth + 1)
        return names

    def _target(self, ref: Any) -> Any:
        """The subschema a local `$ref` points to; None for others (the compiler names them)."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            return None  # another document, or an anchor
        return json_pointer(self.root, ref)


def _pointer(ref: str) -> str:
    return "#" + urllib.parse.unquote(ref[1:]).rstrip("/")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _names(node: dict) -> frozenset[str]:
    props = node.get("properties")
    return frozenset(props) if isinstance(props, dict) else frozenset()


def _branches(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return []


def _is_object(node: dict) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node
