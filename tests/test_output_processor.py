"""OutputProcessor.process on hand-made logits: no model, no scheduler, no engine thread.

Each test builds requests the way the engine does (RequestBuilder), plans the step's logit
rows, commits the fed tokens' KV as a forward would, and checks what `process` returns and
what it did to the requests against references computed from the same logits.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_tokenizer

from radixflow.runtime.constrained import GrammarService
from radixflow.runtime.io_struct import FinishReason, InputLimits
from radixflow.runtime.layers.token_bitmask import choose_token_bitmask
from radixflow.runtime.output_processor import LogitRows, OutputProcessor, StepOutcome
from radixflow.runtime.request import Req
from radixflow.runtime.request_builder import RequestBuilder
from radixflow.runtime.sampler import Sampler
from radixflow.runtime.scheduler import ScheduledStep
from radixflow.runtime.speculative import NgramProposer, SpecState, Speculator

CONTEXT = 64
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def grammars(tok):
    service = GrammarService(tok, len(tok), {tok.eos_token_id}, timeout=10.0)
    yield service
    service.shutdown()


@pytest.fixture(scope="module")
def builder(tok, grammars):
    limits = InputLimits(len(tok), CONTEXT, CONTEXT)
    return RequestBuilder(tok, limits, {tok.eos_token_id}, grammars)


def _processor(tok, grammars, speculator=None, jump_forward=False) -> OutputProcessor:
    return OutputProcessor(
        sampler=Sampler(seed=0),
        grammars=grammars,
        speculator=speculator,
        tokenizer=tok,
        eos_token_ids={tok.eos_token_id},
        vocab_size=len(tok),
        context_length=CONTEXT,
        jump_forward=jump_forward,
    )


def _speculator(tok) -> Speculator:
    """Greedy verification of up to 3 drafts (the tests set each request's drafts)."""
    return Speculator(
        NgramProposer(),
        num_tokens=3,
        max_batch=8,
        sampler=Sampler(seed=0),
        vocab_size=len(tok),
        context_length=CONTEXT,
        token_bitmask=choose_token_bitmask("cpu"),
    )


def _req(builder, prompt: list[int], params: dict, **options) -> Req:
    args = dict(
        return_logprob=False,
        logprob_start_len=None,
        top_logprobs_num=None,
        stream=False,
        rid=None,
        token_ids_logprob=None,
    )
    args.update(options)
    inp = builder.input(None, {**GREEDY, **params}, prompt, **args)
    (req,) = builder.reqs(inp)
    for r, compiled in builder.compile_grammars([req]):
        r.grammar = compiled.result().matcher()
    return req


def _peaked(rows: int, vocab: int, tokens: list[int]) -> torch.Tensor:
    """Random logits whose row i peaks at tokens[i] (every row when one token is given)."""
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, vocab, generator=g)
    for i in range(rows):
        logits[i, tokens[i % len(tokens)]] = 20.0
    return logits


def _run(
    processor: OutputProcessor, reqs: list[Req], lens: list[int], logits_for
) -> tuple[StepOutcome, LogitRows, torch.Tensor]:
    """One step: plan the rows, 'forward' (logits_for(rows) gives them), commit, process."""
    step = ScheduledStep(reqs, lens, torch.zeros(sum(lens), dtype=torch.int64))
    rows = LogitRows.plan(step)
    logits = logits_for(rows)
    assert logits.shape[0] == rows.indices.numel()
    for req, n in zip(reqs, lens, strict=True):
        req.kv.length += n  # what the cache manager's commit records after a forward
    return processor.process(step, rows, logits), rows, logits


def _decode(processor, req: Req, token: int) -> StepOutcome:
    """A step of one request (its prompt, or one decode token) whose sampled row peaks at
    `token`."""
    vocab = processor.vocab_size
    outcome, _, _ = _run(processor, [req], [req.remaining], lambda r: _peaked(1, vocab, [token]))
    return outcome


