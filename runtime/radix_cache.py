"""RadixAttention prefix cache: a radix tree over token ids whose nodes hold KV slot indices.

    root ─[a b c d]─► A ─[e f g h]─► B        each edge carries a run of token ids (a multiple
                      └─[x y z w]─► C        of page_size) and the KV slots of those tokens;
                                              children are keyed by their first page of ids

All requests share one tree. A request locks the node its cached prefix ends at, which pins that
node and its ancestors; eviction frees the least recently used unlocked leaves through the
pool's `free`. Keys and slots live in int64 tensors (one pair per node, never one object per
token); walking the tree compares whole edges with tensor operations.
"""

from __future__ import annotations

import array
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass(eq=False, slots=True)
class TreeNode:
    """One edge of the tree and the node it leads to (the root has empty key and value)."""

    key: torch.Tensor  # int64 [n]: token ids on the edge into this node, n % page_size == 0
    value: torch.Tensor  # int64 [n]: KV slots of those tokens
    parent: TreeNode | None  # None for the root and for nodes that left the tree
    uid: int  # creation order: breaks LRU ties deterministically
    children: dict[tuple[int, ...], TreeNode] = field(default_factory=dict)
    lock_ref: int = 0  # locks held on this node or any descendant
    last_access: int = 0  # logical clock of the last match/insert through this node


@dataclass
class MatchResult:
    slots: torch.Tensor  # int64 [m]: KV slots of the matched prefix (m page aligned)
    last_node: TreeNode  # node where the match ends (the root when m == 0); lock/unlock it


