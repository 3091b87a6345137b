"""Jump-forward decoding: append the text a grammar forces without a decode step per token.

The forced text is joined to the last few output tokens and re-tokenized, so the output ids
stay what the tokenizer itself gives for the text (canonical tokenization): when the new text
changes how the tail tokenizes, the changed tail is rolled back (grammar and KV) and replaced.
The appended tokens are then fed in one extend step, like a prefill chunk. A grammar that
exceeds its budget midway raises `GrammarBudgetExceeded` with the request unchanged but its
matcher failed: the caller aborts the request.
"""

from __future__ import annotations

from typing import Protocol

from radixflow.runtime.request import Req

RETOKENIZE_WINDOW = 8  # output tokens re-tokenized together with the forced text


class Retokenizer(Protocol):
    """What jump-forward needs of a tokenizer (a Hugging Face tokenizer has it)."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def jump_forward(req: Req, tokenizer: Retokenizer) -> int:
    """Extend req.output_ids by its grammar's forced text; returns the net tokens added."""
    grammar = req.grammar
    assert grammar is not None, "jump_forward() of an unconstrained request"
    forced = grammar.forced_text()
    if not forced or not req.output_ids:
        return 0
    window = min(RETOKENIZE_WINDOW, len(req.output_ids))
    tail = req.output_ids[-window:]
    text = tokenizer.decode(tail) + forced
    if "\ufffd" in text:  # the window starts inside a multi-byte character
        return 0
    new = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.decode(new) != text:  # e.g. a tokenizer that adds a prefix space
        return 0
    keep = 0
    while keep < min(len(tail), len(new)) and tail[keep] == new[keep]:
        keep += 1
    drop = window - keep
    first_changed = req.fill_len - drop
    if first_changed < req.kv.tree_len:  # never rewrite KV the radix tree owns
        return 0
    room = req.params.max_new_tokens - (len(req.output_ids) - drop)
    added = new[keep:][:room]
    if len(added) <= drop:
        return 0
    grammar.rollback(drop)
    for i, token in enumerate(added):
        if not grammar.accept(token):
            grammar.rollback(i)
            for old in tail[keep:]:
                grammar.accept(old)
            return 0
    if drop:
        del req.output_ids[-drop:]
        req.detokenizer.reset()
        req.kv.rollback(first_changed)
    req.output_ids.extend(added)
    for token in added:
        req.sampler.observe(token)
    return len(added) - drop
