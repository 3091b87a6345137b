"""RadixCache against a plain reference: a list of the live sequences and the slots they own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixflow.runtime.radix_cache import RadixCache, TreeNode


class FakePool:
    """Records every slot the cache hands back; a slot freed twice fails at once."""

    def __init__(self) -> None:
        self.freed: set[int] = set()

    def free(self, slots: torch.Tensor) -> None:
        assert slots.dtype == torch.int64
        for s in slots.tolist():
            assert s not in self.freed, f"slot {s} freed twice"
            self.freed.add(s)


def tree_slots(cache: RadixCache) -> list[int]:
    out: list[int] = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        out += node.value.tolist()
        stack.extend(node.children.values())
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class Pending:
    """A request between match_prefix (its prefix locked) and insert."""

    ids: list[int]
    slots: torch.Tensor  # the matched prefix's slots
    node: TreeNode


class RadixMachine(RuleBasedStateMachine):
    """Plays the scheduler: requests match and lock, later insert, free duplicates, unlock."""

    page_size = 1
    disable = False

    def __init__(self) -> None:
        super().__init__()
        self.pool = FakePool()
        self.cache = RadixCache(self.pool.free, page_size=self.page_size, disable=self.disable)
        self.live: list[tuple[list[int], list[int]]] = []  # reference: (ids, slots) cached
        self.pending: list[Pending] = []
        self.next_slot = 0
        self.handed: set[int] = set()  # fresh slots ever passed to insert
        self.dupes: set[int] = set()  # slots the caller freed itself after insert

    # -- reference ---------------------------------------------------------------------------
    def aligned(self, n: int) -> int:
        return n - n % self.page_size

    def expected_match(self, ids: list[int]) -> list[int]:
        ids = ids[: self.aligned(len(ids))]
        best: list[int] = []
        for seq, slots in self.live:
            n = self.aligned(common_prefix(ids, seq))
            if n > len(best):
                best = slots[:n]
        return best

    def draw_ids(self, data: st.DataObject) -> list[int]:
        base: list[int] = []
        if self.live and data.draw(st.booleans(), label="extend a live sequence"):
            seq = data.draw(st.sampled_from([s for s, _ in self.live]))
            base = seq[: data.draw(st.integers(0, len(seq)))]
        tail = data.draw(st.lists(st.integers(0, 3), max_size=2 * self.page_size + 3))
        return base + tail

    def check_match(self, ids: list[int]) -> Pending:
        m = self.cache.match_prefix(ids)
        assert m.slots.dtype == torch.int64
        assert m.slots.tolist() == self.expected_match(ids)
        assert (m.last_node is self.cache.root) == (m.slots.numel() == 0)
        return Pending(ids, m.slots, m.last_node)

    # -- rules -------------------------------------------------------------------------------
    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        self.check_match(self.draw_ids(data))

    @rule(data=st.data())
    def start_request(self, data: st.DataObject) -> None:
        req = self.check_match(self.draw_ids(data))
        self.cache.lock(req.node)
        self.pending.append(req)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        req = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        matched = req.slots.numel()
        fresh = list(range(self.next_slot, self.next_slot + len(req.ids) - matched))
        self.next_slot += len(fresh)
        self.handed |= set(fresh)
        slots = torch.cat([req.slots, torch.tensor(fresh, dtype=torch.int64)])
        end = self.aligned(len(req.ids))
        expected_present = end if self.disable else len(self.expected_match(req.ids))

        present = self.cache.insert(req.ids, slots)

        assert present == expected_present
        assert present >= matched  # the locked prefix is still there
        self.dupes |= set(slots[matched:present].tolist()) | set(slots[end:].tolist())
        if not self.disable and end:
            owned = self.expected_match(req.ids)[:present] + slots[present:end].tolist()
            self.live.append((req.ids[:end], owned))
        self.cache.unlock(req.node)

    @rule(num_tokens=st.integers(0, 40))
    def evict(self, num_tokens: int) -> None:
        before_size = self.cache.evictable_size()
        before_freed = set(self.pool.freed)
        got = self.cache.evict(num_tokens)
        newly = self.pool.freed - before_freed
        assert got == len(newly)
        assert min(num_tokens, before_size) <= got <= before_size
        for i, (seq, slots) in enumerate(self.live):
            keep = next((j for j, s in enumerate(slots) if s in newly), len(slots))
            self.live[i] = (seq[:keep], slots[:keep])
        self.live = [entry for entry in self.live if entry[0]]
        for req in self.pending:  # locked prefixes survive every eviction
            assert not set(req.slots.tolist()) & newly
            assert self.cache.match_prefix(req.ids[: req.slots.numel()]).slots.equal(req.slots)

    @precondition(lambda self: not any(req.slots.numel() for req in self.pending))
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.live = []

    @precondition(lambda self: any(req.slots.numel() for req in self.pending))
    @rule()
    def reset_while_locked(self) -> None:
        with pytest.raises(RuntimeError, match="locked"):
            self.cache.reset()

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def sizes_match_recount(self) -> None:
        evictable, protected = self.cache.evictable_size(), self.cache.protected_size()
        assert (evictable, protected) == self.cache._recount()
        assert evictable + protected == self.cache.total_size() == len(tree_slots(self.cache))
        locked = set()
        for req in self.pending:
            locked |= set(req.slots.tolist())
        assert protected == len(locked)

    @invariant()
    def every_slot_owned_once(self) -> None:
        held = tree_slots(self.cache)
        assert len(held) == len(set(held))
        assert set(held) == {s for _, slots in self.live for s in slots}
        assert not set(held) & self.pool.freed
        assert not self.dupes & self.pool.freed
        assert set(held) | self.pool.freed == self.handed - self.dupes


MACHINE_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class RadixPage1(RadixMachine):
    page_size = 1


class RadixPage4(RadixMachine):
    page_size = 4


class RadixDisabled(RadixMachine):
    page_size = 4
    disable = True


TestRadixPage1 = RadixPage1.TestCase
TestRadixPage1.settings = MACHINE_SETTINGS
TestRadixPage4 = RadixPage4.TestCase
TestRadixPage4.settings = settings(MACHINE_SETTINGS, max_examples=100)  # page hits are rarer
TestRadixDisabled = RadixDisabled.TestCase
TestRadixDisabled.settings = settings(MACHINE_SETTINGS, max_examples=20)


# -- focused cases ---------------------------------------------------------------------------
def make(page_size: int = 1) -> tuple[RadixCache, FakePool]:
    pool = FakePool()
    return RadixCache(pool.free, page_size=page_size), pool


def test_split_keeps_the_longer_sequence():
    cache, _ = make()
    a, b, c, d, x, y = range(6)
    assert cache.insert([a, b, c, d], torch.tensor([10, 11, 12, 13])) == 0
    m = cache.match_prefix([a, b, x, y])
    assert m.slots.tolist() == [10, 11]
    assert m.last_node.key.tolist() == [a, b]
    assert [n.key.tolist() for n in m.last_node.children.values()] == [[c, d]]
    assert cache.match_prefix([a, b, c, d]).slots.tolist() == [10, 11, 12, 13]
    assert cache.total_size() == 4
    assert cache.pretty_print().splitlines()[1:] == [
        "  [0, 1] len=2 lock=0",
        "    [2, 3] len=2 lock=0",
    ]


def test_page_size_matches_whole_pages_only():
    cache, _ = make(page_size=4)
    ids = list(range(12))
    assert cache.insert(ids + [99], torch.arange(100, 113)) == 0
    assert cache.total_size() == 12  # the partial last page is not cached
    probe = ids[:6] + [77] + ids[7:]  # diverges inside the second page
    assert cache.match_prefix(probe).slots.tolist() == [100, 101, 102, 103]
    assert cache.match_prefix(ids[:7]).slots.tolist() == [100, 101, 102, 103]
    assert cache.match_prefix(ids).slots.tolist() == list(range(100, 112))
    assert cache.insert(probe, torch.arange(200, 212)) == 4
    assert cache.match_prefix(probe).slots.tolist() == [100, 101, 102, 103, *range(204, 212)]


def test_evicts_least_recently_used_leaf_first():
    cache, pool = make()
    cache.insert([1, 1], torch.tensor([0, 1]))
    cache.insert([2, 2], torch.tensor([2, 3]))
    cache.insert([3, 3], torch.tensor([4, 5]))
    cache.match_prefix([1, 1])
    assert cache.evict(1) == 2
    assert pool.freed == {2, 3}
    assert cache.evict(2) == 2
    assert pool.freed == {2, 3, 4, 5}
    assert cache.match_prefix([1, 1]).slots.tolist() == [0, 1]


def test_parent_becomes_candidate_after_its_children():
    cache, pool = make()
    cache.insert([1, 2, 3], torch.tensor([0, 1, 2]))
    cache.insert([1, 2, 4], torch.tensor([5, 6, 7]))
    assert cache.evict(2) == 2
    assert pool.freed == {2, 7}
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == [0, 1]
    assert cache.evict(1) == 2
    assert cache.total_size() == 0


def test_locks_pin_and_stale_handles_fail():
    cache, _ = make()
    cache.insert([1, 2, 3, 4], torch.arange(4))
    m = cache.match_prefix([1, 2])
    cache.lock(m.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 2)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).slots.tolist() == [0, 1]
    cache.unlock(m.last_node)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(m.last_node)
    assert cache.evict(100) == 2
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.lock(m.last_node)


def test_reset_frees_everything_unless_locked():
    cache, pool = make()
    cache.insert([1, 2, 3], torch.tensor([7, 8, 9]))
    m = cache.match_prefix([1, 2, 3])
    cache.lock(m.last_node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.unlock(m.last_node)
    cache.reset()
    assert pool.freed == {7, 8, 9}
    assert cache.total_size() == 0
    assert cache.match_prefix([1, 2, 3]).slots.numel() == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_stored_slots_are_int64_copies(dtype):
    cache, _ = make()
    row = torch.tensor([5, 6, 7], dtype=dtype)  # int32 as read from req_to_token
    cache.insert(torch.tensor([1, 2, 3]), row)
    row.fill_(0)  # the request's row is reused later
    slots = cache.match_prefix([1, 2, 3]).slots
    assert slots.dtype == torch.int64
    assert slots.tolist() == [5, 6, 7]


def test_disabled_cache_lead_path_frees_every_slot():
    freed_by_cache: list[torch.Tensor] = []
    cache = RadixCache(freed_by_cache.append, page_size=4, disable=True)
    caller_freed: list[int] = []
    for ids in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], list(range(9))):
        m = cache.match_prefix(ids)
        assert m.slots.numel() == 0 and m.last_node is cache.root
        cache.lock(m.last_node)
        slots = torch.arange(100 * len(ids), 100 * len(ids) + len(ids))
        present = cache.insert(ids, slots)
        end = len(ids) - len(ids) % 4
        caller_freed += slots[m.slots.numel() : present].tolist() + slots[end:].tolist()
        assert sorted(caller_freed[-len(ids) :]) == slots.tolist()
        cache.unlock(m.last_node)
    assert cache.evict(100) == 0 and not freed_by_cache
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (0, 0, 0)


def test_bad_input_is_rejected():
    cache, _ = make()
    with pytest.raises(ValueError, match="one slot per id"):
        cache.insert([1, 2, 3], torch.arange(2))
    with pytest.raises(ValueError, match="1-D"):
        cache.match_prefix([[1, 2]])
    with pytest.raises(ValueError, match="1-D"):
        cache.insert(torch.ones(2, 2, dtype=torch.int64), torch.arange(4))
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict(-1)
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(lambda s: None, page_size=0)
