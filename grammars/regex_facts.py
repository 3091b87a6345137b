"""Facts about regex IR nodes the lazy NFA needs before it looks inside them.

`dead(node)`: the node matches nothing (so the NFA leaves it out, and every NFA state can
reach acceptance); `nullable(node)`: it matches the empty word. Nodes carry both from their
construction (`regex_ir`'s `facts`); where a node does not (under a `Ref`, a repeat with
max < min, a `Dfa` whose length window needs its suffix lengths), one iterative pass over the
part of the DAG below it without facts computes them (no recursion, however deep the IR),
memoized by node identity (the memo keeps the nodes alive, so ids stay unique) and written
back onto the nodes.

`counted(repeat)` is the repeat as a counter: (body, lo, hi) with a body that cannot match
the empty word, so that a count moves only when text is read. `x{m,n}` with a nullable `x`
is `x'{0,n}`, where `x'` is x without the empty word (`_non_empty`, built once per node).
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable

from .regex_ir import EMPTY, Alt, Dfa, Ref, Repeat, Seq, fold, set_facts

_CHECK_EVERY = 1024  # nodes between clock checks


def _known(node) -> tuple[object, bool, bool] | None:
    got = getattr(node, "facts", None)
    return None if got is None else (node, *got)


def _weak_clock(check: Callable[[], None]) -> Callable[[], None]:
    """`check`, holding its object weakly if it is a bound method: the owner of an `IrFacts`
    (the NFA) passes its own method, and a strong reference would be a cycle, so that a
    dropped NFA (a temporary automaton of a compile) and all it holds would wait for a full
    collection instead of going when its last reference does."""
    if not isinstance(check, types.MethodType):
        return check
    ref = weakref.WeakMethod(check)

    def clock() -> None:
        method = ref()
        if method is not None:
            method()

    return clock


class IrFacts:
    """Memoized `dead`/`nullable` of IR nodes and the counter form of repeats."""

    def __init__(self, check: Callable[[], None]):
        self._check = _weak_clock(check)  # the clock, called every _CHECK_EVERY new nodes
        # id -> (node, dead, nullable), of nodes without facts of their own
        self._facts: dict[int, tuple[object, bool, bool]] = {}
        self._counted: dict[int, tuple[object, object, int, int | None]] = {}
        self._non_empty: dict[int, tuple[object, object]] = {}
        self._seen = 0  # nodes whose facts were computed here

    def containers(self) -> list:
        """The dicts these facts alone hold (see `reaper`)."""
        return [self._facts, self._counted, self._non_empty]

    def dead(self, node) -> bool:
        return self._of(node)[0]

    def nullable(self, node) -> bool:
        return self._of(node)[1]

    def _of(self, root) -> tuple[bool, bool]:
        got = getattr(root, "facts", None)
        if got is not None:
            return got
        got = self._facts.get(id(root)) or fold(root, self._facts, self._fact, self._tick, _known)
        return got[1], got[2]

    def _tick(self) -> None:
        self._seen += 1
        if self._seen % _CHECK_EVERY == 0:
            self._check()

    def _fact(self, node, kids: list) -> tuple[object, bool, bool]:
        """(node, dead, nullable) of a node from its children's, also kept on the node."""
        if isinstance(node, Dfa):
            dead = not node.table.live(node.start, 0, node.lo, node.hi, self._check)
            nullable = node.nullable
        elif isinstance(node, Seq):
            dead, nullable = any(k[1] for k in kids), all(k[2] for k in kids)
        elif isinstance(node, Alt):
            dead, nullable = all(k[1] for k in kids), any(k[2] and not k[1] for k in kids)
        elif isinstance(node, Ref):
            raise ValueError(f"rule reference {node.name!r} inside a regular expression")
        elif not isinstance(node, Repeat):
            raise TypeError(f"not a regex IR node: {node!r}")
        elif node.hi is not None and node.hi < node.lo:
            raise ValueError(f"repeat with max {node.hi} < min {node.lo}")
        else:
            (_item, item_dead, item_nullable) = kids[0]
            dead, nullable = node.lo > 0 and item_dead, node.lo == 0 or item_nullable
        set_facts(node, dead, nullable)
        return node, dead, nullable

    def counted(self, node: Repeat) -> tuple[object, int, int | None]:
        """(body, lo, hi) of `node` as a counter; body None when it can only read nothing."""
        got = self._counted.get(id(node))
        if got is None:
            body, lo = node.item, node.lo
            if self.nullable(body):
                body, lo = self._without_empty(body), 0
            got = self._counted[id(node)] = (node, None if self.dead(body) else body, lo, node.hi)
        return got[1:]

    def _without_empty(self, node):
        """IR for the words of `node` but the empty one."""
        hit = self._non_empty.get(id(node))
        if hit is not None:
            return hit[1]
        if not self.nullable(node):
            out = node
        elif isinstance(node, Seq):
            # All items are nullable: the first one that reads something may be any of them.
            options, tail = [], EMPTY
            for item in reversed(node.items):
                options.append(Seq((self._without_empty(item), tail)))
                tail = Seq((item, tail))
            out = Alt(tuple(options))
        elif isinstance(node, Alt):
            out = Alt(tuple(self._without_empty(i) for i in node.items))
        elif isinstance(node, Repeat):
            body = self.counted(node)[0]
            if body is None or node.hi == 0:
                out = Alt(())  # matches nothing
            else:
                more = None if node.hi is None else node.hi - 1
                out = Seq((body, Repeat(body, 0, more)))
        else:
            out = Dfa(node.table, node.start, 1, node.hi, node.spell)
        self._non_empty[id(node)] = (node, out)
        return out