def test_eos_and_max_new_tokens_finish_others_stream_or_wait(tok, grammars, builder):
    proc = _processor(tok, grammars)
    eos, other = tok.eos_token_id, 7
    ends = _req(builder, [5, 6, 7], {"max_new_tokens": 8})
    short = _req(builder, [5, 6], {"max_new_tokens": 1})
    streams = _req(builder, [9, 10, 11, 12], {"max_new_tokens": 8}, stream=True)
    waits = _req(builder, [13], {"max_new_tokens": 8})
    ignores = _req(builder, [14, 15], {"max_new_tokens": 8, "ignore_eos": True})
    reqs = [ends, short, streams, waits, ignores]
    picks = [eos, other, other, other, eos]
    outcome, rows, logits = _run(
        proc, reqs, [len(r.prompt_ids) for r in reqs], lambda r: _peaked(5, len(tok), picks)
    )
    assert rows.sample_reqs == [0, 1, 2, 3, 4]
    assert [r.output_ids for r in reqs] == [[p] for p in picks]
    assert outcome.finished == [(ends, FinishReason.stop(eos)), (short, FinishReason.limit(1))]
    assert outcome.streamed == [streams]
    assert not outcome.stats
    for r in reqs:  # the newest token is the only one without KV
        assert r.kv.length == r.fill_len - 1


def test_stop_string_finishes_on_the_token_that_completes_it(tok, grammars, builder):
    proc = _processor(tok, grammars)
    text = " quick brown fox"
    ids = tok.encode(text)
    req = _req(builder, [5, 6], {"max_new_tokens": 32, "stop": ["brown"]})
    finished_at = None
    for i, token in enumerate(ids):  # the prompt's step first, then one decode step per token
        outcome = _decode(proc, req, token)
        assert not outcome.streamed  # not a streaming request
        if outcome.finished:
            finished_at = i
            break
    expected = next(i for i in range(len(ids)) if "brown" in tok.decode(ids[: i + 1]))
    assert finished_at == expected
    assert outcome.finished == [(req, FinishReason.stop("brown"))]


