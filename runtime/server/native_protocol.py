"""Request bodies of SGLang's native routes (`/generate`, `/abort_request`), validated strictly.

`GenerateRequest` has every field of SGLang 0.5.23's `GenerateReqInput`. The ones this server
implements are typed fields; the rest arrive in `model_extra` and `check_extra_fields` sorts
them: fields that change nothing on one text-only server are accepted (`IGNORED`), fields
whose feature is not here are a 400 naming them when set (`UNSUPPORTED`), and any other name
is a 400 with the closest known name.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from radixflow.runtime.server.engine_client import LogprobArgs
from radixflow.runtime.server.errors import APIError

MAX_TOP_LOGPROBS = 100

# Fields that only route, trace or label a request: they change nothing on a single server.
IGNORED = frozenset(
    {
        "model",  # SGLang's server ignores it too; the router adds it
        "session_id",
        "conversation_id",
        "routing_key",
        "custom_labels",
        "no_logs",
        "log_metrics",
        "external_trace_header",
        "received_time",
    }
)
_MULTIMODAL = "this server runs a text-only model"
_DISAGG = "prefill/decode disaggregation is not supported"
# Field -> why it is refused. A field set to null, or to its "off" value, is accepted.
UNSUPPORTED = {
    "input_embeds": "prompts as embeddings are not supported; send text or input_ids",
    "image_data": _MULTIMODAL,
    "video_data": _MULTIMODAL,
    "audio_data": _MULTIMODAL,
    "modalities": _MULTIMODAL,
    "mm_hashes": _MULTIMODAL,
    "mm_content_hashes": _MULTIMODAL,
    "use_audio_in_video": _MULTIMODAL,
    "video_config": _MULTIMODAL,
    "need_wait_for_mm_inputs": _MULTIMODAL,
    "num_items_assigned": _MULTIMODAL,
    "encoder_urls": _MULTIMODAL,
    "max_dynamic_patch": _MULTIMODAL,
    "min_dynamic_patch": _MULTIMODAL,
    "image_max_dynamic_patch": _MULTIMODAL,
    "video_max_dynamic_patch": _MULTIMODAL,
    "images_config": _MULTIMODAL,
    "mm_processor_kwargs": _MULTIMODAL,
    "positional_embed_overrides": "embedding overrides are not supported",
    "return_hidden_states": "hidden states are not returned by this server",
    "return_routed_experts": "this server runs no mixture-of-experts model",
    "routed_experts_start_len": "this server runs no mixture-of-experts model",
    "return_indexer_topk": "sparse-attention indexer outputs are not supported",
    "return_sampling_mask": "sampling masks are not returned by this server",
    "sampling_logprobs_mode": "sampling masks are not returned by this server",
    "return_flat_raw_top_logprobs": "top logprobs come as nested lists only",
    "return_flat_raw_output_top_logprobs": "top logprobs come as nested lists only",
    "return_flat_raw_top_logprobs_b64": "top logprobs come as nested lists only",
    "return_entropy": "entropies are not returned by this server",
    "return_bytes": "this server generates text only",
    "watermark": "watermarking is not supported",
    "session_params": "sessions (continual prompting) are not supported",
    "lora_path": "LoRA adapters are not supported",
    "lora_id": "LoRA adapters are not supported",
    "custom_logit_processor": "custom logit processors are not supported",
    "bootstrap_host": _DISAGG,
    "bootstrap_port": _DISAGG,
    "bootstrap_room": _DISAGG,
    "bootstrap_pair_key": _DISAGG,
    "decode_tp_size": _DISAGG,
    "disagg_prefill_dp_rank": _DISAGG,
    "kv_hints": "KV hints for hierarchical cache storage are not supported",
    "http_worker_ipc": "multi-tokenizer mode is not supported",
    "background": "background requests are not supported",
    "require_reasoning": "reasoning control is not supported",
    "max_thinking_tokens": "reasoning control is not supported",
    "priority": "priority scheduling is not supported",
    "extra_key": "cache namespaces are not supported",
    "cache_salt": "cache namespaces are not supported",
    "multi_item_delimiter_indices": "multi-item scoring is not supported",
    "token_indices_to_pool": "pooling readouts are not supported",
    "routed_dp_rank": "this server has one data-parallel rank (0)",
    "data_parallel_rank": "this server has one data-parallel rank (0)",
}
# Values that mean "off" for refused fields (null always does).
_OFF: dict[str, tuple[Any, ...]] = {
    "return_hidden_states": (False,),
    "return_routed_experts": (False,),
    "routed_experts_start_len": (0,),
    "return_indexer_topk": (False,),
    "return_sampling_mask": (False,),
    "return_flat_raw_top_logprobs": (False,),
    "return_flat_raw_output_top_logprobs": (False,),
    "return_flat_raw_top_logprobs_b64": (False,),
    "return_entropy": (False,),
    "return_bytes": (False,),
    "use_audio_in_video": (False,),
    "background": (False,),
    "require_reasoning": (False,),
    "routed_dp_rank": (0,),
    "data_parallel_rank": (0,),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GenerateRequest(BaseModel):
    """SGLang's `/generate` body: the fields implemented here, the rest in `model_extra`."""

    model_config = ConfigDict(extra="allow", strict=True)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False
    stream: bool = False
    rid: str | list[str] | None = None


