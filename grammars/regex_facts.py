"""Facts about regex IR nodes the lazy NFA needs before it looks inside them.

`dead(node)`: the node matches nothing (so the NFA leaves it out, and every NFA state can
reach acceptance); `nullable(node)`: it matches the empty word. Both come from one iterative
pass over the part of the DAG not seen before (no recursion, however deep the IR), memoized
by node identity (the memo keeps the nodes alive, so ids stay unique). IR that many grammars
share for the whole process has its facts computed once (`remember`).

`counted(repeat)` is the repeat as a counter: (body, lo, hi) with a body that cannot match
the empty word, so that a count moves only when text is read. `x{m,n}` with a nullable `x`
is `x'{0,n}`, where `x'` is x without the empty word (`_non_empty`, built once per node).
"""

from __future__ import annotations

from collections.abc import Callable

from .regex_ir import EMPTY, Alt, Chars, Dfa, Ranges, Ref, Repeat, Seq, fold, utf8_sequences

_CHECK_EVERY = 1024  # nodes between clock checks
_MAX_KNOWN = 100_000  # facts kept for `remember`ed IR, past which they start again

# id -> (node, dead, nullable) of IR that lives for the process (the free JSON values, built
# once per whitespace and depth): every IrFacts starts from a copy, so no compile folds it.
# Replaced, never changed in place, so a copy taken in another thread is whole.
_known: dict[int, tuple[object, bool, bool]] = {}


def remember(root) -> None:
    """Keep the facts of `root` (IR shared by many grammars) for every `IrFacts` made later."""
    global _known
    if len(_known) > _MAX_KNOWN:
        _known = {}
    facts = IrFacts(lambda: None, _no_utf8)  # from what is known already
    facts.dead(root)
    _known = facts._facts


def _no_utf8(ranges: Ranges) -> bool:
    """Whether no code point in `ranges` has a UTF-8 encoding (all of them are surrogates)."""
    return not any(utf8_sequences(lo, hi) for lo, hi in ranges)


class IrFacts:
    """Memoized `dead`/`nullable` of IR nodes and the counter form of repeats."""

    def __init__(self, check: Callable[[], None], empty_chars: Callable[[Ranges], bool]):
        self._check = check  # the clock, called every _CHECK_EVERY new nodes
        self._empty_chars = empty_chars  # whether a code point set has no encodable member
        # id -> (node, dead, nullable)
        self._facts: dict[int, tuple[object, bool, bool]] = dict(_known)
        self._counted: dict[int, tuple[object, object, int, int | None]] = {}
        self._non_empty: dict[int, tuple[object, object]] = {}
        self._seen = 0  # nodes whose facts are known

    def dead(self, node) -> bool:
        return self._of(node)[1]

    def nullable(self, node) -> bool:
        return self._of(node)[2]

    def _of(self, root) -> tuple[object, bool, bool]:
        got = self._facts.get(id(root))
        return got if got is not None else fold(root, self._facts, self._fact, self._tick)

    def _tick(self) -> None:
        self._seen += 1
        if self._seen % _CHECK_EVERY == 0:
            self._check()

    def _fact(self, node, kids: list) -> tuple[object, bool, bool]:
        """(node, dead, nullable) of a node from its children's."""
        if isinstance(node, Chars):
            return node, self._empty_chars(node.ranges), False
        if isinstance(node, Dfa):
            dead = not node.table.live(node.start, 0, node.lo, node.hi, self._check)
            return node, dead, node.nullable
        if isinstance(node, Seq):
            return node, any(k[1] for k in kids), all(k[2] for k in kids)
        if isinstance(node, Alt):
            return node, all(k[1] for k in kids), any(k[2] and not k[1] for k in kids)
        if isinstance(node, Ref):
            raise ValueError(f"rule reference {node.name!r} inside a regular expression")
        if not isinstance(node, Repeat):
            raise TypeError(f"not a regex IR node: {node!r}")
        if node.hi is not None and node.hi < node.lo:
            raise ValueError(f"repeat with max {node.hi} < min {node.lo}")
        (_item, item_dead, item_nullable) = kids[0]
        return node, node.lo > 0 and item_dead, node.lo == 0 or item_nullable

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
