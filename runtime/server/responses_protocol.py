"""Request bodies of POST /v1/responses (OpenAI's Responses API), validated strictly.

Input items (messages, function calls and their outputs, reasoning sent back) are told apart
by `type`; an item without one is a message. Fields that need server-side state are typed
here so that the route can refuse them by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from radixflow.runtime.server.openai_protocol import StrictModel, fold_seed


class InputText(StrictModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # on output_text sent back: ignored
    logprobs: list[dict[str, Any]] | None = None


class InputRefusal(StrictModel):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[InputText | InputRefusal, Field(discriminator="type")]
UNSUPPORTED_INPUT_PARTS = ("input_image", "input_file", "input_audio")


class MessageItem(StrictModel):
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


class FunctionCallItem(StrictModel):
    """An earlier function call of the model, sent back for a tool round trip."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(StrictModel):
    """The result of a function call."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningItem(StrictModel):
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


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: str


class ResponsesAllowedTools(StrictModel):
    """Calls limited to some of the tools (function tools only here)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[FunctionToolChoice] = Field(min_length=1)


class TextFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextParam(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # ignored


class ResponsesStreamOptions(StrictModel):
    include_obfuscation: bool | None = None  # ignored: no obfuscation padding is sent


class ResponsesRequest(StrictModel):
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