class AbortRequest(_Strict):
    rid: str = ""
    abort_all: bool = False


def check_extra_fields(extra: dict[str, Any] | None) -> None:
    """A 400 for a refused field that is set, or for an unknown one (with a did-you-mean)."""
    for key, value in (extra or {}).items():
        if key in IGNORED:
            continue
        if key in UNSUPPORTED:
            if value is None or any(value is off or value == off for off in _OFF.get(key, ())):
                continue
            raise APIError(f"{key} is not supported: {UNSUPPORTED[key]}", param=key)
        known = [*GenerateRequest.model_fields, *IGNORED, *UNSUPPORTED]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise APIError(f"unknown field '{key}'{hint}", param=key)


@dataclass
class PromptLogprobs:
    """The logprob fields of a /generate body, one entry per prompt."""

    per_prompt: list[LogprobArgs]
    with_text: bool

    @classmethod
    def from_request(cls, body: GenerateRequest, prompts: list[list[int]]) -> PromptLogprobs:
        n = len(prompts)
        flags = _per_prompt(body.return_logprob, n, "return_logprob")
        starts = _per_prompt(body.logprob_start_len, n, "logprob_start_len")
        tops = _per_prompt(body.top_logprobs_num, n, "top_logprobs_num")
        ids = body.token_ids_logprob
        id_lists = ids if ids and isinstance(ids[0], list) else [ids] * n
        if len(id_lists) != n:
            raise APIError(
                f"token_ids_logprob has {len(id_lists)} lists for {n} prompts",
                param="token_ids_logprob",
            )
        out = []
        for prompt, flag, start, top, wanted in zip(
            prompts, flags, starts, tops, id_lists, strict=True
        ):
            if start is not None and not -1 <= start <= len(prompt):
                raise APIError(
                    f"logprob_start_len must be in [-1, {len(prompt)}] (the prompt's length), "
                    f"got {start}",
                    param="logprob_start_len",
                )
            if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
                raise APIError(
                    f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top}",
                    param="top_logprobs_num",
                )
            out.append(
                LogprobArgs(
                    return_logprob=bool(flag),
                    logprob_start_len=None if start is None or start < 0 else start,
                    top_logprobs_num=top or 0,
                    token_ids_logprob=wanted or None,
                )
            )
        return cls(out, body.return_text_in_logprobs)


def _per_prompt(value: Any, n: int, name: str) -> list[Any]:
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise APIError(f"{name} has {len(value)} entries for {n} prompts", param=name)
    return value
