"""Request bodies of SGLang's native routes (`/generate`, `/abort_request`), validated strictly."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GenerateRequest(_Strict):
    """SGLang's `/generate` body."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int = Field(-1, ge=-1)
    top_logprobs_num: int = Field(0, ge=0, le=100)
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None


class AbortRequest(_Strict):
    rid: str = ""
    abort_all: bool = False
