"""Request bodies of the OpenAI-compatible routes: every field of OpenAI's spec, validated strictly.

Unknown fields and wrong types are rejected (HTTP 400 naming the field, with a did-you-mean
hint when a known field is close); ranges that OpenAI documents are checked here under OpenAI's
names, the rest by `SamplingParams.validate`. Fields that have no meaning on this server are
accepted and ignored; docs/openai_compat.md lists them, and what is refused and why.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Strict(BaseModel):
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


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # ignored: no obfuscation padding is sent


class JsonSchemaFormat(_Strict):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingFields(_Strict):
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
class TextPart(_Strict):
    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
# valid OpenAI input that this text-only model cannot read: refused by name, never dropped
UNSUPPORTED_PARTS = ("image_url", "input_audio", "file")


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AudioRef(_Strict):
    id: str


class ChatMessage(_Strict):
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
class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class Prediction(_Strict):
    type: Literal["content"]
    content: str | list[TextPart]


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="allow")


class AllowedFunction(_Strict):
    type: Literal["function"]
    function: NamedFunction


class AllowedTools(_Strict):
    mode: Literal["auto", "required"]
    tools: list[AllowedFunction] = Field(min_length=1)


class AllowedToolsChoice(_Strict):
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


# -- the Responses API (POST /v1/responses) -------------------------------------------------
class InputText(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # on output_text sent back: ignored
    logprobs: list[dict[str, Any]] | None = None


class InputRefusal(_Strict):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[InputText | InputRefusal, Field(discriminator="type")]
UNSUPPORTED_INPUT_PARTS = ("input_image", "input_file", "input_audio")


class MessageItem(_Strict):
    """A message of the input: as clients write it, or an output message sent back whole."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in UNSUPPORTED_INPUT_PARTS:
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: this model reads text only"
                )
        return content

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, InputText) else p.refusal for p in self.content)


class FunctionCallItem(_Strict):
    """An earlier function call of the model, sent back for a tool round trip."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    """The result of a function call."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningItem(_Strict):
    """An earlier reasoning item sent back; its text is not shown to the model again (chat
    templates drop earlier turns' reasoning too)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = []
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


def _item_type(item: Any) -> str:
    """Input items without `type` are messages (EasyInputMessage)."""
    if isinstance(item, dict):
        return str(item.get("type", "message"))
    return str(getattr(item, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Strict):
    type: Literal["function"]
    name: str


class ResponsesAllowedTools(_Strict):
    """Calls limited to some of the tools (function tools only here)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[FunctionToolChoice] = Field(min_length=1)


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextParam(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # ignored


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = None  # ignored: no obfuscation padding is sent


class ResponsesRequest(_Strict):
    """POST /v1/responses. Stateless: what needs a stored conversation is refused by name."""

    model: str
    input: list[InputItem] | str  # the list first: its errors are the ones worth naming
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)  # 0: only the most likely token
    text: TextParam | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | FunctionToolChoice | ResponsesAllowedTools | None
    ) = None
    parallel_tool_calls: bool | None = True
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None  # accepted: nothing is kept (docs/openai_compat.md)
    metadata: dict[str, str] | None = None
    user: str | None = None
    seed: int | None = None  # not in OpenAI's spec; SGLang/vLLM accept it
    # refused unless null: they need server-side state or features this server lacks
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # accepted and ignored (docs/openai_compat.md says why)
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    service_tier: str | None = None  # OpenAI adds tiers over time: any name
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in-memory", "24h", "in_memory"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    moderation: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None

    @field_validator("seed")
    @classmethod
    def _fold_seed(cls, seed: int | None) -> int | None:
        return fold_seed(seed)
