"""Bodies of /v1/completions and /v1/chat/completions: every field of OpenAI's spec, strictly.

Unknown fields and wrong types are rejected (HTTP 400 naming the field, with a did-you-mean
hint when a known field is close); ranges that OpenAI documents are checked here under OpenAI's
names, the rest by `SamplingParams.validate`. Fields that have no meaning on this server are
accepted and ignored; docs/openai_compat.md lists them, and what is refused and why.
`StrictModel` is also the base of the /v1/responses bodies (responses_protocol.py).
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

Penalty = Annotated[float, Field(ge=-2, le=2)]


class StrictModel(BaseModel):
    """No unknown fields (a 400 naming the field and the closest known one), no coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = set(cls.model_fields)
        known |= {f.alias for f in cls.model_fields.values() if f.alias}
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                raise PydanticCustomError(
                    "unknown_field",
                    "unknown field '{field}'{hint}",
                    {"field": str(key), "hint": f" (did you mean '{close[0]}'?)" if close else ""},
                )
        # clients send unset fields as null: null means the field's default
        defaults = {
            key: f.default
            for name, f in cls.model_fields.items()
            for key in (name, f.alias)
            if key and not f.is_required()
        }
        return {k: v for k, v in data.items() if v is not None or defaults.get(k) is None}


def fold_seed(seed: int | None) -> int | None:
    """Any integer seed, folded into the engine's unsigned 64 bits (-1 -> 2**64 - 1)."""
    return None if seed is None else seed % 2**64


class StreamOptions(StrictModel):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # ignored: no obfuscation padding is sent


class JsonSchemaFormat(StrictModel):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingFields(StrictModel):
    """What completions and chat completions share, with SGLang's extra fields."""

    model: str
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)  # 0: only the most likely token
    frequency_penalty: Penalty | None = 0.0
    presence_penalty: Penalty | None = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # SGLang's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | dict[str, Any] | None = None
    rid: str | None = None
    # SGLang's router adds it (false) to every request; hidden states are never returned here.
    return_hidden_states: Literal[False] = False

    @field_validator("seed")
    @classmethod
    def _fold_seed(cls, seed: int | None) -> int | None:
        return fold_seed(seed)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=128)


# -- messages -------------------------------------------------------------------------------
class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class RefusalPart(StrictModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
# valid OpenAI input that this text-only model cannot read: refused by name, never dropped
UNSUPPORTED_PARTS = ("image_url", "input_audio", "file")


class FunctionCall(StrictModel):
    name: str
    arguments: str


class ToolCall(StrictModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AudioRef(StrictModel):
    id: str


class ChatMessage(StrictModel):
    """One message of any role, as clients send them (also an assistant message sent back
    whole: `refusal`, `audio`, `annotations`, `function_call` null)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    audio: AudioRef | None = None  # an earlier audio reply: never produced here
    annotations: list[dict[str, Any]] | None = None  # web search citations: ignored
    function_call: FunctionCall | None = None  # legacy form of tool_calls
    reasoning_content: str | None = None  # SGLang / vLLM: an earlier reply's reasoning

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in UNSUPPORTED_PARTS:
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: this model reads text only"
                )
        return content

    @model_validator(mode="after")
    def _legacy_forms(self) -> ChatMessage:
        """Legacy function messages become tool messages, `function_call` a tool call."""
        if self.audio is not None:
            raise ValueError("audio replies are not supported: this model writes text only")
        if self.function_call is not None and not self.tool_calls:
            call_id = f"call_{self.function_call.name}"
            self.tool_calls = [ToolCall(id=call_id, function=self.function_call)]
        if self.role == "function":
            if self.name is None:
                raise ValueError("a message with role 'function' needs its function's 'name'")
            self.role = "tool"
            self.tool_call_id = self.tool_call_id or f"call_{self.name}"
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)
        return self.content or self.refusal or ""


# -- tools ----------------------------------------------------------------------------------
class FunctionDef(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class Prediction(StrictModel):
    type: Literal["content"]
    content: str | list[TextPart]


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="allow")


class AllowedFunction(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class AllowedTools(StrictModel):
    mode: Literal["auto", "required"]
    tools: list[AllowedFunction] = Field(min_length=1)


class AllowedToolsChoice(StrictModel):
    """Calls limited to some of the tools: `mode` over that subset."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


def allow_only(tools: list[Tool] | None, names: list[str], where: str) -> list[Tool]:
    """The tools named in an `allowed_tools` choice; a name not among the tools is an error."""
    known = {t.function.name for t in tools or []}
    missing = [n for n in names if n not in known]
    if missing:
        raise ValueError(f"{where} names {missing[0]!r}, which is not among the tools")
    return [t for t in tools or [] if t.function.name in names]


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = True
    functions: list[FunctionDef] | None = Field(None, min_length=1, max_length=128)
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    # accepted and ignored (docs/openai_compat.md says why)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    verbosity: Literal["low", "medium", "high"] | None = None
    service_tier: str | None = None  # OpenAI adds tiers over time: any name
    prediction: Prediction | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in-memory", "24h", "in_memory"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    moderation: dict[str, Any] | None = None
    # SGLang's chat extensions
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _one_meaning(self) -> ChatCompletionRequest:
        """Legacy `functions`/`function_call` become `tools`/`tool_choice`; audio output and
        contradicting field pairs are refused."""
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs an assistant message last")
        if self.audio is not None or "audio" in (self.modalities or []):
            raise ValueError("audio output is not supported: this model writes text only")
        if isinstance(self.tool_choice, AllowedToolsChoice):
            allowed = self.tool_choice.allowed_tools
            names = [t.function.name for t in allowed.tools]
            self.tools = allow_only(self.tools, names, "tool_choice.allowed_tools")
            self.tool_choice = allowed.mode
        if self.functions is not None:
            if self.tools is not None:
                raise ValueError("give 'tools' or the legacy 'functions', not both")
            self.tools = [Tool(type="function", function=f) for f in self.functions]
            self.parallel_tool_calls = False
        if self.function_call is not None:
            if self.tool_choice is not None:
                raise ValueError("give 'tool_choice' or the legacy 'function_call', not both")
            choice = self.function_call
            self.tool_choice = (
                choice
                if isinstance(choice, str)
                else NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
            )
        return self

    @property
    def legacy_functions(self) -> bool:
        """Whether the reply must use the legacy `function_call` form."""
        return self.functions is not None