def test_prefill_only_finishes_with_length_zero_and_scores_the_prompt(tok, grammars, builder):
    proc = _processor(tok, grammars)
    prompt = [5, 9, 17, 33, 2]
    req = _req(
        builder,
        prompt,
        {"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        token_ids_logprob=[3, 4],
    )
    outcome, rows, logits = _run(
        proc, [req], [len(prompt)], lambda r: torch.randn(r.indices.numel(), len(tok))
    )
    assert outcome.finished == [(req, FinishReason.limit(0))]
    assert req.output_ids == []
    ref = torch.log_softmax(logits[rows.input_rows_flat], dim=-1)
    assert req.input_logprobs[0] is None
    expected = [ref[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
    assert req.input_logprobs[1:] == pytest.approx(expected)
    top = [[t for _, t in row] for row in req.input_top_logprobs[1:]]
    assert top == [ref[i].topk(2).indices.tolist() for i in range(len(prompt) - 1)]
    assert req.input_token_ids_logprobs[1:] == [ref[i, [3, 4]].tolist() for i in range(4)]


def test_output_logprobs_match_log_softmax_of_the_logits(tok, grammars, builder):
    proc = _processor(tok, grammars)
    req = _req(
        builder,
        [5, 6, 7],
        {"max_new_tokens": 4},
        return_logprob=True,
        top_logprobs_num=3,
        token_ids_logprob=[2, 8],
    )
    plain = _req(builder, [8, 9], {"max_new_tokens": 4})
    outcome, rows, logits = _run(
        proc, [req, plain], [3, 2], lambda r: _peaked(2, len(tok), [40, 41])
    )
    ref = torch.log_softmax(logits[0], dim=-1)
    assert req.output_ids == [40] and plain.output_ids == [41]
    assert req.output_logprobs == pytest.approx([ref[40].item()])
    assert [t for _, t in req.output_top_logprobs[0]] == ref.topk(3).indices.tolist()
    assert req.output_token_ids_logprobs[0] == pytest.approx(ref[[2, 8]].tolist())
    assert plain.output_logprobs == []  # only the requests that ask get logprobs
    meta = proc.output(req)["meta_info"]
    assert meta["output_token_logprobs"] == [(req.output_logprobs[0], 40, None)]
    assert meta["completion_tokens"] == 1 and meta["finish_reason"] is None


def test_grammar_refusal_aborts_only_its_request(tok, grammars, builder):
    proc = _processor(tok, grammars)
    bad = _req(builder, [5, 6], {"max_new_tokens": 4, "regex": "ab"})
    good = _req(builder, [5, 6], {"max_new_tokens": 4})
    allowed = {t for t in range(len(tok)) if tok.decode([t]) and "ab".startswith(tok.decode([t]))}

    def logits_for(rows):
        logits = _peaked(2, len(tok), [30])
        logits[0, sorted(allowed)] = float("-inf")  # no token the grammar allows can be sampled
        return logits

    outcome, _, _ = _run(proc, [bad, good], [2, 2], logits_for)
    ((req, reason),) = outcome.finished
    assert req is bad and reason.kind == "abort"
    assert "no token satisfies the grammar" in reason.message
    assert bad.output_ids == [] and bad.grammar.num_accepted == 0
    assert good.output_ids == [30]


def test_grammar_masks_the_sample_and_jump_forward_completes_it(tok, grammars, builder):
    proc = _processor(tok, grammars, jump_forward=True)
    text = "The quick brown fox"
    req = _req(builder, [5, 6], {"max_new_tokens": 32, "regex": text})
    outcome, _, _ = _run(proc, [req], [2], lambda r: _peaked(1, len(tok), [30]))
    assert tok.decode(req.output_ids) == text
    assert outcome.finished == [(req, FinishReason.stop(None))]
    assert outcome.stats["jump_forward_tokens"] == len(req.output_ids) - 1
    assert req.kv.length == req.fill_len - len(req.output_ids)  # forced tokens still to feed


def test_a_lone_row_is_masked_and_adjusted_without_writing_the_forwards_logits(
    tok, grammars, builder
):
    """The forward's logits are an inference tensor with exactly the sampled rows in a batch-1
    decode step: a grammar must still mask its row and the sampler apply bias and penalties,
    and neither may write the forward's tensor."""
    proc = _processor(tok, grammars)
    text = "The quick brown fox"
    constrained = _req(builder, [5, 6], {"max_new_tokens": 32, "regex": text})
    params = {"max_new_tokens": 4, "logit_bias": {31: 50.0}, "repetition_penalty": 1.5}
    adjusted = _req(builder, [5, 6], params)
    plain = _req(builder, [5, 6], {"max_new_tokens": 4})
    for req, check in (
        (constrained, lambda ids: text.startswith(tok.decode(ids)) and ids != [30]),
        (adjusted, lambda ids: ids == [31]),
        (plain, lambda ids: ids == [30]),
    ):
        with torch.inference_mode():
            forward_logits = _peaked(1, len(tok), [30])
        before = forward_logits.clone()
        _run(proc, [req], [2], lambda r, logits=forward_logits: logits)
        assert check(req.output_ids), req.output_ids
        assert torch.equal(forward_logits, before)


def test_verify_appends_accepted_drafts_and_the_correction(tok, grammars, builder):
    proc = _processor(tok, grammars, speculator=_speculator(tok))
    req = _req(builder, [5, 6, 7], {"max_new_tokens": 16})
    _run(proc, [req], [3], lambda r: _peaked(1, len(tok), [20]))
    req.spec = SpecState(k=3, accepted_avg=3.0)
    req.draft_ids = [21, 22, 23]
    # The target agrees with the first draft, then prefers 40 over the second.
    outcome, rows, _ = _run(proc, [req], [4], lambda r: _peaked(4, len(tok), [21, 40, 23, 24]))
    assert rows.sample_rows == [0] and rows.indices.tolist() == [0, 1, 2, 3]
    assert req.output_ids == [20, 21, 40]
    assert req.draft_ids == []
    assert req.kv.length == req.fill_len - 1  # the rejected drafts' KV is dropped
    assert dict(outcome.stats) == {
        "spec_verify_steps": 1,
        "spec_draft_tokens": 3,
        "spec_accepted_tokens": 1,
    }
    assert (req.sample_steps, req.sampled_tokens) == (2, 3)
    assert proc.output(req)["meta_info"]["spec_accept_length"] == 1.5
    assert outcome.finished == [] and outcome.streamed == []


def test_verify_stops_at_eos_inside_the_accepted_drafts(tok, grammars, builder):
    proc = _processor(tok, grammars, speculator=_speculator(tok))
    eos = tok.eos_token_id
    req = _req(builder, [5, 6, 7], {"max_new_tokens": 16})
    _run(proc, [req], [3], lambda r: _peaked(1, len(tok), [20]))
    req.spec = SpecState(k=3, accepted_avg=3.0)
    req.draft_ids = [21, eos, 23]
    outcome, _, _ = _run(proc, [req], [4], lambda r: _peaked(4, len(tok), [21, eos, 23, 24]))
    assert req.output_ids == [20, 21, eos]  # truncated at the first finish
    assert outcome.finished == [(req, FinishReason.stop(eos))]
