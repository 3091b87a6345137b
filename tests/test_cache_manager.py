"""CacheManager on a real (small, CPU) KVPool and RadixCache: prefix match and lock, grow,
commit, rollback, release, pins. Every page is accounted for exactly once after each call, and
each request's req_to_token row matches the slots its pages give (the reference layout)."""

from __future__ import annotations

import pytest
import torch

from radixflow.runtime.cache_manager import MAX_PINNED_FRACTION, CacheManager
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams

PAGE = 4


def make_manager(pages: int = 16, page_size: int = PAGE, disable: bool = False) -> CacheManager:
    """A pool of `pages` usable pages (page 0 is reserved) and 4 request rows."""
    pool = KVPool(
        num_layers=1,
        num_pages=pages + 1,
        page_size=page_size,
        num_kv_heads=1,
        head_dim=1,
        dtype=torch.float32,
        device="cpu",
        max_reqs=4,
        max_context=128,
    )
    return CacheManager(pool, disable=disable)


def make_req(rid: str, ids: list[int], max_new: int = 4) -> Req:
    return Req(rid, ids, SamplingParams(max_new_tokens=max_new), sampler=None, detokenizer=None)


def ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def ref_slots(pages: list[int], start: int, n: int, page_size: int = PAGE) -> list[int]:
    """Slot of each position in [start, start + n): its page's base plus the offset in it."""
    return [pages[p // page_size] * page_size + p % page_size for p in range(start, start + n)]


def admit(kv: CacheManager, req: Req, reserve_pages: int = 0) -> bool:
    """What the scheduler does: match all but the last token, attach on that match."""
    return kv.attach(req, kv.match(req.fill_ids(0, req.fill_len - 1)), reserve_pages)


def feed(kv: CacheManager, req: Req, n: int) -> list[int]:
    """One step for the request: grow, the forward (nothing here), commit."""
    loc = kv.grow(req, n)
    assert loc is not None
    kv.commit(req, n)
    return loc.tolist()


def assert_pages_accounted(kv: CacheManager, reqs: list[Req]) -> None:
    """Each usable page is free, the tree's, or one running request's own: exactly one."""
    ps = kv.page_size
    own = [p for r in reqs for p in r.kv.pages[r.kv.tree_len // ps :]]
    assert len(own) == len(set(own))
    tree = kv.cache.total_size() // ps
    assert kv.pool.available() + tree + len(own) == kv.pool.capacity_pages
    for r in reqs:
        row = kv.pool.req_to_token[r.kv.row, : r.kv.length].tolist()
        assert row == ref_slots(r.kv.pages, 0, r.kv.length, ps)


def assert_all_free(kv: CacheManager) -> None:
    assert kv.cache.protected_size() == 0
    kv.flush()
    assert kv.pool.available() == kv.pool.capacity_pages
    assert kv.pool.rows_available() == 4


def test_grow_gives_slots_of_new_pages_and_writes_the_row():
    kv = make_manager()
    req = make_req("a", ids(100, 10))
    assert admit(kv, req)
    assert (req.kv.length, req.kv.tree_len, req.kv.pages, req.cached_tokens) == (0, 0, [], 0)
    loc = kv.grow(req, 10)
    assert loc is not None and len(req.kv.pages) == 3  # ceil(10 / 4)
    assert loc.tolist() == ref_slots(req.kv.pages, 0, 10)
    assert req.kv.length == 0  # nothing is committed before the forward
    assert kv.pool.available() == 13
    kv.commit(req, 10)
    assert_pages_accounted(kv, [req])
    # Decoding: the partial last page fills first, then one new page.
    for token in range(3):
        req.output_ids.append(token)
        feed(kv, req, 1)
    assert len(req.kv.pages) == 4 and req.kv.length == 13
    assert_pages_accounted(kv, [req])
    kv.release(req)
    assert req.kv.row is None and req.kv.pages == [] and req.kv.length == 0
    assert_pages_accounted(kv, [])
    assert_all_free(kv)


def test_commit_of_a_prompt_chunk_hands_its_whole_pages_to_the_tree():
    kv = make_manager()
    first = make_req("first", ids(100, 10))
    admit(kv, first)
    feed(kv, first, 10)
    assert first.kv.tree_len == 8 and kv.cache.protected_size() == 8  # locked for it
    assert_pages_accounted(kv, [first])
    # A second request with the same prompt reads the same slots from the tree.
    second = make_req("second", ids(100, 10))
    assert admit(kv, second)
    assert second.kv.length == second.kv.tree_len == second.cached_tokens == 8
    assert second.kv.pages == first.kv.pages[:2]
    feed(kv, second, 2)
    assert_pages_accounted(kv, [first, second])
    for req in (first, second):
        kv.release(req)
    assert kv.cache.total_size() == 8  # the partial pages were freed, not cached
    assert_all_free(kv)


def test_an_extend_past_the_prompt_is_not_cached_before_release():
    kv = make_manager()
    req = make_req("a", ids(100, 6))
    admit(kv, req)
    feed(kv, req, 6)
    assert req.kv.tree_len == 4
    req.output_ids += [1, 2, 3, 4, 5]  # e.g. jump-forward appended tokens
    feed(kv, req, 5)
    assert req.kv.tree_len == 4 and kv.cache.total_size() == 4
    assert_pages_accounted(kv, [req])
    kv.release(req)
    assert kv.cache.total_size() == 8  # 11 tokens: two whole pages
    assert_all_free(kv)


def test_rollback_reuses_the_request_pages_for_the_next_tokens():
    kv = make_manager()
    req = make_req("a", ids(100, 5))
    admit(kv, req)
    feed(kv, req, 5)
    req.output_ids.append(1)
    req.draft_ids = [2, 3, 4]
    feed(kv, req, 4)  # the last token and three drafts: K/V for positions 5..8
    pages = list(req.kv.pages)
    assert req.kv.length == 9 and len(pages) == 3
    req.draft_ids = []
    req.output_ids.append(9)  # only the first draft was wrong: the target emitted 9
    req.kv.rollback(req.fill_len - 1)
    assert req.kv.length == 6
    assert feed(kv, req, 1) == ref_slots(pages, 6, 1)  # rewrites the rejected draft's slot
    assert req.kv.pages == pages
    assert_pages_accounted(kv, [req])
    req.kv.rollback(10)  # past its length: nothing changes
    assert req.kv.length == 7
    kv.release(req)
    assert_all_free(kv)


def test_rollback_never_reaches_into_the_tree_part():
    # A page-aligned prompt is cached whole by its commit; a refused first token then rolls
    # back below it. The tree's pages must stay the tree's (not freed by the release).
    kv = make_manager()
    req = make_req("a", ids(100, 8))
    admit(kv, req)
    feed(kv, req, 8)
    assert req.kv.tree_len == 8
    req.kv.rollback(req.fill_len - 1)
    assert req.kv.length == 8
    kv.release(req)
    assert_pages_accounted(kv, [])
    assert kv.cache.total_size() == 8
    assert_all_free(kv)


def test_release_frees_own_pages_duplicating_what_another_request_cached():
    kv = make_manager()
    a, b = make_req("a", ids(100, 9)), make_req("b", ids(100, 9))
    admit(kv, a)
    admit(kv, b)  # both before either computed anything: no sharing
    feed(kv, a, 9)
    assert_pages_accounted(kv, [a, b])
    feed(kv, b, 9)  # b's chunk duplicates a's cached pages: b switches to the tree's copy
    assert b.kv.pages[:2] == a.kv.pages[:2]
    assert_pages_accounted(kv, [a, b])
    kv.release(a)
    kv.release(b)
    assert kv.cache.total_size() == 8
    assert_all_free(kv)


def test_grow_evicts_the_least_recent_prefix_and_takes_nothing_when_pages_lack():
    kv = make_manager(pages=6)
    for first in (100, 200):  # two cached prompts of two pages each; 100's is older
        old = make_req("old", ids(first, 8))
        admit(kv, old)
        feed(kv, old, 8)
        kv.release(old)
    assert kv.cache.evictable_size() == 16 and kv.pool.available() == 2
    req = make_req("new", ids(500, 12))
    assert admit(kv, req)
    feed(kv, req, 12)  # 3 pages: the older prompt is evicted for the third
    assert kv.match(ids(100, 8)).slots.numel() == 0
    assert kv.match(ids(200, 8)).slots.numel() == 8
    assert kv.cache.evictable_size() == 8 and kv.pool.available() == 1
    assert_pages_accounted(kv, [req])
    holder = make_req("holder", ids(200, 9))  # locks the other cached prompt
    assert admit(kv, holder) and holder.kv.tree_len == 8
    assert kv.grow(req, 8) is None  # 2 pages needed: 1 free, nothing evictable
    assert req.kv.length == 12 and len(req.kv.pages) == 3 and kv.pool.available() == 1
    assert_pages_accounted(kv, [req, holder])
    kv.release(holder)
    kv.release(req)
    assert_all_free(kv)


def test_attach_refuses_without_pages_and_takes_nothing():
    kv = make_manager(pages=4)
    running = make_req("running", ids(100, 8))
    admit(kv, running)
    feed(kv, running, 8)
    # 8 tokens need 2 pages: 2 are free, but 1 reserved page of headroom leaves too few.
    req = make_req("req", ids(500, 8))
    locked = kv.cache.protected_size()
    assert not admit(kv, req, reserve_pages=1)
    assert req.kv.row is None and kv.cache.protected_size() == locked
    assert kv.pool.rows_available() == 3
    assert admit(kv, req, reserve_pages=0)
    kv.release(running)
    kv.release(req)
    assert_all_free(kv)


def test_free_covers_counts_free_pages_only():
    kv = make_manager(pages=3)
    cached = make_req("cached", ids(100, 4))
    admit(kv, cached)
    feed(kv, cached, 4)
    kv.release(cached)  # one page cached and evictable, two free
    req = make_req("req", ids(500, 3))
    admit(kv, req)
    feed(kv, req, 3)
    assert kv.free_covers(req, 1)  # the partial page has room
    assert kv.free_covers(req, 5)  # its page's last slot and one new page
    assert not kv.free_covers(req, 10)  # would need eviction
    kv.release(req)
    assert_all_free(kv)


def test_pins_lock_a_prefix_until_unpinned_within_their_budget():
    kv = make_manager(pages=8)
    assert kv.pool.capacity_tokens * MAX_PINNED_FRACTION == 16
    system = ids(100, 12)
    warm = make_req("warm", system)
    admit(kv, warm)
    feed(kv, warm, 12)
    kv.release(warm)
    assert kv.pin("p", system) == 12 and kv.pinned_tokens == 12
    assert kv.pin("p", system) == 0  # already pinned
    assert kv.cache.evictable_size() == 0 and kv.cache.protected_size() == 12
    assert kv.pin("q", system) == 0  # 24 pinned tokens would pass the budget
    assert kv.pin("none", ids(900, 8)) == 0  # nothing cached
    assert kv.cache.evict(100) == 0
    kv.unpin("p")
    kv.unpin("p")  # unknown ids are ignored
    assert kv.pinned_tokens == 0 and kv.cache.evictable_size() == 12
    assert kv.pin("p", system) == 12
    kv.flush()  # drops pins too
    assert kv.pins == {} and kv.pinned_tokens == 0
    assert kv.pool.available() == kv.pool.capacity_pages


def test_flush_refuses_while_a_request_holds_kv():
    kv = make_manager()
    req = make_req("a", ids(100, 9))
    admit(kv, req)
    feed(kv, req, 9)
    with pytest.raises(RuntimeError):
        kv.flush()
    kv.release(req)
    assert_all_free(kv)


def test_disabled_cache_shares_nothing_and_frees_everything():
    kv = make_manager(disable=True)
    a = make_req("a", ids(100, 9))
    admit(kv, a)
    feed(kv, a, 9)
    assert a.kv.tree_len == 0 and kv.cache.total_size() == 0
    b = make_req("b", ids(100, 9))
    admit(kv, b)
    assert b.kv.length == 0 and b.cached_tokens == 0
    assert kv.pin("p", ids(100, 8)) == 0
    kv.release(a)
    kv.release(b)
    assert kv.pool.available() == kv.pool.capacity_pages