class RadixCache:
    """Prefix tree of cached token runs -> KV slots, with lock counts and LRU eviction.

    Ownership contract with the caller (the scheduler), one code path for enabled and
    disabled caches::

        m = cache.match_prefix(ids); cache.lock(m.last_node)     # slots[:matched] = m.slots
        ... compute KV for ids[matched:] into the request's own slots ...
        present = cache.insert(ids, slots)                        # len(slots) == len(ids)
        pool.free(slots[matched:present])   # duplicates: another request cached them first
        pool.free(slots[L:])                # L = len(ids) rounded down to page_size
        cache.unlock(m.last_node)

    After insert the tree owns slots[present:L] (and keeps owning the matched prefix); the
    request's slots[matched:present] are freed, so a caller that keeps running re-matches to
    read the tree's slots for those tokens. A disabled cache stores nothing: match_prefix
    returns an empty match at the root and insert returns L, so the same path frees every slot.
    """

    def __init__(
        self,
        pool_free: Callable[[torch.Tensor], None],
        page_size: int = 1,
        disable: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.pool_free = pool_free
        self.page_size = page_size
        self.disable = disable
        self.device = torch.device(device)  # where stored and returned slots live
        self._clock = itertools.count(1)
        self._uids = itertools.count()
        empty = torch.empty(0, dtype=torch.int64)
        self.root = TreeNode(key=empty, value=empty.to(self.device), parent=None, uid=-1)
        self._leaves: set[TreeNode] = set()  # non-root nodes without children
        self._evictable = 0
        self._protected = 0

    # -- lookups ---------------------------------------------------------------------------
    def match_prefix(self, ids: Sequence[int] | torch.Tensor) -> MatchResult:
        """Longest cached prefix of ids, page aligned; splits the node the match ends inside."""
        ids_t = self._as_ids(ids)
        pieces: list[torch.Tensor] = []
        node, _ = self._walk(ids_t, self._aligned(ids_t.numel()), pieces)
        slots = torch.cat(pieces) if pieces else self.root.value.clone()
        return MatchResult(slots=slots, last_node=node)

    def insert(self, ids: Sequence[int] | torch.Tensor, slots: torch.Tensor) -> int:
        """Cache ids[:L] -> slots[:L] (L = len(ids) rounded down to page_size).

        Returns how many leading tokens were already cached; their entries in `slots` are not
        taken (see the class docstring for who frees what). The tree owns slots[returned:L].
        """
        ids_t = self._as_ids(ids)
        if slots.dim() != 1 or slots.numel() != ids_t.numel():
            raise ValueError(
                f"slots must be 1-D with one slot per id: got shape {tuple(slots.shape)} "
                f"for {ids_t.numel()} ids"
            )
        end = self._aligned(ids_t.numel())
        if self.disable:
            return end
        node, pos = self._walk(ids_t, end, None)
        if pos < end:
            value = slots[pos:end].to(device=self.device, dtype=torch.int64, copy=True)
            self._add_leaf(node, ids_t[pos:end].clone(), value)
        return pos

    def _walk(
        self, ids: torch.Tensor, end: int, pieces: list[torch.Tensor] | None
    ) -> tuple[TreeNode, int]:
        """Follow ids[:end] from the root, touching each node passed; return (node, matched).

        Matching (`pieces` given) collects the slots and splits the node the match ends inside.
        Inserting (`pieces` None) splits only where ids diverge inside an edge (a branch grows
        there); ids that end inside an edge add nothing, so that edge stays whole.
        """
        node, pos = self.root, 0
        while pos < end:
            child = node.children.get(self._page_key(ids, pos))
            if child is None:
                break
            n = self._common_len(child.key, ids[pos:end])
            split = n < child.key.numel()
            if split:
                if pieces is None and pos + n == end:
                    child.last_access = next(self._clock)
                    return node, end
                child = self._split(child, n)
            child.last_access = next(self._clock)
            if pieces is not None:
                pieces.append(child.value)
            node, pos = child, pos + n
            if split:
                break
        return node, pos

    def _common_len(self, key: torch.Tensor, ids: torch.Tensor) -> int:
        """Length of the common prefix of key and ids, rounded down to page_size."""
        n = min(key.numel(), ids.numel())
        a, b = key[:n], ids[:n]
        if not torch.equal(a, b):
            n = int(torch.nonzero(a != b)[0, 0])
        return self._aligned(n)

    def _page_key(self, ids: torch.Tensor, pos: int) -> tuple[int, ...]:
        return tuple(ids[pos : pos + self.page_size].tolist())

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _as_ids(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
            return ids.to(device="cpu", dtype=torch.int64)
        try:
            packed = array.array("q", ids)  # a few times faster than torch.as_tensor on lists
        except TypeError as e:
            raise ValueError(f"ids must be a 1-D sequence of int token ids: {e}") from None
        if not packed:
            return self.root.key
        return torch.frombuffer(packed, dtype=torch.int64)

    # -- structure ---------------------------------------------------------------------------
    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut child's edge after n tokens; the new head node takes child's place."""
        parent = child.parent
        assert parent is not None
        head = TreeNode(
            key=child.key[:n].clone(),
            value=child.value[:n].clone(),
            parent=parent,
            uid=next(self._uids),
            lock_ref=child.lock_ref,  # every lock through child passes through head
            last_access=child.last_access,
        )
        # Clones, not views, so evicting one part releases its memory.
        child.key = child.key[n:].clone()
        child.value = child.value[n:].clone()
        child.parent = head
        head.children[self._page_key(child.key, 0)] = child
        parent.children[self._page_key(head.key, 0)] = head
        return head

    def _add_leaf(self, parent: TreeNode, key: torch.Tensor, value: torch.Tensor) -> None:
        leaf = TreeNode(key=key, value=value, parent=parent, uid=next(self._uids))
        leaf.last_access = next(self._clock)
        parent.children[self._page_key(key, 0)] = leaf
        self._leaves.discard(parent)
        self._leaves.add(leaf)
        self._evictable += key.numel()

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        """Detach an unlocked leaf; return its former parent."""
        parent = leaf.parent
        assert parent is not None
        del parent.children[self._page_key(leaf.key, 0)]
        leaf.parent = None
        self._leaves.discard(leaf)
        self._evictable -= leaf.key.numel()
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)
        return parent

    # -- locks -------------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        """Pin node and its ancestors: their tokens are not evicted until unlocked."""
        self._check_in_tree(node)
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= node.key.numel()
                self._protected += node.key.numel()
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Release one lock taken by lock(node)."""
        self._check_in_tree(node)
        if node is not self.root and node.lock_ref == 0:
            raise ValueError("unlock() of a node that is not locked")
        # An ancestor's lock_ref is at least its descendant's, so none drops below zero.
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= node.key.numel()
                self._evictable += node.key.numel()
            assert node.parent is not None
            node = node.parent

    def _check_in_tree(self, node: TreeNode) -> None:
        if node is not self.root and node.parent is None:
            raise ValueError("node is no longer in the cache (evicted or reset)")

    # -- eviction and sizes --------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens (or all evictable ones) from LRU unlocked leaves.

        A parent becomes a candidate once its last child is gone. Returns tokens freed.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be non-negative, got {num_tokens}")
        heap = [(n.last_access, n.uid, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        count = 0
        while count < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            freed.append(leaf.value)
            count += leaf.key.numel()
            parent = self._remove_leaf(leaf)
            if parent in self._leaves and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        if freed:
            self.pool_free(torch.cat(freed))
        return count

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def reset(self) -> None:
        """Drop every node and free all their slots; only allowed while nothing is locked."""
        if self._protected:
            raise RuntimeError(f"reset() with {self._protected} tokens still locked")
        freed = []
        for node in self._nodes():
            freed.append(node.value)
            node.parent = None  # stale handles now fail lock/unlock loudly
        if freed:
            self.pool_free(torch.cat(freed))
        self.root.children.clear()  # the root stays: handles of empty matches remain valid
        self._leaves.clear()
        self._evictable = 0

    def _nodes(self) -> list[TreeNode]:
        """All non-root nodes, parents before children."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _recount(self) -> tuple[int, int]:
        """(evictable, protected) by a full traversal: the slow twin of the kept counters."""
        evictable = protected = 0
        for node in self._nodes():
            if node.lock_ref:
                protected += node.key.numel()
            else:
                evictable += node.key.numel()
        return evictable, protected

    def pretty_print(self) -> str:
        """One line per node, indented by depth: first ids, length, lock count."""
        lines = [f"root total={self.total_size()} evictable={self._evictable}"]
        stack = [(child, 1) for child in reversed(self.root.children.values())]
        while stack:
            node, depth = stack.pop()
            ids = node.key[:8].tolist()
            more = "..." if node.key.numel() > 8 else ""
            lines.append(f"{'  ' * depth}{ids}{more} len={node.key.numel()} lock={node.lock_ref}")
            stack.extend((child, depth + 1) for child in reversed(node.children.values()))
        return "\n".join(lines)
