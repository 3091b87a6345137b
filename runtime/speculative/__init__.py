"""Speculative decoding: drafts from n-gram prompt lookup or a draft model, verified losslessly
in one target forward."""

from radixflow.runtime.speculative.draft import DraftProposer
from radixflow.runtime.speculative.ngram import NgramIndex, NgramProposer
from radixflow.runtime.speculative.proposer import Proposer
from radixflow.runtime.speculative.speculator import (
    SpecState,
    Speculator,
    build_speculator,
    can_speculate,
)
from radixflow.runtime.speculative.verify import verify_greedy, verify_sampled

__all__ = [
    "DraftProposer",
    "NgramIndex",
    "NgramProposer",
    "Proposer",
    "SpecState",
    "Speculator",
    "build_speculator",
    "can_speculate",
    "verify_greedy",
    "verify_sampled",
]
