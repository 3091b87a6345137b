"""Speculative decoding: n-gram prompt-lookup proposals verified losslessly in one forward."""

from radixflow.runtime.speculative.ngram import NgramIndex
from radixflow.runtime.speculative.speculator import SpecState, Speculator, can_speculate
from radixflow.runtime.speculative.verify import verify_greedy, verify_sampled

__all__ = [
    "NgramIndex",
    "SpecState",
    "Speculator",
    "can_speculate",
    "verify_greedy",
    "verify_sampled",
]
