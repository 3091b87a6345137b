"""Interned states' rows: each row stays where it was first written (the native walk reads it
by the address in `pointers`), however many rows follow, and a row whose fill fails is never
served half-written."""

import ctypes

import numpy as np
import pytest

from radixflow.grammars.budget import GrammarBudget
from radixflow.grammars.states import StateRows


def read_at(address: int) -> np.ndarray:
    """The int32[256] at `address`, as the native walk reads it."""
    return np.ctypeslib.as_array((ctypes.c_int32 * 256).from_address(address)).copy()


def fill_with(value_of):
    def fill(state: int, row: np.ndarray) -> None:
        assert (row == -1).all()  # a fresh row: all dead
        row[: state % 256 + 1] = value_of(state)

    return fill


def test_rows_stay_where_their_addresses_say():
    states = StateRows(GrammarBudget(), "things")
    n = 300  # past the first blocks and several full ones, and past the first pointer array
    for s in range(n):
        assert states.intern((s,)) == s
        states.row(s, fill_with(lambda s: s * 7))
    for s in range(n):
        expected = np.full(256, -1, dtype=np.int32)
        expected[: s % 256 + 1] = s * 7
        assert np.array_equal(states.row(s, fill_with(lambda s: -5)), expected)  # kept
        assert np.array_equal(read_at(int(states.pointers[s])), expected)
    assert len({int(p) for p in states.pointers[:n]}) == n


def test_a_failed_fill_leaves_no_half_written_row():
    states = StateRows(GrammarBudget(), "things")
    states.intern(("a",))

    def failing(state: int, row: np.ndarray) -> None:
        row[:10] = 3
        raise RuntimeError("budget")

    with pytest.raises(RuntimeError, match="budget"):
        states.row(0, failing)
    assert states.pointers[0] == 0
    row = states.row(0, fill_with(lambda s: 1))  # the fill asserts a fresh row
    assert row[0] == 1 and (row[1:] == -1).all()
