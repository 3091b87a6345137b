"""Sub-schema IR shared across compiles: a sub-schema seen in an earlier request compiles once.

Many requests hold the same sub-schemas (Kubernetes' `ObjectMeta`, the `properties` of a tool's
arguments sent with every call). `SubschemaMemo` numbers schema structures for every compile
in the process (`number`: equal JSON structure, keys in the order written, equal number; what
`SchemaResolver.key` uses) and keeps, by (whitespace pattern, free value depth, whether `$ref`
siblings apply, number), a converted sub-schema's IR with what its conversion read of the
document around it: the `$ref`s it resolved and the numbers of their targets
(`SchemaConverter.convert`). A later compile takes the IR when the same references point at
equal targets in its own document (the conversion is a function of the schema, those targets
and the options), so a sub-schema means the same wherever it is reused. A recursive one is kept
with the grammar rules its IR uses (named by their schemas' numbers; their reads counted), once
the conversion that made the outermost of them is done; conversions inside it that recurse into
it, and conversions that failed, are not kept. Least recently used entries go first past
`max_entries`. IR is immutable (a node is the same language wherever it is used), so requests
share nodes.

The numbering grows with every structure seen; past `max_shapes` the process starts a new
memo (`shared_memo`) and compiles under way keep the one they started with, whose numbers
stay consistent with its entries.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable

MAX_ENTRIES = 4096  # sub-schema IRs kept
MAX_SHAPES = 500_000  # numbered structures before a new memo starts
MAX_MEMO_DEPS = 256  # `$ref`s a kept conversion may read (each is checked on reuse)
MAX_MEMO_READS = 2048  # ... counting repeats (past it they are not even collected)


class SubschemaMemo:
    """Structure numbers and converted sub-schemas: (IR, `$ref` reads) by key (bounded,
    thread-safe)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_shapes: int = MAX_SHAPES):
        if max_entries < 0 or max_shapes <= 0:
            raise ValueError(
                f"memo bounds must be positive, got max_entries={max_entries}, "
                f"max_shapes={max_shapes}"
            )
        self.max_entries = max_entries
        self.max_shapes = max_shapes
        self._shapes: dict[Hashable, int] = {}
        self._next = itertools.count()  # next() is atomic: concurrent compiles get distinct numbers
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def full(self) -> bool:
        """Whether the numbering has reached `max_shapes` (a new memo should start)."""
        return len(self._shapes) >= self.max_shapes

    def number(self, shape: Hashable) -> int:
        """The number of a structure (see `SchemaResolver.key`), the same for every compile."""
        got = self._shapes.get(shape)
        return got if got is not None else self._shapes.setdefault(shape, next(self._next))

    def get(self, key: tuple):
        """What is kept under `key`, or None."""
        with self._lock:
            got = self._entries.get(key)
            if got is not None:
                self._entries.move_to_end(key)
            return got

    def put(self, key: tuple, value) -> None:
        """Keep `value` under `key`, dropping the least recently used past `max_entries`."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


_shared = SubschemaMemo()
_shared_lock = threading.Lock()


def shared_memo() -> SubschemaMemo:
    """The process's memo (a new one once the current one's numbering is full)."""
    global _shared
    with _shared_lock:
        if _shared.full:
            _shared = SubschemaMemo()
        return _shared
