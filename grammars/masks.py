"""Allowed-token masks: a vectorized walk of the token trie through a byte automaton.

The walk goes one trie depth at a time. Its frontier is the set of (trie node, automaton
state) pairs still alive; the children of every frontier node are gathered with numpy and
stepped together, and dead pairs drop out with their whole subtree. A token is allowed when
its trie node is reached alive. Cost is proportional to the live part of the trie, never a
Python loop over the vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from .automaton import ByteAutomaton
from .tokenizer_index import TokenizerIndex


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An int32 [batch, ceil(vocab_size/32)] bitmask with every token allowed (xgrammar layout)."""
    if batch < 1 or vocab_size < 1:
        raise ValueError(f"batch ({batch}) and vocab_size ({vocab_size}) must be positive")
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def alive_nodes(index: TokenizerIndex, automaton: ByteAutomaton, state: int) -> np.ndarray:
    """bool[num_nodes]: trie nodes whose bytes the automaton can read from `state`."""
    alive = np.zeros(index.num_nodes, dtype=bool)
    root_children = np.arange(index.child_start[0], index.child_start[0] + index.child_count[0])
    row = automaton.row(state)
    states = row[index.byte[root_children]]
    nodes = root_children
    while True:
        keep = states >= 0
        nodes, states = nodes[keep], states[keep]
        if nodes.size == 0:
            break
        alive[nodes] = True
        counts = index.child_count[nodes]
        has = counts > 0
        nodes, states, counts = nodes[has], states[has], counts[has]
        if nodes.size == 0:
            break
        ends = np.cumsum(counts)
        offsets = np.repeat(index.child_start[nodes] - (ends - counts), counts)
        nodes = np.arange(int(ends[-1])) + offsets
        parents = np.repeat(states, counts)
        states = automaton.step_many(parents, index.byte[nodes])
    return alive


def compute_mask(index: TokenizerIndex, automaton: ByteAutomaton, state: int) -> np.ndarray:
    """Packed int32[num_words] mask of the tokens allowed in `state` (EOS when accepting)."""
    alive = alive_nodes(index, automaton, state)
    allowed = np.zeros(index.num_words * 32, dtype=bool)
    allowed[index.valid_ids] = alive[index.valid_nodes]
    if automaton.is_accepting(state):
        allowed[list(index.eos_ids)] = True
    return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)
