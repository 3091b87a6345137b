"""Proof that `oneOf` branches cannot both hold for one JSON value.

Texts that differ are not enough (`{"a":1,"b":2}` and `{"b":2,"a":1}` are one value), so the
proof used is the JSON type: branches whose generated texts start with disjoint bytes are of
different JSON types (object, array, string, number, true, false, null), hence exclusive.
"""

from __future__ import annotations

import numpy as np

from .automaton import RegexAutomaton
from .nfa import CompileTimeout, Deadline, EmptyLanguage


def check_disjoint(branches: list, where: str, deadline: Deadline) -> None:
    """Raise ValueError unless the `oneOf` branch IRs are pairwise of different JSON types."""
    firsts = []
    for i, branch in enumerate(branches):
        try:
            auto = RegexAutomaton(branch, deadline)
        except EmptyLanguage:
            continue  # a branch that matches nothing overlaps none
        except CompileTimeout:
            raise
        except ValueError:
            raise ValueError(
                f"{where}: oneOf over recursive definitions is not supported"
            ) from None
        firsts.append((i, auto.row(auto.initial) >= 0))
    for a in range(len(firsts)):
        for b in range(a + 1, len(firsts)):
            (i, fa), (j, fb) = firsts[a], firsts[b]
            if np.any(fa & fb):
                raise ValueError(
                    f"{where}: oneOf branches {i} and {j} may overlap (only branches of "
                    "different JSON types are supported); use anyOf if either may match"
                )
