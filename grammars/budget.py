"""Per-grammar budgets: the states and memory one grammar may build, the time one call may take.

Automata are built lazily while requests decode, so a pathological regex or an ambiguous
grammar could otherwise do unbounded work on the engine thread. All parts of a grammar share
one `GrammarBudget`: they count the states they build against its limits and charge it the
bytes they keep; each matcher call runs its clock (`with budget:`), and the loops that build
new states check it. Past any limit they raise `GrammarBudgetExceeded`, which fails the
request that made the call and nothing else.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields


class GrammarBudgetExceeded(ValueError):
    """A grammar needs more states, memory or time than its budget; `budget` names the limit."""

    def __init__(self, budget: str, detail: str):
        super().__init__(f"{detail} ({budget})")
        self.budget = budget
        self.detail = detail


JSON_KEY_ORDERS = ("declared", "any")


@dataclass(frozen=True)
class GrammarLimits:
    """What one grammar may build once compiled, and how long one matcher call may work; also
    how deep the values a JSON Schema leaves free may nest (part of the grammar's language).

    The engine's `grammar_<field>` knobs set these (same defaults).
    """

    max_states: int = 100_000  # states of each lazily built automaton (1 KiB row each)
    max_state_size: int = 50_000  # NFA states in one DFA state, elements in one grammar state
    max_earley_items: int = 10_000  # items in one Earley set
    max_chart_items: int = 1_000_000  # items in all of a grammar's Earley sets
    max_mb: float = 128.0  # MiB a grammar's automata may grow by after compilation
    step_timeout: float = 5.0  # seconds of automaton work in one matcher call
    # Arrays/objects a JSON value the schema leaves free may nest. The IR is linear in the
    # depth and the automaton is built as it is walked, so only the depths used cost anything.
    free_value_depth: int = 16
    # An object's members: in `properties` order ("declared", what the peers and OpenAI's
    # structured outputs generate) or in any order ("any", as JSON Schema validates them).
    json_key_order: str = "declared"

    def __post_init__(self) -> None:
        if self.json_key_order not in JSON_KEY_ORDERS:
            raise ValueError(
                f"json_key_order must be one of {', '.join(JSON_KEY_ORDERS)}, "
                f"got {self.json_key_order!r}"
            )
        for f in fields(self):
            if f.name != "json_key_order" and not getattr(self, f.name) > 0:
                raise ValueError(
                    f"grammar limit {f.name} must be positive, got {getattr(self, f.name)}"
                )


class GrammarBudget:
    """A grammar's limits (none until `bind`), its bytes, and the running call's clock."""

    def __init__(self) -> None:
        self.limits: GrammarLimits | None = None
        self.nbytes = 0
        self._cap = math.inf  # nbytes allowed
        self._end = math.inf  # perf_counter() deadline of the running call

    def bind(self, limits: GrammarLimits) -> None:
        """Compilation is over (its own time limit bounds it): hold what follows to `limits`."""
        self.limits = limits
        self._cap = self.nbytes + limits.max_mb * 2**20

    def __enter__(self) -> GrammarBudget:
        if self.limits is not None:
            self._end = time.perf_counter() + self.limits.step_timeout
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = math.inf

    def check_time(self) -> None:
        if time.perf_counter() > self._end:
            raise GrammarBudgetExceeded(
                "step_timeout",
                f"more than {self.limits.step_timeout:g} s of grammar work in one call",
            )

    def limit(self, budget: str) -> float:
        """The value of the limit named `budget` (unbounded before `bind`)."""
        return math.inf if self.limits is None else getattr(self.limits, budget)

    def check(self, budget: str, count: int, what: str) -> None:
        """Raise when `count` (of `what`) is over the limit named `budget`."""
        if count > self.limit(budget):
            raise GrammarBudgetExceeded(budget, f"more than {self.limit(budget)} {what}")

    def charge(self, nbytes: int) -> None:
        """Account for `nbytes` the grammar is about to keep; raise first if over its cap."""
        if self.nbytes + nbytes > self._cap:
            raise GrammarBudgetExceeded(
                "max_mb", f"the grammar grew by more than {self.limits.max_mb:g} MiB"
            )
        self.nbytes += nbytes
