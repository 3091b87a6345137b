"""Logprobs of a request: recorded from the step's logits, reported in SGLang's shape.

Output logprobs come from the sampler (log_softmax of the raw model logits at each sampled
position); input logprobs score each prompt token given the tokens before it (what `select`
ranks choices by). `logprob_meta` turns both into the `meta_info` entries of a response.
"""

from __future__ import annotations

from typing import Any

import torch

from radixflow.runtime.request import Req
from radixflow.runtime.sampler import SampleOutput

# Tokens a grammar forbids have logprob -inf, which JSON cannot carry; report the floor vLLM
# reports for them.
LOGPROB_FLOOR = -9999.0


def record_output_logprobs(req: Req, out: SampleOutput, i: int) -> None:
    """Append row `i` of a sample's logprobs (the token `req` just appended) to the request."""
    lp = req.logprob
    assert out.logprobs is not None  # the step sampled with logprobs for this request
    req.output_logprobs.append(float(out.logprobs[i]))
    if lp.top_logprobs_num:
        assert out.top_logprobs is not None
        vals, ids = out.top_logprobs
        k = lp.top_logprobs_num
        finite = vals[i, :k].clamp(min=LOGPROB_FLOOR)
        req.output_top_logprobs.append(list(zip(finite.tolist(), ids[i, :k].tolist(), strict=True)))
    if lp.token_ids:
        assert out.all_logprobs is not None
        row = out.all_logprobs[i, lp.token_ids].clamp(min=LOGPROB_FLOOR)
        req.output_token_ids_logprobs.append(row.tolist())


def record_input_logprobs(req: Req, positions: list[int], logp: torch.Tensor) -> None:
    """Append the logprobs of the prompt tokens at positions+1, given `logp` [len(positions), V]
    (log_softmax of the logits at `positions`); entries before logprob_start_len are skipped."""
    start = min(req.logprob.logprob_start_len, len(req.prompt_ids) - 1)
    if start == 0 and not req.input_logprobs:
        req.input_logprobs.append(None)
        req.input_top_logprobs.append(None)
        req.input_token_ids_logprobs.append(None)
    k = req.logprob.top_logprobs_num
    wanted = req.logprob.token_ids
    for row, pos in zip(logp, positions, strict=True):
        if pos + 1 == start + len(req.input_logprobs):
            token = req.prompt_ids[pos + 1]
            req.input_logprobs.append(float(row[token]))
            if k:
                vals, ids = row.topk(k)
                req.input_top_logprobs.append(list(zip(vals.tolist(), ids.tolist(), strict=True)))
            if wanted:
                req.input_token_ids_logprobs.append(row[wanted].tolist())


def logprob_meta(req: Req) -> dict[str, Any]:
    """SGLang's logprob entries, (logprob, token id, text) with the text left to the server.

    Input entries start at logprob_start_len (the first is None at position 0: nothing
    predicts it); with logprob_start_len -1 the input lists are empty, as in SGLang.
    """
    lp = req.logprob
    meta: dict[str, Any] = {
        "output_token_logprobs": [
            (v, t, None) for v, t in zip(req.output_logprobs, req.output_ids, strict=False)
        ],
        "output_token_logprobs_length": min(len(req.output_logprobs), len(req.output_ids)),
        "input_token_logprobs": [],
    }
    if lp.top_logprobs_num:
        meta["output_top_logprobs"] = [
            [(v, t, None) for v, t in row] for row in req.output_top_logprobs
        ]
        meta["input_top_logprobs"] = []
    if lp.token_ids:
        meta["output_token_ids_logprobs"] = [
            [(v, t, None) for v, t in zip(row, lp.token_ids, strict=True)]
            for row in req.output_token_ids_logprobs
        ]
        meta["input_token_ids_logprobs"] = []
    if lp.logprob_start_len < 0:
        return meta
    start = min(lp.logprob_start_len, len(req.prompt_ids) - 1)
    ids = req.prompt_ids[start:]
    meta["input_token_logprobs"] = [
        (v, t, None) for v, t in zip(req.input_logprobs, ids, strict=False)
    ]
    if lp.top_logprobs_num:
        meta["input_top_logprobs"] = [
            None if row is None else [(v, t, None) for v, t in row]
            for row in req.input_top_logprobs
        ]
    if lp.token_ids:
        meta["input_token_ids_logprobs"] = [
            None if row is None else [(v, t, None) for v, t in zip(row, lp.token_ids, strict=True)]
            for row in req.input_token_ids_logprobs
        ]
    return meta
